#!/usr/bin/env bash
# The benchmark. Starts `idemsaga dev` (release build) on its own ports and folder and, in one
# run on that stack's PostgreSQL cluster (fsync and synchronous_commit as dev sets them):
#   1. the pgbench bound: a participant-shaped transaction (INSERT a key row + UPDATE it) at 16
#      and 64 clients; an order makes 4 such commits, so bound = TPS / 4 orders/s; measured
#      right before and right after the orders phase at as many connections, and averaged;
#   2. the instrument check: guarded charges straight to the payment participant at 16
#      connections, loadgen vs wrk (they must agree within 10%);
#   3. orders (unique keys) at 1, 16 and 64 connections: orders/s, p50, p99, statuses, that
#      every order ended `completed`, and the CPU (every process: PostgreSQL, the stack, the
#      clients) and context switches per order;
#   4. write commits per order during the 16-connection phase: cluster-wide write transactions
#      (xid delta), per database from the WAL, and pg_stat_database xact_commit deltas; WAL
#      flushes (pg_stat_wal) and WAL bytes per order beside them;
#   5. replays of one key at 16 connections vs pgbench -S (primary-key select) at 16 clients;
#      and the inventory's guard on each store, wrk at 16 connections: reservations with unique
#      keys (claims) and of one key (replays), on the dev stack's PostgreSQL inventory and on
#      `idemsaga inventory --store redis` over a private redis-server (appendonly yes,
#      appendfsync everysec; claims once more under appendfsync always), and on a second
#      PostgreSQL inventory over the same database with --duplicates fail-fast; and
#      bench/stores.sh: a participant built only from the library (one external effect that
#      only answers) with its keys in PostgreSQL, Redis and DynamoDB's API on dynalite, claims
#      and replays at 16 connections each;
#   6. memory (the dev process: orchestrator and participants): peak RSS at 64 connections, an
#      overload at 1,024 connections (every request answered: 2xx or 503 + Retry-After), a
#      flood of 60 KiB malformed bodies, and RSS after it once idle;
#   7. the peers (bench/peers/, installed from the npm registry): the same order saga on
#      Restate and on DBOS Transact against the same participants, at 16 and 64 connections,
#      and a count of their effects at the participants;
#   8. cost as the work grows: GROWTH_KEYS (10 million; --quick 200,000) finished keys more in
#      the orchestrator's table and in each participant's, then orders at 16 connections again,
#      between two more pgbench bounds (the ratio also read against the machine's speed then);
#   9. garbage collection under load: the keys that twice that order rate makes expire in a
#      minute, expired, in each table; orders at 16 connections for 65 s (every collector
#      passes) while the backlogs are sampled;
# then prints a summary of targets (PASS/FAIL) and appends one row to bench/RESULTS.md (and
# one to its peers' table).
#
#   bench/run.sh [--quick] [--no-peers | --no-restate | --no-dbos]
#       --quick: short phases, for smoke tests (figures are rough)
#       --no-peers: no Restate or DBOS phase (no network needed); also BENCH_PEERS=""
#   env: PG_PORT O_PORT I_PORT P_PORT (defaults 55432 18080 18081 18082), WRK_THREADS (1),
#        R_PORT RI_PORT (Redis and the inventory on it; defaults 16379 18083),
#        FF_PORT (a second PostgreSQL inventory with --duplicates fail-fast; 18084),
#        SR_PORT SD_PORT SM_PORT (bench/stores.sh's Redis, dynalite and mailers; 16380 18100 18101),
#        BENCH_PEERS ("restate dbos"), the peers' ports (bench/peers/*/peer.sh; 18090-18094),
#        GROWTH_KEYS (keys added per table in phase 8; it needs ~3.2 GB free per million)
#
# Exit status: 0 when the run completed, whatever the targets say (it is a measurement);
# non-zero only when the run itself broke. The measured part runs under
# `flock /tmp/idemsaga-bench.lock`: benchmarks on this machine never overlap.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

QUICK=0
PEERS=${BENCH_PEERS-restate dbos}
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --no-peers) PEERS= ;;
    --no-restate) PEERS=${PEERS//restate/} ;;
    --no-dbos) PEERS=${PEERS//dbos/} ;;
    -h | --help)
      sed -n '2,50p' "$0"
      exit 0
      ;;
    *)
      echo "run.sh: unknown argument $arg (bench/run.sh --help)" >&2
      exit 2
      ;;
  esac
done
if ((QUICK)); then
  PGB_S=3 CHECK_S=1 ORDER_S=4 REPLAY_S=3 OVERLOAD_S=4 FLOOD_N=1500 INV_S=3
  GROWTH_KEYS=${GROWTH_KEYS:-200000}
