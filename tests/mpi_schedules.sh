#!/usr/bin/env bash
# Every pipeline schedule beyond 1F1B trains the same model as one process: interleaved 1F1B
# (2 and 3 virtual stages per rank, uneven chunks), ZB-H1 and ZB-V (split backward; ZB-V's V puts
# the first and the last virtual stage on rank 0), each with several micro-batch counts and
# combined with tp 2, dp 2 (ZeRO-1 and plain), recomputation (interleaved), the fused embedding
# sync and compression: losses and validation losses within 1e-5 relative at every step, grad
# norms within 1e-6, final parameters within 1e-5, bit-identical DP replicas. Checkpoints
# resume across schedules and layouts and back to one process; the plan file's virtual stages
# run as written; bad combinations are refused by name.
# usage: bash tests/mpi_schedules.sh LOOM_BINARY TMPDIR COMPARE_WEIGHTS
# LOOM_SANITIZED=1 runs a representative subset (the sanitizers make every run ~10x slower);
# LOOM_TEST_QUICK=1 also leaves out its 8-rank runs.
set -u
LOOM=$1
TMP=$2
CMP=$3
. "$(cd "$(dirname "$0")" && pwd)/mpi_harness.bash"
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1

prepare_corpus

# four layers, so that 2 ranks x 2 virtual stages have one each
common=(--model tiny --layers 4 --data 'data/train_*.bin' --val-data 'data/val_*.bin' --steps 8
    --seq-len 16 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --warmup-steps 2
    --eval-every 4 --eval-batches 2 --threads 1 --log-every 100 --comm-timeout 60)

single single
single single_m1 --micro-batch-size 1
single single_l6 --layers 6
single single_h4 --heads 4
[ "$quick" = 1 ] || single single_l6_g6 --layers 6 --global-batch-size 6

il=(--pipeline-parallel 2 --schedule interleaved --virtual-stages 2)
check il_p2v2_m4 2 single "${il[@]}"
check zbh1_p2_m4 2 single --pipeline-parallel 2 --schedule zb-h1
check zbv_p2_m4 2 single --pipeline-parallel 2 --schedule zb-v
check il_p2v2_dp2 4 single "${il[@]}" --data-parallel 2 --no-zero1
# 8 ranks (~10 s each under the sanitizers): not in LOOM_TEST_QUICK's core
if [ "$core_only" != 1 ]; then
    check il_p2v2_tp2_dp2 8 single_h4 --heads 4 "${il[@]}" --tensor-parallel 2 --data-parallel 2 --zero1
    check zbv_p2_tp2_dp2 8 single_h4 --heads 4 --pipeline-parallel 2 --schedule zb-v --tensor-parallel 2 --data-parallel 2 --zero1
fi
if [ "$quick" != 1 ]; then
    check il_p2v2_m8 2 single_m1 "${il[@]}" --micro-batch-size 1
    check il_p2v2_uneven 2 single_l6 --layers 6 "${il[@]}" --stage-layers 2,1,1,2
    check il_p2v3 2 single_l6 --layers 6 --pipeline-parallel 2 --schedule interleaved --virtual-stages 3
    check il_p2v2_recompute 2 single "${il[@]}" --recompute
    # recomputation under split backward: B's results are kept until W, which reruns the forward
    check zbh1_recompute 2 single --pipeline-parallel 2 --schedule zb-h1 --recompute
    check zbv_recompute_tp2 4 single_h4 --heads 4 --pipeline-parallel 2 --schedule zb-v --tensor-parallel 2 --recompute
    check zbh1_p2_m8 2 single_m1 --pipeline-parallel 2 --schedule zb-h1 --micro-batch-size 1
    check zbh1_p4_m4 4 single --pipeline-parallel 4 --schedule zb-h1
    check zbh1_p2_tp2_dp2 8 single_h4 --heads 4 --pipeline-parallel 2 --schedule zb-h1 --tensor-parallel 2 --data-parallel 2 --zero1
    # ZeRO-2 under every schedule: a split backward's B writes a block's LayerNorm gradients,
    # its W the rest, and the block's buffer is reduce-scattered after W
    for sched in gpipe 1f1b zb-h1 zb-v; do
        check "${sched}_p2_dp2_zero2" 4 single --pipeline-parallel 2 --schedule $sched --data-parallel 2 --zero 2
    done
    check il_p2v2_dp2_zero2 4 single "${il[@]}" --data-parallel 2 --zero 2
    # ZeRO-3 under every schedule: B gathers a block's parameters, W needs none
    for sched in gpipe 1f1b zb-h1 zb-v; do
        check "${sched}_p2_dp2_zero3" 4 single --pipeline-parallel 2 --schedule $sched --data-parallel 2 --zero 3
    done
    check il_p2v2_dp2_zero3 4 single "${il[@]}" --data-parallel 2 --zero 3
    check zbv_recompute_dp2_zero3 4 single --pipeline-parallel 2 --schedule zb-v --recompute --data-parallel 2 --zero 3
    check zbv_p2_m8 2 single_m1 --pipeline-parallel 2 --schedule zb-v --micro-batch-size 1
    check zbv_p2_uneven 2 single_l6 --layers 6 --pipeline-parallel 2 --schedule zb-v --stage-layers 2,1,2,1
    check zbv_p2_dp2_fused 4 single --pipeline-parallel 2 --schedule zb-v --data-parallel 2 --no-zero1 --embedding-sync fused
    check il_p2v2_dp2_fused 4 single "${il[@]}" --data-parallel 2 --no-zero1 --embedding-sync fused
    # tiny buckets: every chunk's last W (or backward) starts its own buckets while the rank's
    # other chunk still computes
    check il_dp2_tiny_buckets 4 single "${il[@]}" --data-parallel 2 --zero1 --bucket-mb 0.0005
    check zbv_dp2_tiny_buckets 4 single --pipeline-parallel 2 --schedule zb-v --data-parallel 2 --no-zero1 --bucket-mb 0.0005
    check zbv_p3_m3 3 single_l6_g6 --layers 6 --pipeline-parallel 3 --schedule zb-v --global-batch-size 6
