#!/usr/bin/env bash
# One participant's outage against the whole orchestrator. Starts `idemsaga dev` (the release
# build, or the binary given) on its own ports and folder, makes the payment participant
# answer 503 + Retry-After to every call, and in one run measures:
#   - 600 orders (unique keys) from 64 connections meeting the outage: statuses, p50, p99;
#   - meanwhile, replays of an order that finished before the outage (4 connections, 15 s):
#     they touch no participant, so they must not notice it;
# then ends the outage and counts the sagas that complete within 60 s (every one must: each
# was parked or queued durably, none refused). Prints one JSON line per measurement.
#
#   bench/outage.sh [BINARY]
#   env: PG_PORT O_PORT I_PORT P_PORT S_PORT (defaults 56432 19080 19081 19082 19083)
set -euo pipefail
cd "$(dirname "$0")/.."
PG_PORT=${PG_PORT:-56432} O_PORT=${O_PORT:-19080} I_PORT=${I_PORT:-19081}
P_PORT=${P_PORT:-19082} S_PORT=${S_PORT:-19083}
source bench/dev_stack.sh "${1:-}" outage
faults() {
  curl -sf -o /dev/null -X PUT -H 'Authorization: Bearer dev-service-token' \
    -H 'Content-Type: application/json' -d "$1" "http://127.0.0.1:$P_PORT/admin/faults"
}

"$LOADGEN" --url "$O" --api-key dev-key-demo --same-key done-1 -n 1 -c 1 >/dev/null
faults '{"error_rate":1}'
"$LOADGEN" --url "$O" --api-key dev-key-demo --same-key done-1 -c 4 --duration 15 \
  >"$WORK/replays.json" &
REPLAYS=$!
"$LOADGEN" --url "$O" --api-key dev-key-demo --prefix outage -n 600 -c 64 --accept 202 \
  --accept 503 >"$WORK/orders.json" || true
wait "$REPLAYS" || true
echo "orders during the outage: $(cat "$WORK/orders.json")"
echo "replays during the outage: $(cat "$WORK/replays.json")"

faults '{"error_rate":0}'
DB=$(grep -o "postgresql://[^ ]*idemsaga_orchestrator" "$WORK/log" | head -1)
completed=0
for _ in $(seq 60); do
  completed=$(psql -XAtq "$DB" -c \
    "SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE 'outage-%' AND status = 'completed'")
  [[ $completed -ge 600 ]] && break
  sleep 1
done
echo "{\"completed_within_60s_after_recovery\":$completed,\"of\":600}"