else
  PGB_S=10 CHECK_S=3 ORDER_S=10 REPLAY_S=10 OVERLOAD_S=10 FLOOD_N=6000 INV_S=10
  GROWTH_KEYS=${GROWTH_KEYS:-10000000}
fi
GC_S=65 # the services collect expired keys once a minute
R_PORT=${R_PORT:-16379} RI_PORT=${RI_PORT:-18083} FF_PORT=${FF_PORT:-18084}
PG_PORT=${PG_PORT:-55432} O_PORT=${O_PORT:-18080} I_PORT=${I_PORT:-18081} P_PORT=${P_PORT:-18082}
WRK_THREADS=${WRK_THREADS:-1}
OVERLOAD_C=1024 FLOOD_C=512 FLOOD_BYTES=61440

# the report's arithmetic; ps; the check; the inventory's Redis store (redis-cli comes with it)
bash scripts/install-deps.sh python3 procps wrk redis-server
source bench/peers/phases.sh
peers_install

# Everything from here on is measured or heats the CPU (the build, initdb): one benchmark at a
# time on this machine. The lock is held until this script exits; the dev stack is started
# without the descriptor, so nothing it leaves behind can hold the lock.
LOCK=/tmp/idemsaga-bench.lock
exec 9>>"$LOCK"
if ! flock -n 9; then
  echo "run.sh: waiting for $LOCK (another benchmark is running)..."
  flock 9
fi

export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1 # as in scripts/dev
cmake --preset release >/dev/null
cmake --build --preset release --target idemsaga loadgen bench_mailer >/dev/null
BIN=$ROOT/build/release
LOADGEN=$BIN/bench/loadgen
WORK=$(mktemp -d /tmp/idemsaga-bench-XXXXXX)
RES=$WORK/results
mkdir -p "$RES"
VALUES=$RES/values.env # key=value lines for the report
: >"$VALUES"
put() { echo "$1=$2" >>"$VALUES"; }
# Phase boundaries (NAME_start, NAME_end): the time, and the machine's busy CPU ticks and context
# switches then (/proc/stat), for the CPU and context switches per order of a phase.
mark() {
  put "t_$1" "$(date +%s.%N)"
  put "proc_$1" "$(awk '$1 == "cpu" {b = $2 + $3 + $4 + $7 + $8 + $9} $1 == "ctxt" {c = $2}
    END {print b ":" c}' /proc/stat)"
}
# Before a phase: waits (up to 2 min) for 3 s in which other processes took < 5% of the CPU, so
# a compile or someone's test that is running now does not land in the figures. The report
# still says how much other CPU each phase saw.
wait_quiet() {
  local start seen
  start=$(date +%s)
  while :; do
    seen=$(wc -l <"$RES/cpuwatch.txt")
    sleep 3.2
    if tail -n +"$((seen + 1))" "$RES/cpuwatch.txt" |
      awk -v cores="$(nproc)" '{s += $2} END {exit !(NR >= 3 && s / NR / cores < 0.05)}'; then
      return 0
    fi
    if (($(date +%s) - start > 120)); then
      echo "run.sh: the machine is busy (other processes > 5% CPU); measuring anyway" >&2
      return 0
    fi
  done
}

"$BIN/cmd/idemsaga/idemsaga" dev --dir "$WORK" --pg-port "$PG_PORT" --orchestrator-port "$O_PORT" \
  --inventory-port "$I_PORT" --payment-port "$P_PORT" >"$WORK/dev.log" 2>"$WORK/dev.err" 9>&- &
DEV=$!
PSQL=(psql -X -A -t -q -v ON_ERROR_STOP=1)
URL=postgresql://postgres@127.0.0.1:$PG_PORT
cleanup() {
  local rc=$?
  [ -z "${WATCH:-}" ] || kill $WATCH 2>/dev/null || true
  [ -z "${INVR:-}" ] || { kill -TERM $INVR 2>/dev/null && wait $INVR 2>/dev/null; } || true
  [ -z "${INVFF:-}" ] || { kill -TERM $INVFF 2>/dev/null && wait $INVFF 2>/dev/null; } || true
  [ -z "${REDIS:-}" ] || { kill -TERM $REDIS 2>/dev/null && wait $REDIS 2>/dev/null; } || true
  peers_stop
  local db
  for db in bench_pgbench bench_dbos; do
    "${PSQL[@]}" "$URL/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 ||
      true
  done
  kill -TERM $DEV 2>/dev/null || true
  wait $DEV 2>/dev/null || true
  # As root the cluster lives under /var/lib/idemsaga when `postgres` cannot enter $WORK
  # (mktemp makes it 0700); `idemsaga dev` says where.
  local pg_dir
  pg_dir=$(sed -n 's|^starting PostgreSQL in \(/var/lib/idemsaga/[0-9a-f]*\)$|\1|p' "$WORK/dev.log" 2>/dev/null) || true
  if [ -n "$pg_dir" ]; then
    # Its server may still be writing its shutdown checkpoint (minutes after a growth phase):
    # removed under it, the folder's space would stay taken until it ends.
    for _ in $(seq 1 120); do
      pgrep -f "postgres -D $pg_dir/data" >/dev/null || break
      sleep 1
    done
    rm -rf "$pg_dir"
  fi
  if ((rc != 0)); then
    echo "run.sh: the run broke (exit $rc); dev stack's stderr:" >&2
    tail -n 20 "$WORK/dev.err" >&2 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 1 120); do grep -q "dev ready" "$WORK/dev.log" && break; sleep 0.5; done
