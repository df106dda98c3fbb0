#!/usr/bin/env bash
# The Llama family (RMSNorm, rotary positions, SwiGLU, grouped-query attention, an untied head)
# trains the same model in every layout as in one process, as GPT-2 does (tests/mpi_parallel.sh,
# mpi_schedules.sh): losses, grad norms and validation losses within 1e-5 relative at every
# step, final parameters within 1e-5, bit-identical replicas. Also: a tied head (SmolLM's),
# compression and an island, checkpoints resumed across layouts, and the refusals by name.
# usage: bash tests/mpi_llama.sh LOOM_BINARY TMPDIR COMPARE_WEIGHTS
# LOOM_TEST_QUICK=1 runs the core only (tp, a pipeline with the head beside the embedding, a
# refusal): the sanitizer phase's time budget; the kernels and the model run under the sanitizers
# in test_ops and test_model.
set -u
LOOM=$1
TMP=$2
CMP=$3
. "$(cd "$(dirname "$0")" && pwd)/mpi_harness.bash"
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1

prepare_corpus

# 4 heads sharing 2 key/value heads (tp 2 takes one each), SwiGLU of 48, 4 layers for 2 stages
# of 2 chunks
common=(--arch llama --layers 4 --heads 4 --kv-heads 2 --d-model 32 --ffn-dim 48 --context 16
    --data 'data/train_*.bin' --val-data 'data/val_*.bin' --steps 8 --seq-len 16
    --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --warmup-steps 2 --eval-every 4
    --eval-batches 2 --threads 1 --log-every 100 --comm-timeout 60 --save-every 4)

single single
if grep -q "arch llama" single.log; then ok; else fail "the run does not say it trains a Llama: $(grep -m1 '^model' single.log)"; fi

# the core (its tp run also writes a trace: the sanitizer phase's trace of several ranks)
check tp2 2 single --tensor-parallel 2 --trace tp2.trace.json
if jq -e '.traceEvents | length > 0' tp2.trace.json >/dev/null 2>&1; then ok; else fail "tp2: no trace events"; fi
check zbv 2 single --pipeline-parallel 2 --schedule zb-v # rank 0: embedding and the untied head
if "$LOOM" train --model tiny --kv-heads 1 --steps 1 --data 'data/train_*.bin' --out gpt_kv >gpt_kv.log 2>&1; then
    fail "--kv-heads on GPT-2 was not refused"
elif grep -q "kv.heads: a Llama setting" gpt_kv.log; then ok; else fail "--kv-heads on GPT-2: $(tail -2 gpt_kv.log)"; fi

if [ "$core_only" = 1 ]; then
    finish
    exit $?
fi

check dp2_zero3 2 single --zero 3

# a tensor-parallel checkpoint resumed in one process continues as the single run
if "$LOOM" train "${common[@]}" --out resumed --resume tp2/checkpoints/step_00000004 >resumed.log 2>&1; then
    ok
    series single/metrics.jsonl | awk '$1 > 4' >single.tail
    series resumed/metrics.jsonl >resumed.series
    if out=$(close_series single.tail resumed.series); then ok; else fail "resumed from tp 2: $out"; fi
else
    fail "resume from tp 2: $(tail -3 resumed.log)"
fi

# refused by name: tp not dividing the kv heads
if timeout 60 mpirun -np 4 "$LOOM" train "${common[@]}" --out refused --tensor-parallel 4 >refused.log 2>&1; then
    fail "tp 4 over 2 kv heads was not refused"
elif grep -q "kv_heads 2" refused.log; then ok; else fail "tp 4 refusal does not name kv_heads: $(grep -m2 -i expected refused.log)"; fi

# every pipeline schedule, sequence parallelism with selective recomputation, ZeRO-2 with
# gradient accumulation, tp x dp
check pp2_1f1b 2 single --pipeline-parallel 2
check pp2_interleaved 2 single --pipeline-parallel 2 --schedule interleaved
check pp2_gpipe_recompute 2 single --pipeline-parallel 2 --schedule gpipe --recompute
check pp2_zbh1 2 single --pipeline-parallel 2 --schedule zb-h1
check tp2_sp_selective 2 single --tensor-parallel 2 --sequence-parallel --recompute selective
check zero2_accum 2 single --zero 2 --micro-batch-size 1
if [ "$quick" = 0 ]; then
    check tp2_dp2 4 single --tensor-parallel 2 --data-parallel 2 --micro-batch-size 1
fi
# compression sees q, k, v and gate, up as matrices of their own: top-k keeping every entry
# sends the whole gradient, so the run is one process's; an island of dp 2 whose outer step is
# the identity (SGD, lr 1, no momentum) is plain training
check dp2_topk_all 2 single --dp-compression topk --dp-topk-fraction 1
check island_identity 2 single --islands 1 --inner-steps 4 --outer-optimizer sgd --outer-lr 1 \
    --outer-momentum 0

# a tied head (SmolLM's): one process, and 2 stages that sum the two copies' gradients
single tied --tie-embeddings on
check tied_pp2 2 tied --tie-embeddings on --pipeline-parallel 2
a=$(jq -r 'select(.step == 8) | .loss' single/metrics.jsonl)
b=$(jq -r 'select(.step == 8) | .loss' tied/metrics.jsonl)
if [ -n "$a" ] && [ "$a" != "$b" ]; then ok; else fail "tying the head changed nothing ($a vs $b)"; fi

finish
