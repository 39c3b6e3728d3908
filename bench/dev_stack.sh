# Sourced by the single-stack benches (outage.sh, latency.sh, waiting.sh): starts `idemsaga
# dev` (BINARY, default the release build) on the ports PG_PORT O_PORT I_PORT P_PORT S_PORT
# (the caller's defaults apply when unset) in a folder of its own, waits until it is ready, and
# stops it and removes the folder on exit. Sets ROOT, BIN, LOADGEN, WORK, DEV_PID and O (the
# orchestrator's URL). The caller has `cd`'d to the checkout and set its port defaults.
# watch_cpu starts bench/cpuwatch.py on the stack (into $WORK/cpuwatch.txt); other_cpu T0 T1
# prints the share (%) of the machine's CPU that other processes took between two
# `date +%s.%N` times (a compile beside the run); since T0 prints the seconds since T0.
#   source bench/dev_stack.sh "${1:-}" name
ROOT=$PWD
BIN=${1:-$ROOT/build/release/cmd/idemsaga/idemsaga}
LOADGEN=${LOADGEN:-$ROOT/build/release/bench/loadgen}
[[ -x $LOADGEN ]] || LOADGEN=$ROOT/build/test/bench/loadgen
WORK=$(mktemp -d "/tmp/idemsaga-$2.XXXXXX")
DEV_PID=
cleanup() {
  if [[ -n $DEV_PID ]] && kill -0 "$DEV_PID" 2>/dev/null; then
    kill -INT "$DEV_PID"
    wait "$DEV_PID" || true
  fi
  # As root the cluster lives under /var/lib/idemsaga when `postgres` cannot enter $WORK
  # (mktemp makes it 0700); `idemsaga dev` says where, and keeps it for the next run.
  local pg_dir
  pg_dir=$(sed -n 's|^starting PostgreSQL in \(/var/lib/idemsaga/[0-9a-f]*\)$|\1|p' "$WORK/log" 2>/dev/null) || true
  [[ -z $pg_dir ]] || rm -rf "$pg_dir"
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" dev --dir "$WORK/data" --pg-port "$PG_PORT" --orchestrator-port "$O_PORT" \
  --inventory-port "$I_PORT" --payment-port "$P_PORT" --shipping-port "$S_PORT" >"$WORK/log" 2>&1 &
DEV_PID=$!
for _ in $(seq 180); do
  grep -q "dev ready" "$WORK/log" && break
  sleep 1
done
grep -q "dev ready" "$WORK/log" || { cat "$WORK/log"; exit 1; }
O=http://127.0.0.1:$O_PORT
# An orchestrator of the bench's own, started in the background with its log in
# $WORK/orch.log: stopped (SIGINT) before the stack on exit; waits until it is ready.
#   some_orchestrator ... >"$WORK/orch.log" 2>&1 & adopt_orchestrator $!
adopt_orchestrator() {
  ORCH_PID=$1
  trap 'kill -INT $ORCH_PID 2>/dev/null; wait $ORCH_PID || true; cleanup' EXIT
  for _ in $(seq 60); do
    grep -qs "ready on" "$WORK/orch.log" && return
    sleep 0.5
  done
  cat "$WORK/orch.log"
  exit 1
}
watch_cpu() {
  local pm
  pm=$(sed -n 's/^starting PostgreSQL in //p' "$WORK/log" | head -1)/postmaster.pid
  [[ -f $pm ]] || pm=$(find "$WORK" -name postmaster.pid | head -1)
  : >"$WORK/cpuwatch.txt"
  python3 "$ROOT/bench/cpuwatch.py" $$ "$pm" "$WORK/cpuwatch.txt" 9>&- &
}
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
other_cpu() {
  sleep 1.1  # cpuwatch's sample of the last second
  awk -v a="$1" -v b="$2" -v cores="$(nproc)" '$1 > a && $1 <= b + 1 {s += $2; n++}
    END {printf "%.0f", n ? 100 * s / n / cores : 0}' "$WORK/cpuwatch.txt"
}
