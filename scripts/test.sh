#!/usr/bin/env bash
# Installs what is missing, builds loom twice (optimised, and with AddressSanitizer +
# UndefinedBehaviorSanitizer), and runs the whole test suite (CTest) on both builds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "== release build"
bash scripts/build.sh build
(cd build && ctest --output-on-failure -j "$jobs")

echo "== sanitizer build (ASan + UBSan)"
bash scripts/build.sh build-asan -DLOOM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
# LeakSanitizer cannot follow OpenBLAS's and libgomp's thread pools cleanly at exit;
# leaks in loom's own code are still reported by the tests that exercise them.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
(cd build-asan && LOOM_SANITIZED=1 ctest --output-on-failure -j "$jobs")
