#!/usr/bin/env bash
# Latency of one order at a time: the order saga at 1 connection, so every figure is one
# saga's own path (claim, the steps, completion) with nothing queued before it. Starts
# `idemsaga dev` (the release build, or the binary given) on its own ports and folder, warms
# up with 200 orders, then sends 2,000 orders (unique keys) from 1 connection and prints
# loadgen's JSON line (p50_ms, p99_ms, statuses); then the same for place_order_parallel (the
# stock and the charge side by side) when the binary serves it. Give two binaries to compare,
# one after the other on the same machine: `bench/latency.sh OLD_BINARY; bench/latency.sh`.
#
#   bench/latency.sh [BINARY]
#   env: PG_PORT O_PORT I_PORT P_PORT S_PORT (defaults 57432 20080 20081 20082 20083), N (2000)
set -euo pipefail
cd "$(dirname "$0")/.."
PG_PORT=${PG_PORT:-57432} O_PORT=${O_PORT:-20080} I_PORT=${I_PORT:-20081}
P_PORT=${P_PORT:-20082} S_PORT=${S_PORT:-20083} N=${N:-2000}
source bench/dev_stack.sh "${1:-}" latency
# The second instrument: the orchestrator's own histogram of one saga's run (claim to
# answer, without the client's HTTP), as "saga mean_ms p50_le_ms" from its /metrics.
server_side() {
  curl -fsS "$O/metrics" | python3 -c '
import sys, re
saga = sys.argv[1]
rows = [l for l in sys.stdin if l.startswith("idemsaga_saga_duration_seconds") and
        "saga=\"%s\"" % saga in l and "end=\"completed\"" in l]
val = lambda suffix: [float(l.split()[-1]) for l in rows if l.startswith("idemsaga_saga_duration_seconds" + suffix)]
total, count = sum(val("_sum")), sum(val("_count"))
buckets = sorted((float(re.search(r"le=\"([^\"]+)\"", l).group(1)), float(l.split()[-1]))
                 for l in rows if "_bucket" in l and "+Inf" not in l)
p50 = next((le for le, c in buckets if c >= count / 2), float("nan"))
print("server_side saga=%s runs=%d mean_ms=%.3f p50_le_ms=%g" % (saga, count, 1000 * total / max(count, 1), 1000 * p50))
' "$1"
}
"$LOADGEN" --url "$O" --api-key dev-key-demo --prefix warm -n 200 -c 1 >/dev/null
"$LOADGEN" --url "$O" --api-key dev-key-demo --prefix c1 -n "$N" -c 1
server_side place_order
if curl -fsS -H 'Authorization: Bearer dev-key-demo' "$O/v1/runs" | grep -q place_order_parallel; then
  P=/v1/runs/place_order_parallel
  "$LOADGEN" --url "$O" --path "$P" --api-key dev-key-demo --prefix pwarm -n 200 -c 1 >/dev/null
  "$LOADGEN" --url "$O" --path "$P" --api-key dev-key-demo --prefix p1 -n "$N" -c 1
  server_side place_order_parallel
fi
