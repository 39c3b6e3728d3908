#!/usr/bin/env bash
# Waiting costs no thread: N sagas wait at once in one orchestrator, of two kinds: N/2 orders
# paid by a card that needs 3-D Secure, each parked until its `payment_confirmed`, and N/2
# orders whose charge meets a payment participant answering 503 + Retry-After: 30 (a fault
# only on keys `outage-*`: other orders are charged as usual), each parked until its retry.
# The participants run in `idemsaga dev` (the release build, or the binary given); the
# orchestrator measured is, by ORCH:
#   idemsaga  `idemsaga orchestrator` as its own process, on a database of its own (default)
#   bench     bench/bench_orchestrator (its pools as flags: ORCH_FLAGS, e.g. --saga-threads 16)
#   dev       the dev process itself (orchestrator and participants: all four services' pools)
# Measures, in one run:
#   - the orchestrator process's threads and RSS idle, with all N waiting, and at most while
#     they are woken (sampled every 0.5 s);
#   - healthy orders (a card without 3-D Secure; loadgen, c=16, HEALTHY_S s) and replays of
#     one finished order (c=16, HEALTHY_S s) before the waiting sagas and while they wait;
#   - the end of the outage and the confirmations (32 connections), and the time until every
#     one of the N has completed (captured).
# Prints one JSON line per measurement, with the share of the CPU other processes took.
#
#   bench/waiting.sh [BINARY]
#   env: N (10000), HEALTHY_S (10), ORCH (idemsaga), ORCH_FLAGS,
#        PG_PORT O_PORT I_PORT P_PORT S_PORT W_PORT (58432 21080 21081 21082 21083 21090)
set -euo pipefail
cd "$(dirname "$0")/.."
PG_PORT=${PG_PORT:-58432} O_PORT=${O_PORT:-21080} I_PORT=${I_PORT:-21081}
P_PORT=${P_PORT:-21082} S_PORT=${S_PORT:-21083} W_PORT=${W_PORT:-21090} N=${N:-10000}
HEALTHY_S=${HEALTHY_S:-10} ORCH=${ORCH:-idemsaga} ORCH_FLAGS=${ORCH_FLAGS:-}
HALF=$((N / 2))
source bench/dev_stack.sh "${1:-}" waiting
DB=$(sed -n 's/^ *orchestrator database: //p' "$WORK/log" | head -1)
PID=$DEV_PID
if [[ $ORCH != dev ]]; then
  # A database of its own in the dev cluster: the dev process's orchestrator stays idle.
  ODB=${DB/idemsaga_orchestrator/idemsaga_waiting}
  psql -XAtq "${DB}" -c "CREATE DATABASE idemsaga_waiting"
  participants=(--participant "inventory=http://127.0.0.1:$I_PORT"
    --participant "payment=http://127.0.0.1:$P_PORT" --participant "shipping=http://127.0.0.1:$S_PORT")
  if [[ $ORCH == idemsaga ]]; then
    "$BIN" migrate --database-url "$ODB" --kind orchestrator >/dev/null
    # The dev tenant's key, so that the same API key works on both.
    psql -XAtq "$ODB" -c "INSERT INTO tenants (tenant_id, api_key_hash)
      VALUES ('demo', '$(psql -XAtq "$DB" -c "SELECT api_key_hash FROM tenants WHERE tenant_id = 'demo'")')"
    # shellcheck disable=SC2086
    "$BIN" orchestrator --database-url "$ODB" --listen "127.0.0.1:$W_PORT" "${participants[@]}" \
      $ORCH_FLAGS >"$WORK/orch.log" 2>&1 &
  else
    # shellcheck disable=SC2086
    "$(dirname "$LOADGEN")/bench_orchestrator" --database-url "$ODB" --listen "127.0.0.1:$W_PORT" \
      "${participants[@]}" --api-key demo=dev-key-demo $ORCH_FLAGS >"$WORK/orch.log" 2>&1 &
  fi
  adopt_orchestrator $!
  PID=$ORCH_PID
  DB=$ODB
  O=http://127.0.0.1:$W_PORT
fi
watch_cpu
proc() {  # threads and RSS (MiB) of the orchestrator's process now, and its peak RSS
  awk -v what="$1" '/^Threads:/ {t=$2} /^VmRSS:/ {r=$2} /^VmHWM:/ {h=$2}
    END {printf "{\"what\":\"%s\",\"threads\":%d,\"rss_mib\":%.1f,\"peak_rss_mib\":%.1f}\n",
         what, t, r/1024, h/1024}' "/proc/$PID/status"
}
# The most threads it had at any sample, every 0.5 s from here on.
(while [[ -r /proc/$PID/status ]]; do
  awk '/^Threads:/ {print $2}' "/proc/$PID/status"
  sleep 0.5
done) >"$WORK/threads.txt" 2>/dev/null &
healthy() {  # loadgen's orders and replays, HEALTHY_S s each, c=16
  local t0
  t0=$(date +%s.%N)
  "$LOADGEN" --url "$O" --api-key dev-key-demo --prefix "healthy-$1" --duration "$HEALTHY_S" \
    -c 16 | sed "s/^{/{\"phase\":\"orders $1\",\"other_cpu\":$(other_cpu "$t0" "$(date +%s.%N)"),/"
  t0=$(date +%s.%N)
  "$LOADGEN" --url "$O" --api-key dev-key-demo --same-key done-1 --duration "$HEALTHY_S" -c 16 |
    sed "s/^{/{\"phase\":\"replays $1\",\"other_cpu\":$(other_cpu "$t0" "$(date +%s.%N)"),/"
}
count() {  # sagas of keys PREFIX-* in state WHERE
  psql -X -A -t -q "$DB" -c "SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE '$1-%' AND $2"
}
faults() {
  curl -sf -o /dev/null -X PUT -H 'Authorization: Bearer dev-service-token' \
    -H 'Content-Type: application/json' -d "$1" "http://127.0.0.1:$P_PORT/admin/faults"
}

"$LOADGEN" --url "$O" --api-key dev-key-demo --same-key done-1 -n 1 -c 1 >/dev/null
proc idle
healthy before
python3 bench/waiting.py orders "$O" "$HALF" 32 wait
faults '{"error_rate":1,"retry_after_s":30,"key_prefix":"outage-"}'
"$LOADGEN" --url "$O" --api-key dev-key-demo --prefix outage -n "$HALF" -c 32 --accept 202 |
  sed 's/^{/{"what":"outage orders",/' || true
echo "{\"what\":\"parked\",\"waiting_3ds\":$(count wait "status = 'started' AND waiting_for IS NOT NULL"),\"waiting_outage\":$(count outage "status = 'started' AND waiting_for IS NOT NULL")}"
proc "$N waiting"
healthy while_waiting
proc "$N waiting, after the healthy load"
started=$(date +%s.%N)
faults '{}'
python3 bench/waiting.py confirm "$O" "$HALF" 32 wait
for _ in $(seq 240); do
  [[ $(count wait "status = 'completed'") -ge $HALF && $(count outage "status = 'completed'") -ge $HALF ]] && break
  sleep 0.5
done
echo "{\"what\":\"all completed\",\"completed_3ds\":$(count wait "status = 'completed'"),\"completed_outage\":$(count outage "status = 'completed'"),\"of_each\":$HALF,\"seconds_from_recovery\":$(since "$started"),\"other_cpu\":$(other_cpu "$started" "$(date +%s.%N)")}"
proc "after"
echo "{\"what\":\"most threads seen\",\"threads\":$(sort -n "$WORK/threads.txt" | tail -1)}"
