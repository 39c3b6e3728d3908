#!/usr/bin/env bash
# What a team adopting idemsaga does: install this build into a fresh prefix (and, where cpack
# is at hand, unpack the Debian package cpack makes), build examples/trip_booking as a project
# of its own against it (find_package(idemsaga)), run its saga test (no database), then its
# three binaries: the two participants and the orchestrator, an idemsaga::App. Two trips end to
# end on the run's PostgreSQL, effects counted in the participants' own databases; the
# orchestrator drains on SIGTERM and exits 0.
#   example_test.sh BUILD_DIR SOURCE_DIR CLUSTER_URL_FILE
set -euo pipefail
build_dir=$1 source_dir=$2 url_file=$3
work=$(mktemp -d)
server_url=$(head -n1 "$url_file")
# Databases of its own, dropped at the end: a cluster that outlives the run never replays an
# earlier run's keys to this one.
prefix="trip_$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for db in orchestrator hotel car; do
    psql -q "$server_url" -c "DROP DATABASE IF EXISTS ${prefix}_${db} WITH (FORCE)" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL $*" >&2; exit 1; }
ok() { echo "ok   $*"; }

cmake --install "$build_dir" --prefix "$work/prefix" >"$work/install.log"
python3 "$source_dir/tests/install/check_headers.py" "$work/prefix" "$source_dir"
test -f "$work/prefix/lib/pkgconfig/idemsaga.pc" || fail "no idemsaga.pc"
ok "installed headers are exactly include/idemsaga/, with a pkg-config file"

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
build_example() {  # PREFIX BUILD_DIR
  cmake -S "$source_dir/examples/trip_booking" -B "$2" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$1" "${launcher[@]}" >/dev/null
  cmake --build "$2" >"$work/build.log" || { cat "$work/build.log"; fail "example build against $1"; }
}
build_example "$work/prefix" "$work/build"
ok "examples/trip_booking builds against the install"
# The Debian package cpack makes, unpacked (not installed): the same files under /usr.
(cd "$build_dir" && cpack -G DEB -B "$work/cpack" >"$work/cpack.log") ||
  { cat "$work/cpack.log"; fail "cpack -G DEB"; }
deb=$(ls "$work"/cpack/idemsaga_*.deb)
dpkg-deb -x "$deb" "$work/deb"
python3 "$source_dir/tests/install/check_headers.py" "$work/deb/usr" "$source_dir" >/dev/null
build_example "$work/deb/usr" "$work/build-deb"
ok "$(basename "$deb"): the same headers, and the example builds against its contents"
# Lines of the team's own code (the file, comments and blank lines out).
count() { grep -cvE '^\s*(//.*)?$' "$source_dir/examples/trip_booking/$1"; }
echo "lines: saga $(($(count trip_saga.cpp) + $(count trip_saga.hpp))) + orchestrator main" \
  "$(count orchestrator.cpp); hotel $(count hotel.cpp); car $(count car.cpp)"
test $(($(count trip_saga.cpp) + $(count trip_saga.hpp) + $(count orchestrator.cpp))) -le 40 ||
  fail "the saga and the orchestrator's main are over 40 lines"
test "$(count hotel.cpp)" -le 60 && test "$(count car.cpp)" -le 60 || fail "a participant over 60 lines"
if [ -x "$work/build/trip_saga_test" ]; then
  "$work/build/trip_saga_test" && ok "the saga's own test passes with no database"
fi

bin=$work/build
"$bin/trip_orchestrator" orchestrator --help >"$work/help.txt"
for flag in --database-url --participant --hotel-url --service-token --migrate --lease-seconds \
  --response-budget-ms --amqp-url --shutdown-grace-ms --reconcile-interval-ms --http-threads; do
  grep -q -- "$flag" "$work/help.txt" || fail "trip_orchestrator orchestrator --help lacks $flag"
done
ok "the team's binary has the stock orchestrator's flags"

for db in orchestrator hotel car; do
  psql -q "$server_url" -c "CREATE DATABASE ${prefix}_${db}" >/dev/null
done
url() { python3 -c 'import sys,urllib.parse as u; p=u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/"+sys.argv[2])))' "$server_url" "${prefix}_$1"; }
token=trip-service-token
ready() {  # LOG PID: the URL on the process's "ready on" line, once it is there
  for _ in $(seq 600); do
    # -s: the shell may not have created the log yet. No pipe into an early-exiting reader:
    # under pipefail its writer's SIGPIPE would fail the line.
    if grep -qs "ready on" "$work/$1"; then
      url=$(grep -o 'http://[^ ]*' "$work/$1")
      echo "${url%%$'\n'*}"
      return
    fi
    kill -0 "$2" 2>/dev/null || { cat "$work/$1" >&2; fail "$1: the process exited"; }
    sleep 0.1
  done
  cat "$work/$1" >&2; fail "$1: not ready"
}
"$bin/hotel" --database-url "$(url hotel)" --service-token $token >"$work/hotel.log" 2>&1 &
pids+=($!)
hotel=$(ready hotel.log $!)
"$bin/car" --database-url "$(url car)" --service-token $token >"$work/car.log" 2>&1 &
pids+=($!)
car=$(ready car.log $!)
"$bin/trip_orchestrator" migrate --database-url "$(url orchestrator)" --kind orchestrator >/dev/null
api_key=$("$bin/trip_orchestrator" tenant create demo --database-url "$(url orchestrator)" | tail -n1)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
start_orchestrator() {  # LOG: sets orch (its URL) and orch_pid
  "$bin/trip_orchestrator" orchestrator --database-url "$(url orchestrator)" \
    --listen 127.0.0.1:$port --service-token $token \
    --participant hotel=$hotel --participant car=$car >"$work/$1" 2>&1 &
  orch_pid=$!
  pids+=($orch_pid)
  orch=$(ready "$1" $orch_pid)
}
start_orchestrator orchestrator.log