grep -q "dev ready" "$WORK/dev.log" || {
  cat "$WORK/dev.log" "$WORK/dev.err"
  exit 1
}
# CPU that other processes take during each phase (a shared machine): see bench/cpuwatch.py.
PG_DIR=$(sed -n 's|^starting PostgreSQL in \(.*\)$|\1|p' "$WORK/dev.log")
: >"$RES/cpuwatch.txt"
CPUWATCH_SERVER_PID=$DEV python3 "$ROOT/bench/cpuwatch.py" $$ "$PG_DIR/data/postmaster.pid" "$RES/cpuwatch.txt" \
  "$WORK"/peer-{restate,dbos}/pids 9>&- &
WATCH=$!

sql() { "${PSQL[@]}" "$URL/${2:-postgres}" -c "$1"; }
xmax() { sql "SELECT pg_snapshot_xmax(pg_current_snapshot())"; } # consumes no xid
# Waits until no write transaction has started for 1.5 s: the span exporters (every 500 ms per
# service) have delivered and the intake has stored everything of the phase before.
quiesce() {
  local last now stable=0
  last=$(xmax)
  for _ in $(seq 1 60); do
    sleep 0.5
    now=$(xmax)
    if [ "$now" = "$last" ]; then
      stable=$((stable + 1))
      ((stable < 3)) || return 0
    else
      stable=0 last=$now
    fi
  done
  echo "run.sh: the cluster did not go quiet within 30 s (write transactions keep coming)" >&2
}
# xact_commit of the stack's databases. PostgreSQL 15 backends publish their counters at the
# end of a transaction at most once a second, and otherwise 10 s after going idle; nothing
# outside a backend can make it publish sooner, so this reads them after 11 s of quiet.
stat_commits() {
  sleep 11
  sql "SELECT string_agg(datname || '=' || xact_commit, ' ' ORDER BY datname)
              || (SELECT ' wal_sync=' || wal_sync || ' wal_write=' || wal_write FROM pg_stat_wal)
       FROM pg_stat_database WHERE datname LIKE 'idemsaga_%'"
}
orders_rows() { sql "SELECT count(*) FROM idempotency_keys" idemsaga_orchestrator; }
rss() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$DEV/status"; } # kB
reset_peak() { echo 5 >"/proc/$DEV/clear_refs"; }
checkpoint() { sql "CHECKPOINT"; } # every phase starts from the same state of the WAL
# loadgen's JSON line into $RES/$1.json; its exit status says only whether targets were met.
lg() {
  local name=$1
  shift
  "$LOADGEN" "$@" >"$RES/$name.json" || true
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$RES/$name.json" 2>/dev/null || {
    echo "run.sh: loadgen produced no result for $name" >&2
    exit 1
  }
}
show() { python3 "$ROOT/bench/report.py" show "$RES/$1.json" "$2"; }
pgb_tps() { sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$1"; }
ORDER_ARGS=(--url "http://127.0.0.1:$O_PORT" --api-key dev-key-demo)
CHARGE_ARGS=(--url "http://127.0.0.1:$P_PORT" --path /v1/charges --service-token dev-service-token)
# What loadgen sends to /v1/charges (bench/loadgen.cpp), for wrk to send the same.
CHARGE_BODY='{"amount_cents":2500,"currency":"USD","customer_id":"cust_1","payment_method":"pm_card_visa"}'

mark run_start
echo "== idemsaga bench $( ((QUICK)) && echo '(quick)') $(date -u +%FT%TZ) on $(nproc) cores; PostgreSQL on :$PG_PORT"
put quick "$QUICK"

# 1. The pgbench bound, in a scratch database on the same cluster.
sql "CREATE DATABASE bench_pgbench" >/dev/null
pgbench -i -q -s 10 "$URL/bench_pgbench" >"$RES/pgbench_init.txt" 2>&1
sql "CREATE TABLE bench_keys (
       tenant_id text NOT NULL, idempotency_key text NOT NULL, request_hash text,
       status text NOT NULL, response_status integer, response_content_type text,
       response_body text, created_at timestamptz NOT NULL DEFAULT now(),
       expires_at timestamptz NOT NULL DEFAULT now() + interval '7 days',
       PRIMARY KEY (tenant_id, idempotency_key));
     CREATE INDEX ON bench_keys (expires_at)" bench_pgbench
