#!/usr/bin/env bash
# Latency of one order at a time: the order saga at 1 connection, so every figure is one
# saga's own path (claim, the steps, completion) with nothing queued before it. Starts
# `idemsaga dev` (the release build, or the binary given) on its own ports and folder, warms
# up with 200 orders, then sends 2,000 orders (unique keys) from 1 connection and prints
# loadgen's JSON line (p50_ms, p99_ms, statuses). Give two binaries to compare, one after the
# other on the same machine: `bench/latency.sh OLD_BINARY; bench/latency.sh`.
#
#   bench/latency.sh [BINARY]
#   env: PG_PORT O_PORT I_PORT P_PORT S_PORT (defaults 57432 20080 20081 20082 20083), N (2000)
set -euo pipefail
cd "$(dirname "$0")/.."
PG_PORT=${PG_PORT:-57432} O_PORT=${O_PORT:-20080} I_PORT=${I_PORT:-20081}
P_PORT=${P_PORT:-20082} S_PORT=${S_PORT:-20083} N=${N:-2000}
source bench/dev_stack.sh "${1:-}" latency
"$LOADGEN" --url "$O" --api-key dev-key-demo --prefix warm -n 200 -c 1 >/dev/null
"$LOADGEN" --url "$O" --api-key dev-key-demo --prefix c1 -n "$N" -c 1
