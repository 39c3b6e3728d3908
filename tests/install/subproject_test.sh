#!/usr/bin/env bash
# idemsaga built from source as a part of a team's project, both ways CMake offers
# (FetchContent and add_subdirectory): the project configures with the idemsaga:: targets and
# without idemsaga's own tests, every file of examples/trip_booking compiles against them, and
# the saga's test links the test kit and passes. The orchestrator and participant binaries are
# compiled, not linked: linking them builds all of idemsaga again, which install_example_test
# covers through an install.
#   subproject_test.sh SOURCE_DIR
set -euo pipefail
source_dir=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL $*" >&2; exit 1; }

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Both ways build in the same folder, named relative to the run's own: the second build and
  # every later run hit the cache.
  export CCACHE_BASEDIR=$work CCACHE_NOHASHDIR=1
fi
build="$work/build"
for how in fetch subdirectory; do
  rm -rf "$build"
  cmake -S "$source_dir/tests/install/subproject" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DIDEMSAGA_SOURCE="$source_dir" -DIDEMSAGA_HOW="$how" "${launcher[@]}" >"$work/configure.log" ||
    { cat "$work/configure.log"; fail "$how: configure"; }
  objects=$(cd "$build" && ninja -t targets all |
    grep -oE '^CMakeFiles/(trip_orchestrator|hotel|car)\.dir/[^:]*\.o' || true)
  [ "$(wc -w <<<"$objects")" -eq 4 ] || fail "$how: the example's objects are not [$objects]"
  # shellcheck disable=SC2086
  (cd "$build" && ninja trip_saga_test $objects) >"$work/build.log" ||
    { cat "$work/build.log"; fail "$how: build"; }
  "$build/trip_saga_test" --gtest_brief=1 >"$work/test.log" ||
    { cat "$work/test.log"; fail "$how: the saga's test"; }
  echo "ok   $how: idemsaga:: targets, the example compiles, its saga test passes"
done
