#!/usr/bin/env bash
# Runs dynalite (tests/dynalite: an implementation of DynamoDB's API, in memory) with its pinned
# npm packages, installed once into build/tools/dynalite (tests/dynalite/install.cjs, from the
# lock file; again whenever the lock file changes), for the DynamoDB key store's tests and
# bench. The packages are npm's tarballs kept in tests/dynalite/vendor, each checked against
# the lock's sha512 (the registry's), so installing them needs no network; the optional native
# leveldown is left out (dynalite then keeps its tables in memory). Node.js comes from Debian
# when the machine lacks it. Arguments go to dynalite (--port N); `--install` only installs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/build/tools/dynalite"
if ! command -v node >/dev/null; then
  bash "$root/scripts/install-deps.sh" nodejs >&2
fi
if ! cmp -s "$root/tests/dynalite/package-lock.json" "$dir/installed.lock"; then
  rm -rf "$dir"
  mkdir -p "$dir"
  node "$root/tests/dynalite/install.cjs" "$root/tests/dynalite" "$dir" >&2
  cp "$root/tests/dynalite/package-lock.json" "$dir/installed.lock"
fi
[ "${1:-}" = "--install" ] && exit 0
# exec: the caller's PID is dynalite's, so that it is stopped by that PID.
exec node "$dir/node_modules/dynalite/cli.js" "$@"
