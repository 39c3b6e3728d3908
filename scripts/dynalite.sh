#!/usr/bin/env bash
# Runs dynalite (tests/dynalite: an implementation of DynamoDB's API, in memory) with its pinned
# npm packages, installed once into build/tools/dynalite (npm ci from the lock file; again
# whenever the lock file changes), for the DynamoDB key store's tests and bench. The packages
# are npm's tarballs kept in tests/dynalite/vendor (their sha512 in the lock is the registry's),
# so installing them needs no network; the optional native leveldown is left out (dynalite
# then keeps its tables in memory). Node.js and npm come from Debian when the machine lacks
# them. Arguments go to dynalite (--port N); `--install` only installs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/build/tools/dynalite"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  bash "$root/scripts/install-deps.sh" nodejs npm >&2
fi
if ! cmp -s "$root/tests/dynalite/package-lock.json" "$dir/installed.lock"; then
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -r "$root/tests/dynalite/package.json" "$root/tests/dynalite/package-lock.json" \
    "$root/tests/dynalite/vendor" "$dir/"
  (cd "$dir" && npm ci --offline --omit=optional --cache "$dir/.npm-cache" --no-audit --no-fund \
    --loglevel=error >&2)
  cp "$dir/package-lock.json" "$dir/installed.lock"
fi
[ "${1:-}" = "--install" ] && exit 0
# exec: the caller's PID is dynalite's, so that it is stopped by that PID.
exec node "$dir/node_modules/dynalite/cli.js" "$@"
