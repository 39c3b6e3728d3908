#!/usr/bin/env bash
# Orders/s with 1, 2 and 3 orchestrator replicas on one PostgreSQL (docs/scaling.md). Starts
# `idemsaga dev` (release build) on its own ports and folder, then for R = 1, 2, 3 runs R-1
# more `idemsaga orchestrator` processes on the same database and participants, and drives
# the same total load (C connections, split evenly) at all R replicas at once with
# bench/loadgen for S seconds. Prints one line per R: orders/s (the sum), p50 and p99 of the
# replicas' own figures, and how many orders did not end 201. Durability as dev sets it.
#
#   bench/replicas.sh [C] [S]      defaults: 48 connections, 10 s per replica count
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
C=${1:-48} S=${2:-10}
PG_PORT=${PG_PORT:-55442} O_PORT=${O_PORT:-18090} I_PORT=${I_PORT:-18091} P_PORT=${P_PORT:-18092}

bash scripts/install-deps.sh python3
LOCK=/tmp/idemsaga-bench.lock # the benchmarks on this machine never overlap
exec 9>>"$LOCK"
flock 9
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
cmake --preset release >/dev/null
cmake --build --preset release --target idemsaga loadgen >/dev/null
BIN=$ROOT/build/release/cmd/idemsaga/idemsaga
LOADGEN=$ROOT/build/release/bench/loadgen
WORK=$(mktemp -d /tmp/idemsaga-replicas-XXXXXX)
PIDS=()
"$BIN" dev --dir "$WORK" --pg-port "$PG_PORT" --orchestrator-port "$O_PORT" \
  --inventory-port "$I_PORT" --payment-port "$P_PORT" >"$WORK/dev.log" 2>"$WORK/dev.err" 9>&- &
DEV=$!
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  kill -TERM $DEV 2>/dev/null || true
  wait $DEV 2>/dev/null || true
  local pg_dir
  pg_dir=$(sed -n 's|^starting PostgreSQL in \(/var/lib/idemsaga/[0-9a-f]*\)$|\1|p' "$WORK/dev.log" 2>/dev/null) || true
  [ -z "$pg_dir" ] || rm -rf "$pg_dir"
  rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 1 240); do grep -q "dev ready" "$WORK/dev.log" && break; sleep 0.5; done
grep -q "dev ready" "$WORK/dev.log" || {
  cat "$WORK/dev.log" "$WORK/dev.err"
  exit 1
}
DB=postgresql://postgres@127.0.0.1:$PG_PORT/idemsaga_orchestrator

start_replica() { # $1: port
  "$BIN" orchestrator --listen "127.0.0.1:$1" --database-url "$DB" \
    --participant "inventory=http://127.0.0.1:$I_PORT" --participant "payment=http://127.0.0.1:$P_PORT" \
    --reconcile-interval-ms 0 >"$WORK/replica-$1.log" 2>&1 9>&- &
  PIDS+=($!)
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$1/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "replicas.sh: replica on $1 did not start" >&2
  cat "$WORK/replica-$1.log" >&2
  exit 1
}

"$LOADGEN" --url "http://127.0.0.1:$O_PORT" --api-key dev-key-demo -n 500 -c 16 \
  --prefix "warm-$$" >/dev/null || true
ports=("$O_PORT")
echo "replicas  orders/s   p50_ms  p99_ms  not_201   (C=$C connections in all, ${S}s each)"
for r in 1 2 3; do
  while ((${#ports[@]} < r)); do
    p=$((O_PORT + 10 + ${#ports[@]}))
    start_replica "$p"
    ports+=("$p")
  done
  per=$((C / r))
  lg=()
  for i in $(seq 0 $((r - 1))); do
    "$LOADGEN" --url "http://127.0.0.1:${ports[$i]}" --api-key dev-key-demo --duration "$S" \
      -c "$per" --prefix "r$r-$i-$$" >"$WORK/lg-$r-$i.json" 2>/dev/null 9>&- &
    lg+=($!)
  done
  for p in "${lg[@]}"; do wait "$p" || true; done
  python3 - "$r" "$WORK"/lg-"$r"-*.json <<'EOF'
import json, sys
r = sys.argv[1]
runs = [json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[2:]]
total = sum(x["per_second"] for x in runs)
not201 = sum(c for x in runs for s, c in x["statuses"].items() if s != "201")
p50 = max(x["p50_ms"] for x in runs)
p99 = max(x["p99_ms"] for x in runs)
print(f"{r:>8}  {total:8.0f}  {p50:7.1f} {p99:7.1f}  {not201:7d}")
EOF
done