fi

# a checkpoint written under one schedule continues under the others, and in one process
run il_half 2 "${il[@]}" --save-every 4
half=il_half/checkpoints/step_00000004
series single/metrics.jsonl | awk '$1 > 4' >single.tail
resume() { # name ranks flags...
    local name=$1 np=$2
    shift 2
    if [ "$np" -gt 1 ]; then
        timeout 300 mpirun -np "$np" "$LOOM" train "${common[@]}" --out "$name" --resume "$half" "$@" >"$name.log" 2>&1
    else
        "$LOOM" train "${common[@]}" --out "$name" --resume "$half" "$@" >"$name.log" 2>&1
    fi || { fail "$name: $(tail -3 "$name.log")"; return; }
    series "$name/metrics.jsonl" >"$name.series"
    if out=$(close_series single.tail "$name.series"); then ok; else fail "$name after resume: $out"; fi
    if out=$("$CMP" "$name/checkpoints/step_00000008/model.safetensors" single/checkpoints/step_00000008/model.safetensors 1e-5 2>&1); then ok; else fail "$name final parameters: $out"; fi
}
resume resume_il_as_zbv 2 --pipeline-parallel 2 --schedule zb-v
resume resume_il_as_single 1
if [ "$quick" != 1 ]; then
    resume resume_il_as_zbh1_dp2 4 --pipeline-parallel 2 --schedule zb-h1 --data-parallel 2
    resume resume_il_same 2 "${il[@]}"
    run il_full 2 "${il[@]}"
    if cmp -s il_full/checkpoints/step_00000008/model.safetensors resume_il_same/checkpoints/step_00000008/model.safetensors; then
        ok
    else
        fail "resume under the same interleaved layout is not bit-exact"
    fi
fi

# a plan file with virtual stages: the ranks and uneven chunks it names run as written
cat >plan_zbv.json <<'PLAN'
{"model": {"layers": 6, "heads": 2, "d_model": 16, "context": 16, "vocab": 257},
 "batch": {"global": 8, "micro": 2, "schedule": "zb-v", "virtual_stages": 2},
 "mesh": {"dp": 1, "tp": 1, "pp": 2},
 "stages": [{"layers": [0, 1], "rank": 0, "embedding": true},
            {"layers": [1, 3], "rank": 1},
            {"layers": [3, 5], "rank": 1},
            {"layers": [5, 6], "rank": 0, "head": true}]}
PLAN
plan_common=(--data 'data/train_*.bin' --val-data 'data/val_*.bin' --steps 8 --seq-len 16
    --lr 3e-3 --warmup-steps 2 --eval-every 4 --eval-batches 2 --threads 1 --log-every 100
    --comm-timeout 60)
if timeout 300 mpirun -np 2 "$LOOM" train "${plan_common[@]}" --out plan_zbv --plan plan_zbv.json >plan_zbv.log 2>&1; then
    ok
