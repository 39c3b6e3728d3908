#!/usr/bin/env bash
# What a team adopting idemsaga does: install this build into a fresh prefix, build
# examples/trip_booking as a project of its own against it (find_package(idemsaga)), and run
# it: two trips end to end on the run's PostgreSQL, effects counted in its own databases.
#   example_test.sh BUILD_DIR SOURCE_DIR CLUSTER_URL_FILE
set -euo pipefail
build_dir=$1 source_dir=$2 url_file=$3
work=$(mktemp -d)
server_url=$(head -n1 "$url_file")
# Databases of its own, dropped at the end: a cluster that outlives the run never replays an
# earlier run's keys to this one.
prefix="trip_$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
cleanup() {
  for db in orchestrator hotel car; do
    psql -q "$server_url" -c "DROP DATABASE IF EXISTS ${prefix}_${db} WITH (FORCE)" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >"$work/install.log"
# Only the public entry headers and what they reach are installed, under include/idemsaga/.
test -f "$work/prefix/include/idemsaga/saga.hpp"
test -f "$work/prefix/include/idemsaga/steps/guard/http_guard.hpp"
test ! -e "$work/prefix/include/idemsaga/common/http/request_parser.hpp"
test ! -e "$work/prefix/include/common"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$source_dir/examples/trip_booking" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}" >/dev/null
cmake --build "$work/build"
"$work/build/trip_booking" --server-url "$server_url" --db-prefix "$prefix"
