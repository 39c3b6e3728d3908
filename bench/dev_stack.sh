# Sourced by the single-stack benches (outage.sh, latency.sh, waiting.sh): starts `idemsaga
# dev` (BINARY, default the release build) on the ports PG_PORT O_PORT I_PORT P_PORT S_PORT
# (the caller's defaults apply when unset) in a folder of its own, waits until it is ready, and
# stops it and removes the folder on exit. Sets ROOT, BIN, LOADGEN, WORK, DEV_PID and O (the
# orchestrator's URL). The caller has `cd`'d to the checkout and set its port defaults.
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
