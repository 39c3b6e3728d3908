# shellcheck shell=bash
# The peers' phases of bench/run.sh, sourced by it: the same order saga (reserve, charge,
# release the stock when the charge is refused) on Restate and on DBOS Transact, against the
# dev stack's own inventory and payment participants, driven by the same loadgen with unique
# keys at 16 and 64 connections, so the summary sets idemsaga's orders/s and p50/p99 beside
# theirs. Each peer runs under a tenant of its own (bench-restate, bench-dbos); after its
# phases a few orders with a declined card go through it too, and one key 20 times, and its
# effects in the participants' databases are counted against its answers (peers_report.py
# effects).
#
# Uses run.sh's ROOT WORK RES URL I_PORT P_PORT ORDER_S ATTEMPT and its functions lg show phase
# timed checkpoint quiesce put. PEERS (the peers to run, "restate dbos" by default; set by
# --no-peers, --no-restate, --no-dbos or BENCH_PEERS) is settled by peers_install.

PEERS_DIR=$ROOT/bench/peers
# loadgen's order body (bench/loadgen.cpp MakeBody) with the card that is always declined.
DECLINED_BODY='{"customer_id":"cust_1","items":[{"sku":"widget","quantity":1}],"amount_cents":2500,"currency":"USD","payment_method":"pm_card_declined"}'

# Before the benchmark's lock (it reaches the npm registry): a peer that cannot be installed
# (no network) is left out of the run, which goes on without it.
peers_install() {
  [ -n "$PEERS" ] || return 0
  if ! command -v npm >/dev/null; then
    echo "run.sh: no npm on this machine (Node.js); the peers are skipped" >&2
    PEERS=
  elif ! "$PEERS_DIR/install.sh"; then
    echo "run.sh: could not install bench/peers from the npm registry; the peers are skipped" >&2
    PEERS=
  fi
}

# The peer NAME started in $WORK/peer-NAME: sets PEER_URL, PEER_PATH and PEER_ARGS.
peer_start() {
  local name=$1 dir=$WORK/peer-$1
  export PEER_INVENTORY_URL=http://127.0.0.1:$I_PORT PEER_PAYMENT_URL=http://127.0.0.1:$P_PORT
  export PEER_SERVICE_TOKEN=dev-service-token PEER_TENANT=bench-$name
  case "$name" in
    restate)
      PEER_PATH=/orders/place PEER_ARGS=(--key-header X-Order-Key)
      ;;
    dbos)
      # Its system tables in a database of its own on the bench's cluster.
      export DBOS_SYSTEM_DATABASE_URL=$URL/bench_dbos
      PEER_PATH=/orders PEER_ARGS=()
      ;;
  esac
  PEER_URL=$("$PEERS_DIR/$name/peer.sh" start "$dir" 9>&-)
}

# Stops every peer started in this run (also from run.sh's cleanup).
peers_stop() {
  local dir
  for dir in "$WORK"/peer-*; do
    [ -f "$dir/pids" ] && "$PEERS_DIR/${dir##*/peer-}/peer.sh" stop "$dir"
  done
  return 0
}

# loadgen against the peer's ingress; its answers are tallied for the effects check.
peer_lg() {
  local name=$1
  shift
  lg "$name" --url "$PEER_URL" --path "$PEER_PATH" "${PEER_ARGS[@]}" "$@"
  python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["statuses"]))' \
    "$RES/$name.json" >>"$RES/peer_${PEER}_tally.jsonl"
}

peer_orders() { # PEER C: a phase function
  ATTEMPT=$((ATTEMPT + 1))
  checkpoint
  timed "$PEER$C" peer_lg "$PEER$C" --duration "$ORDER_S" -c "$C" --prefix "$PEER$C-$$-$ATTEMPT"
}

# Counts the peer's effects in the participants' databases, by its tenant.
peer_effects() {
  local psql=(psql -X -A -t -q -v ON_ERROR_STOP=1 -v "tenant=$PEER_TENANT")
  "${psql[@]}" "$URL/idemsaga_inventory" <<<"
    SELECT 'reserved=' || count(*) FILTER (WHERE status = 'reserved')
        || ' released=' || count(*) FILTER (WHERE status = 'released')
    FROM reservations WHERE tenant_id = :'tenant'" >"$RES/peer_${PEER}_effects.txt"
  "${psql[@]}" "$URL/idemsaga_payment" <<<"
    SELECT 'captured=' || count(*) FILTER (WHERE status = 'captured')
        || ' charges=' || count(*)
    FROM charges WHERE tenant_id = :'tenant'" >>"$RES/peer_${PEER}_effects.txt"
}

run_peer() {
  PEER=$1
  if ! peer_start "$PEER"; then
    echo "run.sh: the $PEER peer did not start; skipped" >&2
    return 0
  fi
  printf '%-9s ready at %s (tenant %s)\n' "$PEER" "$PEER_URL" "$PEER_TENANT"
  peer_lg "warm_$PEER" -n 300 -c 16 --prefix "warm-$PEER-$$"
  for C in 16 64; do
    phase "$PEER$C" peer_orders
    show "$PEER$C" "$(printf '%-9s c=%s' "$PEER" "$C")"
  done
  peer_lg "declined_$PEER" -n 20 -c 4 --prefix "dec-$PEER-$$" --body "$DECLINED_BODY" \
    --accept 402
  # One key sent 20 times, 4 at once: one order, whatever the peer answers each of them.
  lg "same_key_$PEER" --url "$PEER_URL" --path "$PEER_PATH" "${PEER_ARGS[@]}" -n 20 -c 4 \
    --same-key "same-$PEER-$$"
  quiesce
  peer_effects
  "$PEERS_DIR/$PEER/peer.sh" stop "$WORK/peer-$PEER"
  python3 "$PEERS_DIR/peers_report.py" effects "$RES" "$PEER"
  put "peer_$PEER" 1
}