# A participant's guarded action, reduced to its writes: claim the key, store the answer.
cat >"$WORK/participant.sql" <<'SQL'
\set r random(1, 9000000000000000000)
BEGIN;
INSERT INTO bench_keys (tenant_id, idempotency_key, request_hash, status)
  VALUES ('bench', 'k-' || :client_id || '-' || :r, 'a6f1d0c39b5e7a2f4c8d1e0b9a7c6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a', 'started');
UPDATE bench_keys SET status = 'completed', response_status = 201,
  response_content_type = 'application/json',
  response_body = '{"charge_id":"ch_0123456789abcdef","status":"captured","amount_cents":2500}'
  WHERE tenant_id = 'bench' AND idempotency_key = 'k-' || :client_id || '-' || :r;
END;
SQL
# Runs phase function $2 (which marks phase $1 around what it measures) up to 3 times: again
# when other processes took more than 5% of the CPU during it (a compile, someone's test). The
# report shows the other CPU of the attempt kept.
phase() {
  local name=$1 fn=$2 attempt share
  for attempt in 1 2 3; do
    "$fn"
    sleep 1.1 # cpuwatch's sample of the phase's last second
    share=$(python3 "$ROOT/bench/report.py" other-cpu "$RES" "$name")
    put "attempts_$name" "$attempt"
    python3 -c "import sys; sys.exit(float(sys.argv[1]) <= 5)" "$share" || return 0
    ((attempt == 3)) || echo "run.sh: other processes took ${share}% of the CPU during $name; again"
  done
}
# wait_quiet, then `mark NAME_start`, the command, `mark NAME_end`.
timed() {
  local name=$1
  shift
  wait_quiet
  mark "${name}_start"
  "$@"
  mark "${name}_end"
}

# The bound at C clients is measured right before and right after the orders phase at C
# connections, and averaged: this machine's speed drifts by up to 15% within minutes (the same
# binary took 1,243 to 1,712 us of CPU per order in runs a minute apart), and a ratio of two
# figures taken minutes apart would carry that drift. PHASE: pgbench_w16, pgbench_w16_after, ...
pgbench_write() {
  checkpoint
  timed "$PHASE" pgbench -n -M prepared -c "$C" -j 2 -T "$PGB_S" -f "$WORK/participant.sql" \
    "$URL/bench_pgbench" >"$RES/$PHASE.txt" 2>&1
}
bound() { # C before|after [SUFFIX: another pair's, e.g. g beside the grown tables' orders]
  local s=${3:-}
  C=$1 PHASE=pgbench_w$1$s
  [ "$2" = after ] && PHASE=pgbench_w$1${s}_after
  phase "$PHASE" pgbench_write
  local tps
  tps=$(pgb_tps "$RES/$PHASE.txt")
  [ -n "$tps" ] || {
    cat "$RES/$PHASE.txt"
    exit 1
  }
  put "${PHASE}_tps" "$tps"
  printf 'pgbench   participant txn  c=%-4s %-6s: %8.0f tps  -> bound %6.0f orders/s\n' "$C" \
    "$2${s:+ ($s)}" \
    "$tps" "$(python3 -c "print($tps/4)")"
  if [ "$2" = after ]; then
    tps=$(python3 -c "import sys; print((float(sys.argv[1]) + float(sys.argv[2])) / 2)" \
      "$(grep "^pgbench_w$1${s}_before_tps=" "$VALUES" | tail -1 | cut -d= -f2)" "$tps")
    put "pgbench_w$1${s}_tps" "$tps"
  else
    put "pgbench_w$1${s}_before_tps" "$tps"
  fi
}

# Warm-up: connections, the tenant cache, the stock row, the participant's pool.
lg warm_orders "${ORDER_ARGS[@]}" -n 300 -c 16 --prefix warm-$$
lg warm_charges "${CHARGE_ARGS[@]}" -n 300 -c 16 --prefix warm-$$

# The scratch tables, and the catalogs of template1 and postgres (never analysed since initdb),
# as autovacuum would leave them: now, not as write transactions in the order window.
for db in bench_pgbench template1 postgres; do sql "VACUUM ANALYZE" $db; done

