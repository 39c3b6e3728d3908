#!/usr/bin/env bash
# The bulkhead: a slow participant must not slow the sagas that never call it, nor make the
# order API refuse orders. The participants run in `idemsaga dev` (the release build, or the
# binary given); the orchestrator is bench/bench_orchestrator as its own process (the shipped
# sagas plus reserve_stock, a saga that calls only the inventory; its default pools unless
# ORCH_FLAGS says otherwise). Open loop (loadgen --rate: latency from when each request was
# due), in two phases of PHASE_S s each:
#   baseline  payment healthy: reserve_stock at RS_RATE/s and place_order at PO_RATE/s;
#   slow      payment answers every call after 2 s (`latency_ms: 2000`), the same offered load;
# then payment recovers and the script waits until every order of the slow phase has ended.
# Prints one JSON line per measurement: loadgen's (statuses, p50/p99), the orchestrator's own
# histogram of reserve_stock runs (the second instrument), the share of the CPU that other
# processes took, and the orders' states in the orchestrator's database.
#
#   bench/bulkhead.sh [BINARY]
#   env: PHASE_S (60), PO_RATE (200), RS_RATE (50), ORCH_FLAGS,
#        PG_PORT O_PORT I_PORT P_PORT S_PORT B_PORT (59432 22080 22081 22082 22083 22090)
set -euo pipefail
cd "$(dirname "$0")/.."
PG_PORT=${PG_PORT:-59432} O_PORT=${O_PORT:-22080} I_PORT=${I_PORT:-22081}
P_PORT=${P_PORT:-22082} S_PORT=${S_PORT:-22083} B_PORT=${B_PORT:-22090}
PHASE_S=${PHASE_S:-60} PO_RATE=${PO_RATE:-200} RS_RATE=${RS_RATE:-50} ORCH_FLAGS=${ORCH_FLAGS:-}
source bench/dev_stack.sh "${1:-}" bulkhead
DEV_DB=$(sed -n 's/^ *orchestrator database: //p' "$WORK/log" | head -1)
DB=${DEV_DB/idemsaga_orchestrator/idemsaga_bulkhead}
psql -XAtq "$DEV_DB" -c "CREATE DATABASE idemsaga_bulkhead"
# shellcheck disable=SC2086
"$(dirname "$LOADGEN")/bench_orchestrator" --database-url "$DB" --listen "127.0.0.1:$B_PORT" \
  --participant "inventory=http://127.0.0.1:$I_PORT" --participant "payment=http://127.0.0.1:$P_PORT" \
  --api-key demo=dev-key-demo $ORCH_FLAGS >"$WORK/orch.log" 2>&1 &
adopt_orchestrator $!
B=http://127.0.0.1:$B_PORT
watch_cpu

faults() {
  curl -sf -o /dev/null -X PUT -H 'Authorization: Bearer dev-service-token' \
    -H 'Content-Type: application/json' -d "$1" "http://127.0.0.1:$P_PORT/admin/faults"
}
scrape() { curl -sf "$B/metrics" >"$WORK/metrics-$1.txt"; }
# reserve_stock runs that completed between two scrapes: count and p50/p99 (the upper bound of
# the histogram bucket that holds it), from the orchestrator's idemsaga_saga_duration_seconds.
server_side() {
  python3 - "$WORK/metrics-$1.txt" "$WORK/metrics-$2.txt" <<'PY'
import json, re, sys
def buckets(path):
    out = {}
    for line in open(path):
        m = re.match(r'idemsaga_saga_duration_seconds_bucket\{(.*)\} (\S+)', line)
        if m and 'saga="reserve_stock"' in m[1] and 'end="completed"' in m[1]:
            le = re.search(r'le="([^"]+)"', m[1])[1]
            out[float('inf') if le == '+Inf' else float(le)] = float(m[2])
    return out
a, b = buckets(sys.argv[1]), buckets(sys.argv[2])
d = sorted((le, b[le] - a.get(le, 0)) for le in b)
n = d[-1][1] if d else 0
def q(p):
    return next((le * 1000 for le, c in d if c >= p * n), None)
print(json.dumps({"what": "reserve_stock, server side", "runs": int(n), "p50_ms_at_most": q(0.5),
                  "p99_ms_at_most": q(0.99)}))
PY
}
phase() {  # NAME: both loads at once for PHASE_S s
  local t0
  t0=$(date +%s.%N)
  scrape "$1-start"
  "$LOADGEN" --url "$B" --api-key dev-key-demo --path /v1/runs/reserve_stock \
    --body '{"items":[{"sku":"widget","quantity":1}]}' --prefix "rs-$1" --rate "$RS_RATE" \
    --duration "$PHASE_S" -c 1024 >"$WORK/rs-$1.json" || true &
  local rs=$!
  "$LOADGEN" --url "$B" --api-key dev-key-demo --prefix "po-$1" --rate "$PO_RATE" \
    --duration "$PHASE_S" -c 4096 --accept 202 >"$WORK/po-$1.json" || true
  wait "$rs"
  scrape "$1-end"
  local other
  other=$(other_cpu "$t0" "$(date +%s.%N)")
  sed "s/^{/{\"phase\":\"$1\",\"saga\":\"reserve_stock\",\"other_cpu\":$other,/" "$WORK/rs-$1.json"
  sed "s/^{/{\"phase\":\"$1\",\"saga\":\"place_order\",\"other_cpu\":$other,/" "$WORK/po-$1.json"
  server_side "$1-start" "$1-end" | sed "s/^{/{\"phase\":\"$1\",/"
}
states() {  # the orchestrator's state of the orders of phase $1
  psql -XAtq "$DB" -c "SELECT coalesce(json_object_agg(status, n), '{}') FROM (SELECT status, count(*) n
    FROM idempotency_keys WHERE idempotency_key LIKE 'po-$1-%' GROUP BY status) s"
}

"$LOADGEN" --url "$B" --api-key dev-key-demo --same-key warm -n 1 -c 1 >/dev/null
phase baseline
faults '{"latency_ms":2000}'
phase slow
echo "{\"what\":\"slow orders' states at the end of the slow phase\",\"states\":$(states slow)}"
faults '{}'
recovered=$(date +%s.%N)
for _ in $(seq 600); do
  [[ $(psql -XAtq "$DB" -c "SELECT count(*) FROM idempotency_keys
    WHERE idempotency_key LIKE 'po-slow-%' AND status NOT IN ('completed', 'failed')") -eq 0 ]] && break
  sleep 1
done
echo "{\"what\":\"after recovery\",\"seconds\":$(since "$recovered"),\"states\":$(states slow),\"other_cpu\":$(other_cpu "$recovered" "$(date +%s.%N)")}"
awk '/^Threads:/ {t=$2} /^VmHWM:/ {h=$2} END {printf "{\"what\":\"orchestrator process\",\"threads\":%d,\"peak_rss_mib\":%.1f}\n", t, h/1024}' "/proc/$ORCH_PID/status"
