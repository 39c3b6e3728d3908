#!/usr/bin/env bash
# The benchmark: starts `idemsaga dev` (release build) on its own ports and folder, then
#   1. baseline: N guarded charges straight to the payment participant (one commit each),
#   2. orders:   N orders with unique keys through the orchestrator (the whole saga),
# both at concurrency C, and reports orders/s, p50/p99, the ratio of order latency to the
# baseline's (machines here are shared and noisy: compare ratios, not absolute numbers),
# commits per order per database from pg_stat_database deltas, and the stack's peak RSS.
#   bench/run.sh [N] [C]        (defaults: 2000 orders, concurrency 16)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2000}
C=${2:-16}
bash scripts/install-deps.sh python3 procps  # the report's arithmetic; ps for the RSS
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1  # as in scripts/dev
cmake --preset release >/dev/null
cmake --build --preset release --target idemsaga loadgen >/dev/null
BIN=build/release
WORK=$(mktemp -d /tmp/idemsaga-bench-XXXXXX)
PG_PORT=55432; O_PORT=18080; I_PORT=18081; P_PORT=18082

"$BIN/cmd/idemsaga/idemsaga" dev --dir "$WORK" --pg-port $PG_PORT --orchestrator-port $O_PORT \
  --inventory-port $I_PORT --payment-port $P_PORT >"$WORK/dev.log" 2>"$WORK/dev.err" &
DEV=$!
cleanup() {
  kill -TERM $DEV 2>/dev/null || true
  wait $DEV 2>/dev/null || true
  # As root the cluster lives under /var/lib/idemsaga when `postgres` cannot enter $WORK
  # (mktemp makes it 0700); `idemsaga dev` says where.
  local pg_dir
  pg_dir=$(sed -n 's|^starting PostgreSQL in \(/var/lib/idemsaga/[0-9a-f]*\)$|\1|p' "$WORK/dev.log" 2>/dev/null) || true
  [ -z "$pg_dir" ] || rm -rf "$pg_dir"
  rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 1 120); do grep -q "dev ready" "$WORK/dev.log" && break; sleep 0.5; done
grep -q "dev ready" "$WORK/dev.log" || { cat "$WORK/dev.log" "$WORK/dev.err"; exit 1; }

PSQL=(psql -X -A -t -q "postgresql://postgres@127.0.0.1:$PG_PORT/postgres")
commits() {  # xact_commit of the three databases, once idle backends have flushed them
  sleep 11  # PostgreSQL 15 backends flush statistics at most every 10 s when idle
  "${PSQL[@]}" -c "SELECT string_agg(datname || '=' || xact_commit, ' ' ORDER BY datname)
                   FROM pg_stat_database WHERE datname LIKE 'idemsaga_%'"
}
get() { echo "$1" | tr ' ' '\n' | grep "^idemsaga_$2=" | cut -d= -f2; }

# Warm-up: connections, the tenant cache, the stock row.
"$BIN/bench/loadgen" --url http://127.0.0.1:$O_PORT --api-key dev-key-demo -n 200 -c "$C" --prefix warm >/dev/null

BASE=$("$BIN/bench/loadgen" --url http://127.0.0.1:$P_PORT --path /v1/charges \
  --service-token dev-service-token -n "$N" -c "$C" --prefix base-$$)
BEFORE=$(commits)
ORDERS=$("$BIN/bench/loadgen" --url http://127.0.0.1:$O_PORT --api-key dev-key-demo -n "$N" \
  -c "$C" --prefix order-$$)
AFTER=$(commits)
RSS_KB=$(ps -o rss= -p $DEV | tr -d ' ')

python3 - "$BASE" "$ORDERS" "$BEFORE" "$AFTER" "$N" "$RSS_KB" <<'PY'
import json, sys
base, orders = json.loads(sys.argv[1]), json.loads(sys.argv[2])
before = dict(kv.split("=") for kv in sys.argv[3].split())
after = dict(kv.split("=") for kv in sys.argv[4].split())
n = int(sys.argv[5])
per_db = {db.replace("idemsaga_", ""): (int(after[db]) - int(before[db])) / n for db in after}
print(f"baseline  guarded charge   : {base['per_second']:8.0f}/s  p50 {base['p50_ms']:6.2f} ms  p99 {base['p99_ms']:6.2f} ms")
print(f"orders    whole saga       : {orders['per_second']:8.0f}/s  p50 {orders['p50_ms']:6.2f} ms  p99 {orders['p99_ms']:6.2f} ms  statuses {orders['statuses']}")
print(f"ratio     order/baseline   : p50 x{orders['p50_ms']/base['p50_ms']:.2f}  throughput x{orders['per_second']/base['per_second']:.2f}")
print("commits per order          : " + "  ".join(f"{k} {v:.2f}" for k, v in sorted(per_db.items()))
      + f"  total {sum(per_db.values()):.2f}")
print(f"stack RSS after the run    : {int(sys.argv[6]) / 1024:.0f} MiB (orchestrator, participants; PostgreSQL not included)")
PY
