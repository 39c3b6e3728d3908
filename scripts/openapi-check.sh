#!/usr/bin/env bash
# Runs tests/openapi/check.mjs (the OpenAPI validator and conformance check) with its pinned
# npm packages, installed once into build/tools/openapi (npm ci from the lock file; again
# whenever the lock file changes). The packages are npm's tarballs kept in tests/openapi/vendor
# (their sha512 in the lock is the registry's), so installing them needs no network: a machine
# behind a proxy that rewrites TLS installs them as well as CI does. Node.js and npm come from
# Debian when the machine lacks them. Arguments go to check.mjs; `--install` only installs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/build/tools/openapi"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  bash "$root/scripts/install-deps.sh" nodejs npm >&2
fi
if ! cmp -s "$root/tests/openapi/package-lock.json" "$dir/installed.lock"; then
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -r "$root/tests/openapi/package.json" "$root/tests/openapi/package-lock.json" \
    "$root/tests/openapi/vendor" "$dir/"
  (cd "$dir" && npm ci --offline --cache "$dir/.npm-cache" --no-audit --no-fund --loglevel=error >&2)
  cp "$dir/package-lock.json" "$dir/installed.lock"
fi
cp "$root/tests/openapi/check.mjs" "$dir/check.mjs"
[ "${1:-}" = "--install" ] && exit 0
exec node "$dir/check.mjs" "$@"
