#!/usr/bin/env bash
# Waiting costs no thread: 10,000 orders paid by a card that needs 3-D Secure park at once,
# each waiting for its confirmation, in one `idemsaga dev` (the release build, or the binary
# given: orchestrator and participants in one process). Measures, in one run:
#   - the process's threads and RSS before, and while all of them wait;
#   - healthy orders (a card without 3-D Secure; loadgen, c=16, 10 s) and replays of one
#     finished order (c=16, 10 s) before the waiting sagas and while they wait: the ratio;
#   - the confirmations of all of them (32 connections) and the time until every one has
#     completed (captured), with the threads and RSS at the peak.
# Prints one JSON line per measurement.
#
#   bench/waiting.sh [BINARY]
#   env: N (10000), PG_PORT O_PORT I_PORT P_PORT S_PORT (defaults 58432 21080 21081 21082 21083)
set -euo pipefail
cd "$(dirname "$0")/.."
PG_PORT=${PG_PORT:-58432} O_PORT=${O_PORT:-21080} I_PORT=${I_PORT:-21081}
P_PORT=${P_PORT:-21082} S_PORT=${S_PORT:-21083} N=${N:-10000}
source bench/dev_stack.sh "${1:-}" waiting
DB=$(sed -n 's/^ *orchestrator database: //p' "$WORK/log" | head -1)
proc() {  # threads and RSS (MiB) of the dev process now, and its peak RSS
  awk -v what="$1" '/^Threads:/ {t=$2} /^VmRSS:/ {r=$2} /^VmHWM:/ {h=$2}
    END {printf "{\"what\":\"%s\",\"threads\":%d,\"rss_mib\":%.1f,\"peak_rss_mib\":%.1f}\n",
         what, t, r/1024, h/1024}' "/proc/$DEV_PID/status"
}
healthy() {  # loadgen's orders and replays, 10 s each, c=16
  "$LOADGEN" --url "$O" --api-key dev-key-demo --prefix "healthy-$1" --duration 10 -c 16 |
    sed "s/^{/{\"phase\":\"orders $1\",/"
  "$LOADGEN" --url "$O" --api-key dev-key-demo --same-key done-1 --duration 10 -c 16 |
    sed "s/^{/{\"phase\":\"replays $1\",/"
}
completed() { psql -X -A -t -q "$DB" -c "SELECT count(*) FROM idempotency_keys WHERE status = 'completed' AND idempotency_key LIKE 'wait-%'"; }

"$LOADGEN" --url "$O" --api-key dev-key-demo --same-key done-1 -n 1 -c 1 >/dev/null
proc idle
healthy before
python3 bench/waiting.py orders "$O" "$N" 32 wait
waiting=$(psql -X -A -t -q "$DB" -c "SELECT count(*) FROM idempotency_keys WHERE status = 'started' AND waiting_for IS NOT NULL")
echo "{\"what\":\"parked\",\"waiting\":$waiting}"
proc "$N waiting"
healthy while_waiting
proc "$N waiting, after the healthy load"
started=$(date +%s.%N)
python3 bench/waiting.py confirm "$O" "$N" 32 wait
for _ in $(seq 600); do
  [[ $(completed) -ge $N ]] && break
  sleep 0.5
done
echo "{\"what\":\"all completed\",\"completed\":$(completed),\"seconds_from_first_confirmation\":$(echo "$(date +%s.%N) - $started" | bc)}"
proc "after"