# 2. The instrument check: 8 segments of CHECK_S s, loadgen and wrk in the order L W W L L W W L
# (a drift of the server's rate over the check weighs the same on both).
run_wrk() { # its CPU time (user sys real) too, as loadgen reports its own
  local TIMEFORMAT='wrk-time %U %S %R'
  { time wrk -t"$WRK_THREADS" -c16 -d"${CHECK_S}s" -s "$ROOT/bench/wrk_guarded.lua" \
    "http://127.0.0.1:$P_PORT" -- "wrk$1-$$-$ATTEMPT" unique /v1/charges "$CHARGE_BODY" \
    >"$RES/wrk$1.txt" 2>&1; } 2>>"$RES/wrk$1.txt"
  grep -q '^wrk-json ' "$RES/wrk$1.txt" || {
    cat "$RES/wrk$1.txt"
    exit 1
  }
}
check_segments() {
  local i
  for i in 1 2; do
    lg check_lg$((2 * i - 1)) "${CHARGE_ARGS[@]}" --duration "$CHECK_S" -c 16 \
      --prefix "chk$i-a-$$-$ATTEMPT"
    run_wrk $((2 * i - 1))
    run_wrk $((2 * i))
    lg check_lg$((2 * i)) "${CHARGE_ARGS[@]}" --duration "$CHECK_S" -c 16 \
      --prefix "chk$i-b-$$-$ATTEMPT"
  done
}
ATTEMPT=0
check() {
  ATTEMPT=$((ATTEMPT + 1))
  checkpoint
  timed check check_segments
}
phase check check
python3 "$ROOT/bench/report.py" check "$RES"

# 3+4. Orders at 16 connections, with the write transactions they cost.
orders16() {
  ATTEMPT=$((ATTEMPT + 1))
  quiesce
  checkpoint
  sql "SELECT 1 FROM pg_create_physical_replication_slot('idemsaga_bench', true)" >/dev/null
  commits_before=$(stat_commits) # also waits out the flush of the phases before
  wait_quiet
  x0=$(xmax) rows0=$(orders_rows) lsn0=$(sql "SELECT pg_current_wal_flush_lsn()")
  put rss16_before_kb "$(rss VmRSS)"
  reset_peak
  mark orders16_start
  lg orders16 "${ORDER_ARGS[@]}" --duration "$ORDER_S" -c 16 --prefix "o16-$$-$ATTEMPT"
  mark orders16_end
  put rss16_peak_kb "$(rss VmHWM)"
  quiesce
  x1=$(xmax) rows1=$(orders_rows) lsn1=$(sql "SELECT pg_current_wal_flush_lsn()")
  # Per database, from the WAL of the window: each write transaction's database is that of
  # the pages it wrote; "spans" are the orchestrator's transactions that stored span batches
  # alone (not in a saga's finish, which carries them where there is one: span_rides.hpp).
  # trace_spans since V003 (a view named spans remains); spans before it.
  spans_rel=$(sql "SELECT coalesce(pg_relation_filenode(to_regclass('trace_spans')), pg_relation_filenode('spans'))" idemsaga_orchestrator)
  keys_rel=$(sql "SELECT pg_relation_filenode('idempotency_keys')" idemsaga_orchestrator)
  orch_oid=$(sql "SELECT oid FROM pg_database WHERE datname = 'idemsaga_orchestrator'")
  sql "CREATE EXTENSION IF NOT EXISTS pg_walinspect" bench_pgbench
  sed -i '/^wal_/d' "$VALUES" # an earlier attempt's
  sql "WITH r AS (
         SELECT xid, resource_manager AS rm, record_type AS rt,
                substring(block_ref FROM 'rel [0-9]+/([0-9]+)/')::oid AS db,
                substring(block_ref FROM 'rel [0-9]+/[0-9]+/([0-9]+)')::oid AS rel,
                record_length AS len
         FROM pg_get_wal_records_info('$lsn0', '$lsn1') WHERE xid <> 0),
       x AS (
         SELECT xid, bool_or(rm = 'Transaction' AND rt LIKE 'COMMIT%') AS committed,
                bool_or(rm = 'Transaction' AND rt LIKE 'ABORT%') AS aborted, max(db) AS db,
                bool_or(db = $orch_oid AND rel = $spans_rel) AS spans,
                bool_or(db = $orch_oid AND rel = $keys_rel) AS keys, sum(len) AS bytes
         FROM r GROUP BY xid)
       SELECT 'wal_' || coalesce(replace(d.datname, 'idemsaga_', ''), 'other') || '_commits='
                || count(*) FILTER (WHERE committed)
              || ' wal_' || coalesce(replace(d.datname, 'idemsaga_', ''), 'other') || '_aborts='
                || count(*) FILTER (WHERE aborted)
              || ' wal_' || coalesce(replace(d.datname, 'idemsaga_', ''), 'other') || '_xids='
                || count(*)
              || ' walbytes_' || coalesce(replace(d.datname, 'idemsaga_', ''), 'other') || '='
                || sum(bytes)
              || CASE WHEN d.datname = 'idemsaga_orchestrator'
                      THEN ' wal_span_commits=' || count(*) FILTER (WHERE committed AND spans AND NOT keys)
                      ELSE '' END
       FROM x LEFT JOIN pg_database d ON d.oid = x.db GROUP BY d.datname" bench_pgbench |
    tr ' ' '\n' >>"$VALUES"
  sql "SELECT pg_drop_replication_slot('idemsaga_bench')" >/dev/null
  commits_after=$(stat_commits)
  put xids "$((x1 - x0))"
  put wal_bytes_window "$(sql "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")"
  put orders_in_window "$((rows1 - rows0))"
  local kv
  for kv in $commits_before; do put "stat_before_${kv%%=*}" "${kv#*=}"; done
  for kv in $commits_after; do put "stat_after_${kv%%=*}" "${kv#*=}"; done
}
# An order phase: ORDER_S s of orders (unique keys) at C connections, from a checkpoint on a
# quiet machine.
order_phase() { # NAME C
  ATTEMPT=$((ATTEMPT + 1))
  checkpoint
  wait_quiet
  mark "$1_start"
  lg "$1" "${ORDER_ARGS[@]}" --duration "$ORDER_S" -c "$2" --prefix "$1-$$-$ATTEMPT"
  mark "$1_end"
}
# Orders one at a time: one saga's own path, nothing queued before it.
orders1() { order_phase orders1 1; }
phase orders1 orders1
show orders1 "orders    c=1"
python3 "$ROOT/bench/report.py" per-order "$RES" orders1
bound 16 before
phase orders16 orders16
show orders16 "orders    c=16"
bound 16 after
python3 "$ROOT/bench/report.py" commits "$RES"
python3 "$ROOT/bench/report.py" per-order "$RES" orders16

