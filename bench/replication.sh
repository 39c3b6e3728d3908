#!/usr/bin/env bash
# What replication costs an order (docs/scaling.md): orders/s, p50 and p99, and per order the
# write commits, WAL flushes and WAL bytes of the primary, on
#   single   `idemsaga dev`'s own PostgreSQL (one server, no replica, no HAProxy);
#   async    `scripts/ha --db-only` (Patroni, a primary and two streaming replicas, HAProxy in
#            front) with Patroni's synchronous_mode off: a commit waits for the local WAL flush;
#   sync     the same cluster with synchronous_mode on: a commit also waits for the
#            synchronous standby to flush it (synchronous_commit = on).
# The same stack (`idemsaga dev --pg-url` for the cluster) and load (bench/loadgen, unique keys,
# C connections, S seconds a round) for each. The cluster's two modes alternate for R rounds
# each (sync, async, sync, async, ...) so that a busier moment of the machine does not land on
# one mode only; each row is the median of its rounds. fsync on everywhere. Each round starts
# right after a CHECKPOINT, so its WAL bytes include the full-page images of the first change
# of every page after a checkpoint (counted beside them): the heavy end of a checkpoint cycle.
#
#   bench/replication.sh [C] [S] [R]      defaults: 16 connections, 10 s, 2 rounds
#   env: BASE_PORT (the cluster's, as scripts/ha --base-port; 7600), PG_PORT (single; 55452),
#        O_PORT (the single stack's orchestrator, 18100; the cluster's is O_PORT + 10)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
C=${1:-16} S=${2:-10} R=${3:-2}
BASE_PORT=${BASE_PORT:-7600} PG_PORT=${PG_PORT:-55452} O_PORT=${O_PORT:-18100}

