#!/usr/bin/env bash
# Starts or stops the DBOS peer of bench/run.sh: the order service (service.mjs, DBOS Transact
# 5.3.0 from bench/peers/node_modules, on Node 22) on a port of its own, its system tables in
# the PostgreSQL database DBOS_SYSTEM_DATABASE_URL names (DBOS creates and migrates it; it
# commits as that cluster does: synchronous_commit on, durable), its log under DIR. `stop`
# ends every PID that `start` wrote to DIR/pids, and nothing else.
#
#   DBOS_SYSTEM_DATABASE_URL=postgresql://... bench/peers/dbos/peer.sh start DIR
#                                                         prints the service URL when ready
#   bench/peers/dbos/peer.sh stop DIR
#   env: DBOS_PORT (default 18094), DBOS_POOL_SIZE (20); PEER_INVENTORY_URL PEER_PAYMENT_URL
#        PEER_SERVICE_TOKEN PEER_TENANT (bench/peers/participants.mjs)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS=$(dirname "$HERE")
CMD=${1:?usage: peer.sh start|stop DIR} DIR=${2:?usage: peer.sh start|stop DIR}
PORT=${DBOS_PORT:-18094}
# shellcheck source=bench/peers/lib.sh
source "$PEERS/lib.sh"

peer_begin "$CMD" "$DIR"

: "${DBOS_SYSTEM_DATABASE_URL:?peer.sh: set DBOS_SYSTEM_DATABASE_URL}"
PEER_PORT=$PORT "$NODE" "$HERE/service.mjs" >"$DIR/service.log" 2>&1 9>&- &
echo $! >>"$DIR/pids"
wait_for "the DBOS service" 120 grep -q "dbos peer ready" "$DIR/service.log" ||
  fail "$DIR" service.log
echo "http://127.0.0.1:$PORT"