# Orders at 64 connections; the peak RSS they cause.
orders64() {
  ATTEMPT=$((ATTEMPT + 1))
  checkpoint
  wait_quiet
  put rss64_before_kb "$(rss VmRSS)"
  reset_peak
  mark orders64_start
  lg orders64 "${ORDER_ARGS[@]}" --duration "$ORDER_S" -c 64 --prefix "o64-$$-$ATTEMPT"
  mark orders64_end
  put rss64_peak_kb "$(rss VmHWM)"
}
bound 64 before
phase orders64 orders64
show orders64 "orders    c=64"
python3 "$ROOT/bench/report.py" per-order "$RES" orders64
bound 64 after
quiesce
sql "SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
     FROM (SELECT status, count(*) AS n FROM idempotency_keys GROUP BY 1) s" \
  idemsaga_orchestrator >"$RES/order_states.txt"
echo "orders    states after c=64 : $(cat "$RES/order_states.txt")"

# 5. Replays of one key vs a primary-key select.
KEY=replay-$$
lg replay_first "${ORDER_ARGS[@]}" -n 1 -c 1 --same-key "$KEY"
replays() {
  checkpoint
  timed replays lg replays "${ORDER_ARGS[@]}" --duration "$REPLAY_S" -c 16 --same-key "$KEY"
}
phase replays replays
show replays "replays   c=16"
select_only() {
  timed select pgbench -n -S -M prepared -c 16 -j 2 -T "$REPLAY_S" "$URL/bench_pgbench" \
    >"$RES/pgbench_s16.txt" 2>&1
}
phase select select_only
tps=$(pgb_tps "$RES/pgbench_s16.txt")
[ -n "$tps" ] || {
  cat "$RES/pgbench_s16.txt"
  exit 1
}
put pgbench_s16_tps "$tps"
printf 'pgbench   select -S  c=16   : %8.0f tps\n' "$tps"

# 5b. The inventory's guard, PostgreSQL vs Redis: claims (unique keys) and replays (one key).
mkdir -p "$WORK/redis"
redis-server --bind 127.0.0.1 --port "$R_PORT" --dir "$WORK/redis" --appendonly yes \
  --appendfsync everysec --save '' --daemonize no --logfile "$WORK/redis/redis.log" 9>&- &
REDIS=$!
for _ in $(seq 1 100); do redis-cli -p "$R_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
"$BIN/cmd/idemsaga/idemsaga" inventory --store redis --redis-url "redis://127.0.0.1:$R_PORT" \
  --listen "127.0.0.1:$RI_PORT" >"$WORK/inv_redis.log" 2>&1 9>&- &
INVR=$!
for _ in $(seq 1 100); do grep -q "ready on" "$WORK/inv_redis.log" && break; sleep 0.1; done
grep -q "ready on" "$WORK/inv_redis.log" || {
  cat "$WORK/inv_redis.log" "$WORK/redis/redis.log"
  exit 1
}
# The same inventory database, served again with the advisory-lock guard.
"$BIN/cmd/idemsaga/idemsaga" inventory --database-url "$URL/idemsaga_inventory" --duplicates fail-fast \
  --listen "127.0.0.1:$FF_PORT" >"$WORK/inv_ff.log" 2>&1 9>&- &