else
    fail "plan_zbv: $(grep -m2 -i error plan_zbv.log)"
fi
compare_run plan_zbv single_l6

# ---- compression on every schedule ----
comp_common=(--pp-compression lowrank --pp-compression-rank 4 --log-every 1)
# interleaved p 2 v 2: 3 boundaries cross ranks, each with m = 4 gradient sends per step; low-rank
# rank 4 sends P (32 x 4) and Q (16 x 4) floats instead of 32 x 16
if run il_lowrank 2 "${il[@]}" "${comp_common[@]}"; then
    sent=$(metric il_lowrank 8 pp_grad_bytes) raw=$(metric il_lowrank 8 pp_grad_bytes_raw)
    [ "$sent" = $((3 * 4 * 4 * 4 * (32 + 16))) ] && ok || fail "interleaved lowrank: sent $sent"
    [ "$raw" = $((3 * 4 * 4 * 32 * 16)) ] && ok || fail "interleaved lowrank: raw $raw"
fi
# zb-v p 2: boundaries 0 and 2 cross ranks, boundary 1 is rank 1's hand-over (no message)
if run zbv_lowrank 2 --pipeline-parallel 2 --schedule zb-v "${comp_common[@]}"; then
    [ "$(metric zbv_lowrank 8 pp_grad_sends)" = 8 ] && ok || fail "zb-v: $(metric zbv_lowrank 8 pp_grad_sends) gradient sends, expected 2 x 4"
fi
if [ "$quick" != 1 ]; then
# epilogue under zb-h1 is 1F1B's cool-down (its warm-up is 1F1B's): stage s of p sends its last
# min(p - s, m) gradients after its last forward: 3 + 2 + 1 at p = 4, m = 4
if run zbh1_epilogue 4 --pipeline-parallel 4 --schedule zb-h1 "${comp_common[@]}" --pp-compression-rank 2 --pp-compression-policy epilogue; then
    [ "$(metric zbh1_epilogue 8 pp_grad_sends_compressed)" = 6 ] && ok || fail "zb-h1 epilogue: $(metric zbh1_epilogue 8 pp_grad_sends_compressed) compressed, expected 6"
fi
# epilogue and slack under interleaved and zb-v: both ends of every message agree (a
# disagreement ends the run on a message of the wrong length); slack compresses everything on
# step 1 (nothing measured yet)
for sched in interleaved zb-v; do
    for policy in epilogue slack; do
        name=${sched}_$policy
        run "$name" 2 --pipeline-parallel 2 --schedule "$sched" "${comp_common[@]}" --pp-compression-policy "$policy" || continue
        all=$(metric "$name" 1 pp_grad_sends) n=$(metric "$name" 1 pp_grad_sends_compressed)
        if [ "$policy" = slack ]; then
            [ "$n" = "$all" ] && ok || fail "$name: step 1 compressed $n of $all"
        else
            [ "$n" -gt 0 ] && [ "$n" -lt "$all" ] && ok || fail "$name: $n of $all sends in the cool-down"
        fi
    done
done
fi
# exact resume with DP PowerSGD and pipeline low-rank compression under zb-v and interleaved
# (every chunk keeps its own lazy-error residual)
resume_schedules=(zb-v interleaved)
[ "$quick" = 1 ] && resume_schedules=(zb-v)
for sched in "${resume_schedules[@]}"; do
    comp=(--data-parallel 2 --pipeline-parallel 2 --schedule "$sched" --dp-compression powersgd
        --dp-compression-rank 2 "${comp_common[@]}")
    if run "full_$sched" 4 "${comp[@]}" --save-every 4 &&
        run "resumed_$sched" 4 "${comp[@]}" --resume "full_$sched/checkpoints/step_00000004"; then
        same=1
        for st in 5 6 7 8; do
            [ "$(metric "full_$sched" $st loss)" = "$(metric "resumed_$sched" $st loss)" ] || same=0
        done
        [ $same = 1 ] && ok || fail "$sched: resumed losses differ from the uninterrupted run's"
        cmp -s "full_$sched/checkpoints/step_00000008/model.safetensors" "resumed_$sched/checkpoints/step_00000008/model.safetensors" &&
            ok || fail "$sched: resumed final weights differ"
    fi
done

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
refused interleaved_m3 "multiple of" 2 "${il[@]}" --micro-batch-size 1 --global-batch-size 3
refused zbv_v3 "virtual" 2 --pipeline-parallel 2 --schedule zb-v --virtual-stages 3

finish
