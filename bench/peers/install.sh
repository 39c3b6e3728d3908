#!/usr/bin/env bash
# Installs the benchmark's peers (package.json, pinned exactly in package-lock.json) into
# bench/peers/node_modules from the npm registry: DBOS Transact, the Restate server and SDK, and
# Node 22 for the Restate SDK. Run by bench/run.sh unless the peers are skipped; never by
# scripts/test or CI. Does nothing when node_modules already matches the lock file.
# Exit status non-zero when the registry cannot be reached (bench/run.sh then skips the peers).
set -euo pipefail
cd "$(dirname "$0")"
stamp=node_modules/.idemsaga-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
[ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && exit 0
# The Restate server's package pings an install counter (scarf) unless told not to.
SCARF_ANALYTICS=false npm ci --no-audit --no-fund --loglevel=error
echo "$want" >"$stamp"