INVFF=$!
for _ in $(seq 1 100); do grep -q "ready on" "$WORK/inv_ff.log" && break; sleep 0.1; done
grep -q "ready on" "$WORK/inv_ff.log" || {
  cat "$WORK/inv_ff.log"
  exit 1
}
inv_wrk() { # NAME PORT unique|same
  wrk -t"$WRK_THREADS" -c16 -d"${INV_S}s" -s "$ROOT/bench/wrk_guarded.lua" \
    "http://127.0.0.1:$2" -- "$1-$$-$ATTEMPT" "$3" /v1/reservations \
    '{"items":[{"sku":"widget","quantity":1}]}' >"$RES/$1.txt" 2>&1
  grep -q '^wrk-json ' "$RES/$1.txt" || {
    cat "$RES/$1.txt"
    exit 1
  }
}
inv_phase() { # NAME PORT MODE
  ATTEMPT=$((ATTEMPT + 1))
  checkpoint
  timed "$1" inv_wrk "$@"
}
inv_pg_claims() { inv_phase inv_pg_claims "$I_PORT" unique; }
inv_pg_replays() { inv_phase inv_pg_replays "$I_PORT" same; }
inv_redis_claims() { inv_phase inv_redis_claims "$RI_PORT" unique; }
inv_redis_replays() { inv_phase inv_redis_replays "$RI_PORT" same; }
inv_redis_always() { inv_phase inv_redis_always "$RI_PORT" unique; }
inv_ff_claims() { inv_phase inv_ff_claims "$FF_PORT" unique; }
inv_ff_replays() { inv_phase inv_ff_replays "$FF_PORT" same; }
for p in inv_pg_claims inv_pg_replays inv_redis_claims inv_redis_replays; do phase $p $p; done
redis-cli -p "$R_PORT" config set appendfsync always >/dev/null
phase inv_redis_always inv_redis_always
for p in inv_ff_claims inv_ff_replays; do phase $p $p; done
python3 "$ROOT/bench/report.py" inventory "$RES"

# 5c. The guard on each key store: the library's participant on PostgreSQL, Redis, dynalite.
sql "CREATE DATABASE bench_mailer"
checkpoint
BIN=$BIN STORES_S=$INV_S WRK_THREADS=$WRK_THREADS bash "$ROOT/bench/stores.sh" \
  "$URL/bench_mailer" "$RES" 9>&-
sql "DROP DATABASE bench_mailer WITH (FORCE)"

# 6. Overload, then a flood of large malformed bodies; RSS of the dev process throughout.
wait_quiet
quiesce
put rss1024_before_kb "$(rss VmRSS)"
reset_peak
mark overload_start
lg overload "${ORDER_ARGS[@]}" --duration "$OVERLOAD_S" -c $OVERLOAD_C --threads 2 \
  --timeout-ms 30000 --accept 503 --prefix ovl-$$
mark overload_end
put rss1024_peak_kb "$(rss VmHWM)"
show overload "overload  c=$OVERLOAD_C"
quiesce
wait_quiet
put rss_before_flood_kb "$(rss VmRSS)"
reset_peak
mark flood_start
lg flood "${ORDER_ARGS[@]}" -n "$FLOOD_N" -c $FLOOD_C --threads 2 --body-bytes $FLOOD_BYTES \
  --malformed --accept 400 --timeout-ms 30000 --prefix fld-$$
mark flood_end
put rss_flood_peak_kb "$(rss VmHWM)"
show flood "flood     c=$FLOOD_C"
sleep 3
put rss_after_flood_kb "$(rss VmRSS)"
sql "SELECT string_agg(status || '=' || n, ' ' ORDER BY status)
     FROM (SELECT status, count(*) AS n FROM idempotency_keys GROUP BY 1) s" \
  idemsaga_orchestrator >"$RES/order_states_end.txt"

# 7. The peers, each on its own tenant at the same participants.
for peer in $PEERS; do run_peer "$peer"; done

# 8. Cost as the work grows: GROWTH_KEYS more finished keys in the orchestrator's table and in
# each participant's (copies of one real order's rows, bench/grow_keys.sql), then orders at 16
# connections again, against the empty-table figures of phase 3.
SERVICES=(orchestrator inventory payment)
grow() { # PREFIX N EXPIRES: N keys more in each service's table, loaded side by side
  local db key pids=()
  for db in "${SERVICES[@]}"; do
    key=growth-tpl-$$
    [ "$db" = orchestrator ] || key=$key-$db
    "${PSQL[@]}" -v tpl="$key" -v n="$2" -v exp="$3" -v pfx="$1-$$" "$URL/idemsaga_$db" \
      -f "$ROOT/bench/grow_keys.sql" &
    pids+=($!)
  done
  wait "${pids[@]}"
}
growth_free_gb=$(df -P --block-size=1G "$PG_DIR" | awk 'NR == 2 {print $4}')
# An order's three rows take about 3 KB with their indexes (2.2 of them the orchestrator's); the
# WAL the load writes is recycled at each checkpoint.
growth_need_gb=$((GROWTH_KEYS * 32 / 10000000 + 5))
if ((growth_free_gb < growth_need_gb)); then
  echo "run.sh: growth phases skipped: $GROWTH_KEYS keys need ~${growth_need_gb} GB free" \
    "next to the cluster, ${growth_free_gb} GB are" >&2
