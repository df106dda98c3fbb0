# mpi_harness.bash — sourced by the tests/mpi_*.sh scripts that compare runs under mpirun: the
# MPI environment (root, oversubscription, idle ranks off the cores), pass/fail counters, the
# shared corpus (prepare_corpus, with $LOOM set), a run's metrics.jsonl read with jq (series,
# vseries, metric), the series comparisons against another run's, and the runs a comparing
# script makes with its ${common[@]} (single, run, compare_run, check; a script may define its
# own after sourcing this). The caller prints the totals with `finish`.

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
# How much of a script runs. LOOM_SANITIZED=1 (quick): a representative subset, as the sanitizers
# make every run ~10x slower. LOOM_TEST_QUICK=1 (core_only; scripts/test.sh's default sanitizer
# phase, under a time budget): less again, the core of each capability (every layout kind, resume,
# refusal), and implies quick. `scripts/test.sh --full` leaves LOOM_TEST_QUICK unset.
core_only=${LOOM_TEST_QUICK:-0}
quick=${LOOM_SANITIZED:-0}
# LOOM_TEST_REPRESENTATIVE=1 (scripts/test.sh's release phase without --full): the same
# representative subset on the release build, the full matrices left to --full
[ "${LOOM_TEST_REPRESENTATIVE:-0}" = 1 ] && quick=1
[ "$core_only" = 1 ] && quick=1
passed=0
failed=0
ok() { passed=$((passed + 1)); }
fail() {
    failed=$((failed + 1))
    echo "FAIL: $*" >&2
}
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

# A small corpus of 2000 lines, tokenized into data/ (train and validation shards) in the
# current folder, for 16-token sequences.
prepare_corpus() {
    for i in $(seq 1 2000); do
        echo "line $i: the quick brown fox $((i * 7 % 13)) jumps over the lazy dog $((i % 11))."
    done >corpus.txt
    "$LOOM" prepare --text corpus.txt --out data --seq-len 16 >/dev/null || fail "prepare"
}

# step loss grad_norm (one line per training record) and step val_loss, from a metrics.jsonl
series() { jq -r 'select(has("loss")) | "\(.step) \(.loss) \(.grad_norm)"' "$1"; }
vseries() { jq -r 'select(has("val_loss")) | "\(.step) \(.val_loss)"' "$1"; }
# metric RUN STEP KEY: KEY's value in the record of STEP in RUN/metrics.jsonl (as jq prints it)
metric() {
    jq -r --argjson step "$2" --arg key "$3" 'select(.step == $step and has($key)) | .[$key]' \
        "$1/metrics.jsonl"
}

# a b: same number of lines, and every column after the first equal within its relative
# tolerance: 1e-5 for losses (column 2), 1e-6 for grad norms (column 3)
close_series() {
    awk 'NR == FNR { for (i = 2; i <= NF; i++) ref[FNR, i] = $i; n = FNR; next }
         { m = FNR; for (i = 2; i <= NF; i++) { a = $i; b = ref[FNR, i]; d = a - b; if (d < 0) d = -d;
           s = b < 0 ? -b : b; tol = i == 3 ? 1e-6 : 1e-5;
           if (d > tol * s + 1e-12) { print "step " $1 " column " i ": " a " vs " b; bad = 1 } } }
         END { if (n != m || n == 0) { print "lines: " n " vs " m; bad = 1 } exit bad }' "$1" "$2"
}

# The runs a comparing script makes, each `loom train` with the caller's ${common[@]} (which
# trains 8 steps and saves), in the current folder: NAME/ and NAME.log.
# single NAME FLAGS...: one process, the reference.
single() {
    local name=$1
    shift
    "$LOOM" train "${common[@]}" --out "$name" "$@" >"$name.log" 2>&1 || fail "$name: $(tail -3 "$name.log")"
}

# run NAME RANKS FLAGS...: under mpirun (300 s at most); non-zero when it failed.
run() {
    local name=$1 np=$2
    shift 2
    if timeout 300 mpirun -np "$np" "$LOOM" train "${common[@]}" --out "$name" "$@" >"$name.log" 2>&1; then
        ok
    else
        fail "$name: exit $?: $(grep -m3 -i 'error\|expected' "$name.log" || tail -5 "$name.log")"
        return 1
    fi
}

# compare_run NAME [REFERENCE]: losses, grad norms and validation losses at every step as
# close_series says, final parameters within 1e-5 ($CMP), and with dp > 1 the replica check.
compare_run() {
    local name=$1 ref=${2:-single}
    series "$ref/metrics.jsonl" >"$ref.series"
    vseries "$ref/metrics.jsonl" >"$ref.vseries"
    series "$name/metrics.jsonl" >"$name.series"
    vseries "$name/metrics.jsonl" >"$name.vseries"
    if out=$(close_series "$ref.series" "$name.series"); then ok; else fail "$name losses/grad norms differ from one process: $out"; fi
    if out=$(close_series "$ref.vseries" "$name.vseries"); then ok; else fail "$name validation losses differ: $out"; fi
    local a=$ref/checkpoints/step_00000008/model.safetensors
    local b=$name/checkpoints/step_00000008/model.safetensors
    if out=$("$CMP" "$b" "$a" 1e-5 2>&1); then ok; else fail "$name final parameters: $out"; fi
    if ! grep -q "data parallel 1 " "$name.log"; then
        if grep -q "replicas hold bit-identical parameters" "$name.log"; then ok; else fail "$name replicas not reported identical"; fi
    fi
}

# check NAME RANKS REFERENCE FLAGS...: run, then compare_run against REFERENCE.
check() {
    local name=$1 np=$2 ref=$3
    shift 3
    run "$name" "$np" "$@" && compare_run "$name" "$ref"
}
