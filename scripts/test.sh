#!/usr/bin/env bash
# The test command. Installs what is missing, builds loom twice (optimised, and with
# AddressSanitizer + UndefinedBehaviorSanitizer), runs the whole test suite (CTest) on the
# optimised build, each MPI script on its representative matrix (LOOM_TEST_REPRESENTATIVE=1),
# then under the sanitizers the tests labelled `sanitizer`: every module's unit tests, the CLI
# scripts and the core MPI scripts, those in their core form (LOOM_TEST_QUICK=1). Prints each
# phase's wall time; on 2 cores the whole is meant to stay under 10 minutes.
#
# usage: bash scripts/test.sh [--full]
#   --full  every MPI script's full matrix on the release build, and every test under the
#           sanitizers too (also those labelled slow, and the MPI scripts beyond their core);
#           CI may run it.
# Labels for running a part by hand, in build/: `ctest -L unit` (one process each, seconds),
# -L mpi, -L cli, -L slow, -L sanitizer (tests/CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
case "${1:-}" in
"") ;;
--full) full=1 ;;
*)
    echo "usage: bash scripts/test.sh [--full]" >&2
    exit 2
    ;;
esac
jobs=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

started=$(date +%s)
phase_started=$started
# phase_done NAME: the wall time since the last phase ended
phase_done() {
    local now
    now=$(date +%s)
    echo "== $1: $((now - phase_started)) s"
    phase_started=$now
}
# skip_reasons BUILD_DIR: why each skipped test skipped (its "SKIPPED: ..." line)
skip_reasons() {
    grep -h '^SKIPPED: ' "$1/Testing/Temporary/LastTest.log" 2>/dev/null | sed 's/^/   /' || true
}

bash scripts/setup.sh
phase_done "setup"

echo "== release build"
bash scripts/build.sh build
phase_done "release build"
if [ "$full" = 1 ]; then
    (cd build && ctest --output-on-failure -j "$jobs")
else
    # every test, each MPI script on its representative matrix (the full ones under --full)
    (cd build && LOOM_TEST_REPRESENTATIVE=1 ctest --output-on-failure -j "$jobs")
fi
skip_reasons build
phase_done "release tests (all)"

echo "== sanitizer build (ASan + UBSan)"
bash scripts/build.sh build-asan -DLOOM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
phase_done "sanitizer build"
# LeakSanitizer cannot follow OpenBLAS's and libgomp's thread pools cleanly at exit;
# leaks in loom's own code are still reported by the tests that exercise them.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if [ "$full" = 1 ]; then
    (cd build-asan && LOOM_SANITIZED=1 ctest --output-on-failure -j "$jobs")
    skip_reasons build-asan
    phase_done "sanitizer tests (all)"
else
    (cd build-asan &&
        LOOM_SANITIZED=1 LOOM_TEST_QUICK=1 ctest --output-on-failure -j "$jobs" -L sanitizer)
    skip_reasons build-asan
    phase_done "sanitizer tests (-L sanitizer)"
fi
echo "== all tests passed in $(($(date +%s) - started)) s"
