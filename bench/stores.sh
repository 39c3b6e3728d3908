#!/usr/bin/env bash
# The guard on each key store, side by side: bench/bench_mailer (a participant built only from
# the library, whose one route is an external effect that only answers) started three times,
# with its keys in PostgreSQL (the database at POSTGRES_URL), in Redis (a private redis-server:
# appendonly yes, appendfsync everysec) and in DynamoDB (a private dynalite, scripts/dynalite.sh);
# wrk at 16 connections on each: unique keys (claims: a claim and a record per request) and one
# key (replays: one read). dynalite is not DynamoDB: its figures measure our client and an
# in-memory JavaScript emulator on this machine, not AWS's latency or throughput. Part 5c of
# bench/run.sh, which adds the figures to its row of bench/RESULTS.md; also run on its own:
#
#   bench/stores.sh POSTGRES_URL RESULTS_DIR
#   env: BIN (the build folder holding bench/bench_mailer; build/release), STORES_S (seconds a
#        phase; 10), WRK_THREADS (1), SR_PORT (its Redis; 16380), SD_PORT (its dynalite; 18100),
#        SM_PORT (the mailers: SM_PORT, +1, +2; 18101)
#
# Writes RESULTS_DIR/st_{pg,redis,dynamo}_{claims,replays}.txt (wrk, with its wrk-json line) and
# prints them (bench/report.py stores). Stops what it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PG_URL=$1 RES=$2
BIN=${BIN:-$ROOT/build/release} STORES_S=${STORES_S:-10} WRK_THREADS=${WRK_THREADS:-1}
SR_PORT=${SR_PORT:-16380} SD_PORT=${SD_PORT:-18100} SM_PORT=${SM_PORT:-18101}
mkdir -p "$RES"
WORK=$(mktemp -d /tmp/idemsaga-stores-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do { kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; } || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

bash scripts/dynalite.sh --install
redis-server --bind 127.0.0.1 --port "$SR_PORT" --dir "$WORK" --appendonly yes \
  --appendfsync everysec --save '' --daemonize no --logfile "$WORK/redis.log" 9>&- &
PIDS+=($!)
bash scripts/dynalite.sh --host 127.0.0.1 --port "$SD_PORT" --createTableMs 0 \
  >"$WORK/dynalite.log" 2>&1 9>&- &
PIDS+=($!)
for _ in $(seq 1 100); do redis-cli -p "$SR_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
# dynalite answers anything once it listens (an unsigned request: 400).
for _ in $(seq 1 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$SD_PORT/")" != 000 ] && break
  sleep 0.1
done

mailer() { # NAME PORT FLAGS...: starts one, returns once it is ready
  "$BIN/bench/bench_mailer" --listen "127.0.0.1:$2" --service-token dev-service-token "${@:3}" \
    >"$WORK/$1.log" 2>&1 9>&- &
  PIDS+=($!)
  for _ in $(seq 1 200); do grep -q "ready on" "$WORK/$1.log" && return 0; sleep 0.1; done
  cat "$WORK/$1.log" "$WORK/dynalite.log" "$WORK/redis.log" >&2
  exit 1
}
mailer pg "$SM_PORT" --database-url "$PG_URL"
mailer redis "$((SM_PORT + 1))" --store redis --redis-url "redis://127.0.0.1:$SR_PORT"
mailer dynamo "$((SM_PORT + 2))" --store dynamodb --dynamodb-url "http://127.0.0.1:$SD_PORT"

measure() { # NAME PORT unique|same
  wrk -t"$WRK_THREADS" -c16 -d"${STORES_S}s" -s "$ROOT/bench/wrk_guarded.lua" \
    "http://127.0.0.1:$2" -- "$1-$$" "$3" /v1/emails '{"to":"ann@example.com"}' >"$RES/$1.txt" 2>&1
  grep -q '^wrk-json ' "$RES/$1.txt" || {
    cat "$RES/$1.txt" >&2
    exit 1
  }
}
for store in pg redis dynamo; do
  port=$SM_PORT
  [ "$store" = redis ] && port=$((SM_PORT + 1))
  [ "$store" = dynamo ] && port=$((SM_PORT + 2))
  measure "st_${store}_claims" "$port" unique
  measure "st_${store}_replays" "$port" same
done
python3 "$ROOT/bench/report.py" stores "$RES"
