#!/usr/bin/env bash
# Starts or stops the Restate peer of bench/run.sh: a restate-server (1.7.12, from
# bench/peers/node_modules, default configuration: its log and state fsync'd, durable) and the
# `orders` service (service.mjs, on Node 22) on ports of their own, with every file under DIR.
# `start` registers the service's deployment with the server's admin API and waits until the
# ingress serves it; `stop` ends every PID that `start` wrote to DIR/pids, and nothing else.
#
#   bench/peers/restate/peer.sh start DIR    prints the ingress URL when ready
#   bench/peers/restate/peer.sh stop DIR
#   env: RESTATE_INGRESS_PORT RESTATE_ADMIN_PORT RESTATE_FABRIC_PORT RESTATE_SERVICE_PORT
#        (defaults 18090 18091 18092 18093); PEER_INVENTORY_URL PEER_PAYMENT_URL
#        PEER_SERVICE_TOKEN PEER_TENANT (bench/peers/participants.mjs)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS=$(dirname "$HERE")
CMD=${1:?usage: peer.sh start|stop DIR} DIR=${2:?usage: peer.sh start|stop DIR}
INGRESS=${RESTATE_INGRESS_PORT:-18090} ADMIN=${RESTATE_ADMIN_PORT:-18091}
FABRIC=${RESTATE_FABRIC_PORT:-18092} SERVICE=${RESTATE_SERVICE_PORT:-18093}
# shellcheck source=bench/peers/lib.sh
source "$PEERS/lib.sh"

peer_begin "$CMD" "$DIR"

arch=$(uname -m)
case "$arch" in x86_64) arch=x64 ;; aarch64) arch=arm64 ;; esac
# The platform binary itself, not the npm wrapper: the PID we stop is the server's.
SERVER=$PEERS/node_modules/@restatedev/restate-server-linux-$arch/bin/restate-server
RESTATE_INGRESS__BIND_ADDRESS=127.0.0.1:$INGRESS RESTATE_ADMIN__BIND_ADDRESS=127.0.0.1:$ADMIN \
  RESTATE_BIND_ADDRESS=127.0.0.1:$FABRIC RESTATE_ADVERTISED_ADDRESS=http://127.0.0.1:$FABRIC/ \
  RESTATE_DISABLE_TELEMETRY=true RESTATE_LOG_FORMAT=compact \
  "$SERVER" --no-logo --listen-mode tcp --node-name bench --base-dir "$DIR/data" \
  >"$DIR/server.log" 2>&1 9>&- &
echo $! >>"$DIR/pids"
PEER_PORT=$SERVICE "$NODE" "$HERE/service.mjs" >"$DIR/service.log" 2>&1 9>&- &
echo $! >>"$DIR/pids"

wait_for "Restate admin API" 120 curl -sf "http://127.0.0.1:$ADMIN/health" ||
  fail "$DIR" server.log
wait_for "the orders service" 60 grep -q "restate peer ready" "$DIR/service.log" ||
  fail "$DIR" service.log
curl -sf -X POST "http://127.0.0.1:$ADMIN/deployments" -H 'Content-Type: application/json' \
  -d "{\"uri\": \"http://127.0.0.1:$SERVICE\"}" >"$DIR/registration.json" ||
  fail "$DIR" server.log
# The ingress learns of the deployment asynchronously (an unknown service answers 404): ready
# when an order without a key reaches the handler, which refuses it with 400.
wait_for "the ingress to serve orders" 60 sh -c \
  "curl -s -o /dev/null -w '%{http_code}' -X POST http://127.0.0.1:$INGRESS/orders/place \
     -H 'Content-Type: application/json' -d '[]' | grep -q '^400$'" ||
  fail "$DIR" server.log
echo "http://127.0.0.1:$INGRESS"
