#!/usr/bin/env bash
# The activation-memory modes train the same model as one process: selective recomputation
# (--recompute selective: every activation kept but the attention's softmax, recomputed in
# backward) at pp 2 on every schedule (gpipe, 1f1b, interleaved, zb-h1, zb-v) and in one process;
# Megatron's sequence parallelism (--sequence-parallel) at tp 2 alone, with pp 2 and with dp 2.
# Losses and validation losses within 1e-5 relative at every step, grad norms within 1e-6, final
# parameters within 1e-5, bit-identical DP replicas (the harness of mpi_schedules.sh). A
# selective run's losses equal the keeping run's of the same layout exactly (the same kernels in
# the same order). Bad combinations are refused by name.
# usage: bash tests/mpi_memory_modes.sh LOOM_BINARY TMPDIR COMPARE_WEIGHTS
# LOOM_SANITIZED=1 / LOOM_TEST_QUICK=1 run a representative subset (the core, LOOM_TEST_QUICK:
# selective at 1f1b and zb-v, sequence parallelism at tp 2 alone and with dp 2).
set -u
LOOM=$1
TMP=$2
CMP=$3
. "$(cd "$(dirname "$0")" && pwd)/mpi_harness.bash"
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1

prepare_corpus

# eight layers, so that every chunk of 2 ranks x 2 virtual stages has two (selective then keeps
# one softmax of two); four heads, for tp 2
common=(--model tiny --layers 8 --heads 4 --data 'data/train_*.bin' --val-data 'data/val_*.bin'
    --steps 8 --seq-len 16 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --warmup-steps 2
    --eval-every 4 --eval-batches 2 --threads 1 --log-every 100 --comm-timeout 60)

# same_losses A B: the two runs' losses and grad norms are the same numbers, as printed
same_losses() {
    if cmp -s <(series "$1/metrics.jsonl") <(series "$2/metrics.jsonl"); then
        ok
    else
        fail "$2: losses differ from $1's: $(diff <(series "$1/metrics.jsonl") <(series "$2/metrics.jsonl") | head -4)"
    fi
}

single single
single single_selective --recompute selective
same_losses single single_selective

# ---- selective recomputation on every schedule ----
il=(--pipeline-parallel 2 --schedule interleaved --virtual-stages 2)
check sel_1f1b 2 single --pipeline-parallel 2 --recompute selective
[ "$core_only" = 1 ] || { run keep_1f1b 2 --pipeline-parallel 2 && same_losses keep_1f1b sel_1f1b; }
check sel_zbv 2 single --pipeline-parallel 2 --schedule zb-v --recompute selective
if [ "$quick" != 1 ]; then
    check sel_gpipe 2 single --pipeline-parallel 2 --schedule gpipe --recompute selective
    check sel_interleaved 2 single "${il[@]}" --recompute selective
    check sel_zbh1 2 single --pipeline-parallel 2 --schedule zb-h1 --recompute selective
    check sel_zbv_tp2 4 single --pipeline-parallel 2 --schedule zb-v --tensor-parallel 2 --recompute selective
fi

# ---- sequence parallelism ----
check sp_tp2 2 single --tensor-parallel 2 --sequence-parallel
run tp2 2 --tensor-parallel 2 && compare_run tp2
[ "$core_only" = 1 ] || check sp_tp2_pp2 4 single --tensor-parallel 2 --pipeline-parallel 2 --sequence-parallel
check sp_tp2_dp2 4 single --tensor-parallel 2 --data-parallel 2 --sequence-parallel
if [ "$quick" != 1 ]; then
    check sp_tp2_zbv 4 single --tensor-parallel 2 --pipeline-parallel 2 --schedule zb-v --sequence-parallel
    check sp_tp2_il_recompute 4 single --tensor-parallel 2 "${il[@]}" --sequence-parallel --recompute
    check sp_tp2_zbh1_selective 4 single --tensor-parallel 2 --pipeline-parallel 2 --schedule zb-h1 --sequence-parallel --recompute selective
    check sp_tp2_dp2_nozero 4 single --tensor-parallel 2 --data-parallel 2 --no-zero1 --sequence-parallel
fi

# refused by name
refused() { # what expected-text ranks flags...
    local what=$1 text=$2 np=$3
    shift 3
    if timeout 120 mpirun -np "$np" "$LOOM" train "${common[@]}" --out "bad_$what" "$@" >"bad_$what.log" 2>&1; then
        fail "$what: accepted"
    elif grep -q -- "$text" "bad_$what.log"; then
        ok
    else
        fail "$what: message does not say \"$text\": $(grep -m2 -i 'error\|expected' "bad_$what.log")"
    fi
}
refused sp_tp1 "sequence_parallel: expected false with mesh.tp 1" 1 --sequence-parallel
refused sp_rows "(--micro-batch-size x --seq-len), must divide by the tensor-parallel degree 2" 2 --tensor-parallel 2 --sequence-parallel --seq-len 15 --micro-batch-size 1

finish