bash scripts/install-deps.sh python3 patroni etcd-server etcd-client haproxy
LOCK=/tmp/idemsaga-bench.lock # the benchmarks on this machine never overlap
exec 9>>"$LOCK"
flock 9
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
cmake --preset release >/dev/null
cmake --build --preset release --target idemsaga loadgen >/dev/null
BIN=$ROOT/build/release/cmd/idemsaga/idemsaga
LOADGEN=$ROOT/build/release/bench/loadgen
WORK=$(mktemp -d /tmp/idemsaga-replication-XXXXXX)
chmod 755 "$WORK" # scripts/ha's servers run as `postgres` when this runs as root
PIDS=()
stop_pid() { kill -TERM "$1" 2>/dev/null && wait "$1" 2>/dev/null || true; }
cleanup() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[i]}"; done
  local pg_dir
  for log in "$WORK"/*/dev.log; do
    pg_dir=$(sed -n 's|^starting PostgreSQL in \(/var/lib/idemsaga/[0-9a-f]*\)$|\1|p' "$log" 2>/dev/null) || true
    [ -z "$pg_dir" ] || rm -rf "$pg_dir"
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_line() { # wait_line FILE TEXT SECONDS
  for _ in $(seq 1 $(($3 * 2))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.5; done
  echo "replication.sh: no '$2' in $1 after $3 s:" >&2
  tail -n 30 "$1" >&2
  exit 1
}
# start_dev NAME ORCHESTRATOR_PORT ARGS...: `idemsaga dev` in $WORK/NAME, waited for.
start_dev() {
  local name=$1 port=$2
  shift 2
  mkdir -p "$WORK/$name"
  "$BIN" dev --dir "$WORK/$name" --orchestrator-port "$port" --inventory-port $((port + 1)) \
    --payment-port $((port + 2)) --shipping-port $((port + 3)) "$@" \
    >"$WORK/$name/dev.log" 2>&1 9>&- &
  PIDS+=($!)
  wait_line "$WORK/$name/dev.log" "dev ready" 180
}

PSQL=(psql -X -A -t -q -v ON_ERROR_STOP=1)
# measure NAME URL ORCHESTRATOR_PORT: one round of load; prints a JSON line of its figures.
measure() {
  local name=$1 url=$2 port=$3
  local now="SELECT pg_snapshot_xmax(pg_current_snapshot()), pg_current_wal_lsn()"
  # PostgreSQL 15 backends publish pg_stat_wal at most once a second while busy and 10 s
  # after going idle: the flush counts are read after 11 s of quiet on both sides.
  local syncs="SELECT wal_sync || ' ' || wal_fpi FROM pg_stat_wal"
  "${PSQL[@]}" "$url" -c "CHECKPOINT"
  sleep 11
  local before after sync0 sync1
  sync0=$("${PSQL[@]}" "$url" -c "$syncs")
  before=$("${PSQL[@]}" -F ' ' "$url" -c "$now")
  "$LOADGEN" --url "http://127.0.0.1:$port" --api-key dev-key-demo --duration "$S" -c "$C" \
    --prefix "$name-$RANDOM-$$" >"$WORK/lg.json" 2>/dev/null 9>&- || true
  after=$("${PSQL[@]}" -F ' ' "$url" -c "$now")
  sleep 11
  sync1=$("${PSQL[@]}" "$url" -c "$syncs")
  python3 - "$name" "$WORK/lg.json" "$before $sync0" "$after $sync1" <<'EOF'
import json, sys
name, path, before, after = sys.argv[1:5]
run = json.loads(open(path).read().strip().splitlines()[-1])
b, a = before.split(), after.split()
orders = sum(c for s, c in run["statuses"].items() if s == "201")
other = sum(c for s, c in run["statuses"].items() if s != "201")
def lsn(x):
    hi, lo = x.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)
print(json.dumps({"mode": name, "orders_s": run["per_second"], "p50": run["p50_ms"],
                  "p99": run["p99_ms"], "not_201": other, "orders": orders,
                  "commits": (int(a[0]) - int(b[0])) / max(orders, 1),
                  "flushes": (int(a[2]) - int(b[2])) / max(orders, 1),
                  "fpi": (int(a[3]) - int(b[3])) / max(orders, 1),
                  "wal_bytes": (lsn(a[1]) - lsn(b[1])) / max(orders, 1)}))
EOF
}

# The cluster, then its stack through HAProxy (port BASE_PORT + 30).
"$ROOT/scripts/ha" --db-only --dir "$WORK/ha" --base-port "$BASE_PORT" --binary "$BIN" \
  >"$WORK/ha.log" 2>&1 9>&- &
PIDS+=($!)
wait_line "$WORK/ha.log" "ha ready" 240
HA_URL=postgresql://postgres@127.0.0.1:$((BASE_PORT + 30))
start_dev cluster $((O_PORT + 10)) --pg-url "$HA_URL/postgres"
start_dev single "$O_PORT" --pg-port "$PG_PORT"
SINGLE_URL=postgresql://postgres@127.0.0.1:$PG_PORT/postgres

# Patroni's dynamic configuration, through any member's REST API; then waits until the
# primary's synchronous_standby_names says so (Patroni sets it within a loop or two).
set_sync() { # on|off
  local want=$1 value=false
  [ "$want" = on ] && value=true
  curl -fsS -XPATCH -d "{\"synchronous_mode\": $value}" \
    "http://127.0.0.1:$((BASE_PORT + 20))/config" >/dev/null
  local names
  for _ in $(seq 1 120); do
    names=$("${PSQL[@]}" "$HA_URL/postgres" -c "SHOW synchronous_standby_names" 2>/dev/null) || true
    if { [ "$want" = on ] && [ -n "$names" ]; } || { [ "$want" = off ] && [ -z "$names" ]; }; then
      return 0
    fi
    sleep 0.5
  done
  echo "replication.sh: synchronous_mode $want not in effect after 60 s" >&2
  exit 1
}

for port in "$O_PORT" $((O_PORT + 10)); do # warm both stacks
  "$LOADGEN" --url "http://127.0.0.1:$port" --api-key dev-key-demo -n 500 -c "$C" \
    --prefix "warm-$port-$$" >/dev/null 2>&1 9>&- || true
done
: >"$WORK/rows.jsonl"
measure single "$SINGLE_URL" "$O_PORT" >>"$WORK/rows.jsonl"
for _ in $(seq 1 "$R"); do
  set_sync on
  measure sync "$HA_URL/postgres" $((O_PORT + 10)) >>"$WORK/rows.jsonl"
  set_sync off
  measure async "$HA_URL/postgres" $((O_PORT + 10)) >>"$WORK/rows.jsonl"
done
measure single "$SINGLE_URL" "$O_PORT" >>"$WORK/rows.jsonl"

python3 - "$WORK/rows.jsonl" "$C" "$S" "$R" "$(git rev-parse --short HEAD)" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
c, s, r, commit = sys.argv[2:6]
print(f"replication.sh: {c} connections, {s} s a round, {r} rounds a cluster mode, commit {commit}")
print("| mode | orders/s | p50 ms | p99 ms | not 201 | write commits/order | WAL flushes/order | WAL bytes/order | full-page images/order |")
print("|---|---|---|---|---|---|---|---|---|")
base = None
for mode in ("single", "async", "sync"):
    runs = [x for x in rows if x["mode"] == mode]
    med = lambda k: statistics.median(x[k] for x in runs)
    ops = med("orders_s")
    base = base or ops
    print(f"| {mode} | {ops:,.0f} (x{ops / base:.2f}) | {med('p50'):.1f} | {med('p99'):.1f} "
          f"| {sum(x['not_201'] for x in runs)} | {med('commits'):.2f} | {med('flushes'):.2f} "
          f"| {med('wal_bytes'):,.0f} | {med('fpi'):.2f} |")
print("rounds:", " ".join(f"{x['mode']}={x['orders_s']:.0f}" for x in rows))
EOF