book() {  # KEY CITY: prints "<status> <body>" and the headers to $work/headers
  curl -s -D "$work/headers" -o "$work/body" -w '%{http_code}' -X POST "$orch/v1/runs/trip" \
    -H "Authorization: Bearer $api_key" -H "Idempotency-Key: $1" \
    -H 'Content-Type: application/json' -d "{\"city\":\"$2\"}"
  echo " $(cat "$work/body")"
}
count_rows() { psql -tAq "$(url "$1")" -c "$2"; }
paris=$(book "$prefix-paris" Paris)
echo "Paris:    $paris"
[[ $paris == 201\ * ]] || fail "Paris is not booked: $paris"
again=$(book "$prefix-paris" Paris)
[ "$again" = "$paris" ] && grep -qi '^Idempotent-Replayed: true' "$work/headers" ||
  fail "the retry did not replay the same bytes: $again"
ok "Paris is booked (201), and its retry replays the same bytes"
[ "$(count_rows hotel "SELECT count(*) FROM bookings WHERE idempotency_key = '$prefix-paris-hotel' AND NOT cancelled")" = 1 ] ||
  fail "not one hotel booking for Paris"
[ "$(count_rows car "SELECT count(*) FROM rentals WHERE idempotency_key = '$prefix-paris-car'")" = 1 ] ||
  fail "not one rental for Paris"
ok "one booking and one rental for Paris, in the participants' own databases"
atlantis=$(book "$prefix-atlantis" Atlantis)
echo "Atlantis: $atlantis"
[[ $atlantis == 422\ *no_cars* ]] || fail "Atlantis did not fail with the car desk's 422: $atlantis"
[ "$(count_rows hotel "SELECT count(*) FROM bookings WHERE idempotency_key = '$prefix-atlantis-hotel' AND cancelled")" = 1 ] ||
  fail "the Atlantis hotel booking was not cancelled"
[ "$(count_rows car "SELECT count(*) FROM rentals WHERE idempotency_key = '$prefix-atlantis-car'")" = 0 ] ||
  fail "a car was rented in Atlantis"
ok "Atlantis fails with 422 no_cars, its hotel booking cancelled, no car rented"
openapi=$(curl -s "$orch/openapi.json")
python3 -c 'import json, sys
doc = json.loads(sys.argv[1])
saga = doc["paths"]["/v1/runs/{saga}"]["post"]["parameters"][0]["schema"]
assert saga["enum"] == ["trip"], saga
assert "/v1/orders" not in doc["paths"], "documents /v1/orders, which it does not serve"' "$openapi" ||
  fail "/openapi.json does not document the trip saga alone"
ok "/openapi.json documents POST /v1/runs/{saga} for trip, and no /v1/orders"

# Reconcile from the team's binary: no token of the stock binary's to fall back on; with the
# participants' token, both trips agree with what the hotel and the car desk hold.
if "$bin/trip_orchestrator" reconcile --database-url "$(url orchestrator)" \
  --participant hotel=$hotel --participant car=$car 2>"$work/reconcile.err"; then
  fail "reconcile ran without a service token"
fi
grep -q -- --service-token "$work/reconcile.err" || fail "reconcile did not ask for --service-token"
"$bin/trip_orchestrator" reconcile --database-url "$(url orchestrator)" --service-token $token \
  --participant hotel=$hotel --participant car=$car >"$work/reconcile.out" ||
  { cat "$work/reconcile.out"; fail "reconcile found a discrepancy or could not read a participant"; }
grep -q "2 sagas" "$work/reconcile.out" || { cat "$work/reconcile.out"; fail "reconcile did not check both trips"; }
ok "reconcile needs the service token, then finds both trips in agreement with the participants"

kill -TERM "$orch_pid"
status=0
wait "$orch_pid" || status=$?
[ "$status" = 0 ] || fail "the orchestrator exited $status on SIGTERM"
ok "the orchestrator drains on SIGTERM and exits 0"

# Tenants: listed, then revoked: the next orchestrator refuses the old key and replays nothing.
tenants=$("$bin/trip_orchestrator" tenant list --database-url "$(url orchestrator)")
[ "$tenants" = demo ] || fail "tenant list does not show demo alone: $tenants"
"$bin/trip_orchestrator" tenant revoke demo --database-url "$(url orchestrator)" >/dev/null
if "$bin/trip_orchestrator" tenant revoke nobody --database-url "$(url orchestrator)" 2>/dev/null; then
  fail "revoking an unknown tenant succeeded"
fi
start_orchestrator orchestrator2.log
revoked=$(book "$prefix-paris" Paris)
[[ $revoked == 401\ * ]] || fail "a revoked key was not refused: $revoked"
ok "tenant list shows the tenant; after tenant revoke its key gets 401"
echo "example_test: all checks passed"
