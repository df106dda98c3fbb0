#!/usr/bin/env bash
# fuzz.sh — the full run of loom's file-format fuzzer (tests/fuzz.py): COUNT mutants (default
# 10000) of every format loom reads, one at a time, against the sanitizer build: about 12 minutes
# on 2 cores for the eight single-process formats (cluster descriptions and GPT-2 tokenizer files,
# only read, are the quickest: the tokenizer's ~1,100 mutants take about a minute), and about 2 s
# more for each compressor-state mutant (one in nine: a 2-rank
# resume under mpirun, leak-checked), about 40 minutes more in all; LIMIT=compress=N caps them. Prints the totals per format (exit 2 / 0 / 1 / crash / hang /
# slow), the crashes and hangs (kept with a repro.sh under OUT/findings/), the suspicious
# accepted mutants, and those accepted with a changed outcome (for review). Exits non-zero on a
# crash or a hang.
#
# usage: bash bench/fuzz.sh [COUNT] [SEED]
#   LOOM=path/to/loom (default build-asan/loom, else build/loom), OUT=folder (default
#   runs/fuzz-SEED, emptied first), TIMEOUT=seconds per run (default 20), STRICT=1 also fails on
#   suspicious accepted mutants, LIMIT=FORMAT=N,... at most N mutants of FORMAT.
# Build the sanitizer binary first:
#   cmake -S . -B build-asan -DLOOM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug && cmake --build build-asan
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-10000}
seed=${2:-1}
loom=${LOOM:-}
if [ -z "$loom" ]; then
    loom=build-asan/loom
    [ -x "$loom" ] || loom=build/loom
fi
[ -x "$loom" ] || { echo "fuzz.sh: no loom binary (build one, or set LOOM)" >&2; exit 2; }
out=${OUT:-runs/fuzz-$seed}
# as scripts/test.sh: a sanitizer report aborts the run (counted as a crash)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
extra=()
[ "${STRICT:-0}" = 1 ] && extra+=(--strict)
[ -n "${LIMIT:-}" ] && extra+=(--limit "$LIMIT")
python3 tests/fuzz.py "$loom" "$out" --count "$count" --seed "$seed" --timeout "${TIMEOUT:-20}" \
    --quiet "${extra[@]}"