else
  lg growth_template "${ORDER_ARGS[@]}" -n 1 -c 1 --same-key "growth-tpl-$$"
  mark growth_load_start
  grow g "$GROWTH_KEYS" '30 days'
  vacuums=()
  for db in "${SERVICES[@]}"; do
    sql "VACUUM (ANALYZE) idempotency_keys" "idemsaga_$db" &
    vacuums+=($!)
  done
  wait "${vacuums[@]}"
  mark growth_load_end
  put growth_keys "$GROWTH_KEYS"
  printf 'growth    %d keys more in each service'"'"'s table, loaded and vacuumed in %.0f s\n' \
    "$GROWTH_KEYS" "$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" \
      "$(grep '^t_growth_load_start=' "$VALUES" | cut -d= -f2)" \
      "$(grep '^t_growth_load_end=' "$VALUES" | cut -d= -f2)")"
  growth16() { order_phase growth16 16; }
  # Phase 3 ran 20 minutes or more before: the bound again, beside these orders, so that the
  # ratio can be read against the machine's speed now as well (report.py growth).
  bound 16 before g
  phase growth16 growth16
  bound 16 after g
  show growth16 "orders+grown c=16"
  python3 "$ROOT/bench/report.py" per-order "$RES" growth16

  # 9. Garbage collection under load: each service's table gets the keys that twice this
  # rate of orders makes expire in one collection interval (a minute), already expired; then
  # orders at 16 connections for GC_S s, long enough for every service's collector to pass,
  # while a sampler follows each table's backlog twice a second.
  backlog=$(python3 -c "import json, sys; print(int(2 * 60 * json.load(open(sys.argv[1]))['per_second']) + 1)" \
    "$RES/growth16.json")
  put gc_backlog "$backlog"
  # The backlog left: the keys loaded less the rows deleted since (pg_stat_user_tables; the
  # orders delete none). A count(*) of the expired keys twice a second was itself a load: each
  # read every backlog row's heap tuple, none of them all-visible yet.
  deleted() { sql "SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'" "idemsaga_$1"; }
  # Counted from before the load: a collector that passes between the load and the phase
  # deletes backlog too.
  declare -A deleted0
  for db in "${SERVICES[@]}"; do deleted0[$db]=$(deleted "$db"); done
  grow x "$backlog" '-1 minute'
  backlog_sample() { # the time, and each table's backlog left
    local db line
    line=$(date +%s.%N)
    for db in "${SERVICES[@]}"; do line+=" $((backlog - ($(deleted "$db") - deleted0[$db])))"; done
    echo "$line" >>"$RES/gc_backlog.txt"
  }
  gc_sample() {
    while :; do
      backlog_sample
      sleep 0.5
    done
  }
  gc_phase() {
    ATTEMPT=$((ATTEMPT + 1))
    checkpoint
    : >"$RES/gc_backlog.txt"
    gc_sample 9>&- &
    local sampler=$!
    mark gc_start
    lg gc "${ORDER_ARGS[@]}" --duration "$GC_S" -c 16 --prefix "gc-$$-$ATTEMPT"
    mark gc_end
    kill $sampler 2>/dev/null
    wait $sampler 2>/dev/null || true
    # A backend publishes its counters within a second of a commit, or 10 s after going idle
    # (the collector rests between batches): one more sample once all are published.
    sleep 11
    backlog_sample
  }
  gc_phase # not again when others took the CPU: the backlog is gone after the first
  show gc "orders+GC  c=16"
  python3 "$ROOT/bench/report.py" growth "$RES"
fi

sql "DROP DATABASE bench_pgbench WITH (FORCE)" # phase 8 measures its bound again

# The build measured; RESULTS.md itself (this run's row) does not make the tree dirty.
dirty=$(git diff --quiet HEAD -- . ':(exclude)bench/RESULTS.md' || echo -dirty)
put head "$(git rev-parse --short HEAD)$dirty"
mark run_end
sleep 1.2 # cpuwatch's last second
python3 "$ROOT/bench/report.py" final "$RES" "$ROOT/bench/RESULTS.md"
python3 "$ROOT/bench/peers/peers_report.py" summary "$RES" "$ROOT/bench/RESULTS.md"
