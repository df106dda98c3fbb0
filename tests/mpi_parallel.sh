#!/usr/bin/env bash
# Every parallel layout trains the same model as one process: data-parallel (2 and 4 ranks,
# ZeRO-1/2/3, gradient accumulation, tiny buckets), tensor-parallel (2 and 4 ways) and both
# combined must give the single-process losses, validation losses and grad norms within 1e-5
# relative at every step, the same final parameters within 1e-5, and bit-identical DP
# replicas; checkpoints move between layouts; a mismatched layout is a clear error.
# usage: bash tests/mpi_parallel.sh LOOM_BINARY TMPDIR COMPARE_WEIGHTS
# LOOM_TEST_QUICK=1 runs the core only (one run of each kind of layout, a resume, a refusal).
set -u
LOOM=$1
TMP=$2
CMP=$3
. "$(cd "$(dirname "$0")" && pwd)/mpi_harness.bash"
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1

prepare_corpus

common=(--model tiny --data 'data/train_*.bin' --val-data 'data/val_*.bin' --steps 8
    --seq-len 16 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --warmup-steps 2
    --eval-every 4 --eval-batches 2 --threads 1 --log-every 100 --comm-timeout 60)

"$LOOM" train "${common[@]}" --out single >single.log 2>&1 || fail "single-process run: $(tail -3 single.log)"

# run NAME RANKS FLAGS... and compare_run NAME [REFERENCE]: the harness's (mpi_harness.bash)

# resumed NAME RANKS CHECKPOINT_RUN flags...: resume CHECKPOINT_RUN's step-4 checkpoint on RANKS
# ranks with the flags; the losses after step 4 must be the single run's
resumed() {
    local name=$1 np=$2 from=$3
    shift 3
    if timeout 300 mpirun -np "$np" "$LOOM" train "${common[@]}" --out "$name" \
        --resume "$from/checkpoints/step_00000004" "$@" >"$name.log" 2>&1; then
        series single/metrics.jsonl | awk '$1 > 4' >single.tail
        series "$name/metrics.jsonl" >"$name.series"
        if out=$(close_series single.tail "$name.series"); then ok; else fail "$name after resume: $out"; fi
    else
        fail "$name: $(tail -3 "$name.log")"
    fi
}

# ---- the core: every kind of layout (DP with ZeRO-1, TP, PP, TP x DP, PP x DP), a resume
# across layouts, a layout refused. Under LOOM_TEST_QUICK=1 (scripts/test.sh's sanitizer phase)
# the script stops after it.

# ZeRO-1 is the default for dp > 1
run dp2_default 2
compare_run dp2_default
if grep -q "data parallel 2 with ZeRO-1" dp2_default.log; then ok; else fail "ZeRO-1 is not the default"; fi
# tensor parallelism, alone and with data parallelism (ZeRO-1, gradient accumulation)
run tp2 2 --tensor-parallel 2
compare_run tp2
run tp2_dp2_zero1 4 --tensor-parallel 2 --data-parallel 2 --zero1 --micro-batch-size 1
compare_run tp2_dp2_zero1
# pipeline parallelism, alone and with data parallelism
run pp2_1f1b 2 --pipeline-parallel 2
compare_run pp2_1f1b
run pp2_dp2 4 --pipeline-parallel 2 --data-parallel 2 --no-zero1
compare_run pp2_dp2
# resume a ZeRO-1 run under plain DP and under one process: same losses as continuing
run zero_half 2 --zero1 --save-every 4
if timeout 300 mpirun -np 2 "$LOOM" train "${common[@]}" --out resumed_dp --resume zero_half/checkpoints/step_00000004 >resumed_dp.log 2>&1 &&
    "$LOOM" train "${common[@]}" --out resumed_single --resume zero_half/checkpoints/step_00000004 >resumed_single.log 2>&1; then
    ok
    for r in resumed_dp resumed_single; do
        series single/metrics.jsonl | awk '$1 > 4' >single.tail
        series "$r/metrics.jsonl" >"$r.series"
        if out=$(close_series single.tail "$r.series"); then ok; else fail "$r after resume: $out"; fi
    done
else
    fail "resume runs: $(tail -3 resumed_dp.log resumed_single.log)"
fi

# ZeRO-2 (gradients sharded: a block's reduce-scatter per micro-batch as its backward ends, no
# full-size gradient buffer) with gradient accumulation; its checkpoint resumed under ZeRO-1 and
# under one process continues as the single run does
run zero2_accum 2 --zero 2 --micro-batch-size 1 --save-every 4
compare_run zero2_accum
if grep -q "data parallel 2 with ZeRO-2" zero2_accum.log; then ok; else fail "ZeRO-2 not reported: $(grep -m1 'ranks:' zero2_accum.log)"; fi
resumed zero2_resumed_zero1 2 zero2_accum --zero 1
resumed zero2_resumed_single 1 zero2_accum
# and a ZeRO-1 checkpoint resumed under ZeRO-2
resumed zero1_resumed_zero2 2 zero_half --zero 2

# ZeRO-3 (parameters sharded too: each block gathered before its forward and its backward, the
# next one prefetched): the same model, its checkpoint (gathered from the shards) the same final
# parameters, validation through the gathered blocks; a ZeRO-2 checkpoint resumed under ZeRO-3
# and a ZeRO-3 one under one process
run zero3_accum 2 --zero 3 --micro-batch-size 1 --save-every 4
compare_run zero3_accum
resumed zero2_resumed_zero3 2 zero2_accum --zero 3
resumed zero3_resumed_single 1 zero3_accum

# a layout that does not fit the launched ranks: exit 2 and the reason on every rank
timeout 120 mpirun -np 2 "$LOOM" train "${common[@]}" --out bad --data-parallel 4 >bad.log 2>&1
code=$?
if [ "$code" -eq 2 ] && [ "$(grep -c 'error: plan: mesh: expected dp\*tp\*pp to equal the 2 ranks launched' bad.log)" -eq 2 ]; then ok; else fail "mismatched layout: exit $code: $(tail -4 bad.log)"; fi
if [ "$core_only" = 1 ]; then
    finish
    exit
fi

# ---- the rest of the matrix ----

# plain data parallelism (--no-zero1): bucketed allreduces during backward
run dp2 2 --no-zero1 --trace overlap.trace.json
compare_run dp2
# the sync after the backward instead of during it (Megatron-LM's local DDP): the same numbers,
# and every gradient bucket starts after the step's last backward ends (with overlap, some
# start before it)
run dp2_no_overlap 2 --no-zero1 --no-overlap-grad-reduce --trace no_overlap.trace.json
compare_run dp2_no_overlap
python3 - overlap.trace.json no_overlap.trace.json <<'PY' && ok || fail "bucket starts against the last backward: see above"
import json, sys
def early_starts(path):
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = {}
    for e in events:
        if e.get("ph") != "X" or (e.get("args") or {}).get("step") is None:
            continue
        d = steps.setdefault((e.get("pid"), e["args"]["step"]), {"end": 0.0, "starts": []})
        if e["name"] == "backward":
            d["end"] = max(d["end"], e["ts"] + e["dur"])
        if e["name"] == "bucket start":
            d["starts"].append(e["ts"])
    starts = sum(len(d["starts"]) for d in steps.values())
    early = sum(1 for d in steps.values() for t in d["starts"] if t < d["end"])
    return starts, early
s0, e0 = early_starts(sys.argv[1])
s1, e1 = early_starts(sys.argv[2])
print(f"overlap: {e0} of {s0} bucket starts before the last backward ended; "
      f"no overlap: {e1} of {s1}")
sys.exit(0 if s0 > 0 and e0 > 0 and s1 > 0 and e1 == 0 else 1)
PY
run dp4 4 --no-zero1
compare_run dp4
run dp2_zero1 2 --zero1
compare_run dp2_zero1
run dp2_accum 2 --no-zero1 --micro-batch-size 1 --bucket-mb 0.001
compare_run dp2_accum
# (the representative matrix, LOOM_SANITIZED or LOOM_TEST_REPRESENTATIVE, keeps one 4-rank run
# of each ZeRO stage with tp; the rest of the 4-rank runs are the full matrix's)
if [ "$quick" != 1 ]; then
    run dp4_zero1_accum 4 --zero1 --micro-batches 2 --micro-batch-size 1
    compare_run dp4_zero1_accum
    # ZeRO-1's reduce-scatter runs bucket by bucket as a ring during backward: with tiny buckets
    # most of a bucket's blocks are empty on most ranks, and many rings are in flight at once
    run dp4_zero2_accum 4 --zero 2 --micro-batches 2 --micro-batch-size 1
    compare_run dp4_zero2_accum
fi
run tp2_dp2_zero2 4 --tensor-parallel 2 --data-parallel 2 --zero 2 --micro-batch-size 1
compare_run tp2_dp2_zero2
if [ "$quick" != 1 ]; then
    run pp2_dp2_zero2_recompute 4 --pipeline-parallel 2 --data-parallel 2 --zero 2 --recompute
    compare_run pp2_dp2_zero2_recompute
    run dp4_zero3_accum 4 --zero 3 --micro-batches 2 --micro-batch-size 1
    compare_run dp4_zero3_accum
fi
run tp2_dp2_zero3 4 --tensor-parallel 2 --data-parallel 2 --zero 3 --micro-batch-size 1
compare_run tp2_dp2_zero3
if [ "$quick" != 1 ]; then
    run pp2_dp2_zero3_recompute 4 --pipeline-parallel 2 --data-parallel 2 --zero 3 --recompute
    compare_run pp2_dp2_zero3_recompute
fi

# prefetch off, deeper, and gathering once per step
if [ "$quick" != 1 ]; then # (the representative run has prefetch 0 in dp2_zero3_ahead_p0)
    run dp2_zero3_no_prefetch 2 --zero 3 --zero3-prefetch 0 --micro-batch-size 1
    compare_run dp2_zero3_no_prefetch
fi
run dp2_zero3_step 2 --zero 3 --zero3-prefetch 3 --zero3-gather step --micro-batch-size 1
compare_run dp2_zero3_step
# the prefetch runs past a pass's end into the schedule's next pass, and the block a pass turns
# on stays: a training pass never waits for a block nobody gathered ahead but the step's first
# (each rank's zero3_just_in_time in memory.json, 8 steps, no validation); without prefetch it
# waits for every one
# just_in_time RUN EXPECT: EXPECT is "steps" (8 on every rank) or "all" (= zero3_gathers)
just_in_time() {
    local got
    got=$(jq -r --arg e "$2" '[.ranks[] | select(if $e == "all" then .zero3_just_in_time != .zero3_gathers
        else .zero3_just_in_time != 8 end) | "rank \(.rank): \(.zero3_just_in_time) of \(.zero3_gathers)"] | join(", ")' "$1/memory.json")
    if [ -z "$got" ]; then ok; else fail "$1: blocks gathered just in time: $got"; fi
}
ahead=(--zero 3 --micro-batch-size 1 --eval-every 0 --no-save)
run dp2_zero3_ahead 2 "${ahead[@]}" && just_in_time dp2_zero3_ahead steps
run dp2_zero3_ahead_p0 2 "${ahead[@]}" --zero3-prefetch 0 && just_in_time dp2_zero3_ahead_p0 all
if [ "$quick" != 1 ]; then
    for sched in 1f1b zb-v; do
        run "pp2_dp2_zero3_ahead_$sched" 4 "${ahead[@]}" --layers 4 --data-parallel 2 --pipeline-parallel 2 \
            --schedule $sched --recompute && just_in_time "pp2_dp2_zero3_ahead_$sched" steps
    done
    run il_dp2_zero3_ahead 4 "${ahead[@]}" --layers 4 --data-parallel 2 --pipeline-parallel 2 \
        --schedule interleaved --virtual-stages 2 && just_in_time il_dp2_zero3_ahead steps
fi
# a ZeRO-3 checkpoint resumed in another layout under ZeRO-3 (pipeline and tensor parallel)
resumed zero3_resumed_tp2 4 zero3_accum --data-parallel 2 --zero 3 --tensor-parallel 2
if [ "$quick" != 1 ]; then
    resumed zero3_resumed_pp2 4 zero3_accum --data-parallel 2 --zero 3 --pipeline-parallel 2
    run dp4_zero1_tiny_buckets 4 --zero1 --bucket-mb 0.0005
    compare_run dp4_zero1_tiny_buckets
    run pp2_dp2_zero1_tiny_buckets 4 --zero1 --bucket-mb 0.0005 --pipeline-parallel 2
    compare_run pp2_dp2_zero1_tiny_buckets
fi
# --micro-batches counts per replica after the implicit dp = world size: 2 ranks x 2 x micro 2
# is the global batch of 8 (the rule once ran before dp was known and halved it)
run dp2_micro_batches 2 --micro-batches 2
compare_run dp2_micro_batches
if grep -q "global batch 8 = micro 2 x 2 micro-batches x 2" dp2_micro_batches.log; then ok; else
    fail "--micro-batches 2 on 2 implicit replicas: $(grep -m1 'global batch' dp2_micro_batches.log)"
fi

# tensor parallelism, alone and with data parallelism
run tp2_dp2 4 --tensor-parallel 2 --data-parallel 2 --no-zero1
compare_run tp2_dp2
"$LOOM" train "${common[@]}" --heads 4 --out single_h4 >single_h4.log 2>&1 || fail "single 4-head run"
run tp4 4 --tensor-parallel 4 --heads 4
compare_run tp4 single_h4

# a checkpoint written under (dp 2, tp 2) continues under tp 2 and under one process
run tp2_dp2_half 4 --tensor-parallel 2 --data-parallel 2 --save-every 4
for layout in "2 --tensor-parallel 2" "1"; do
    set -- $layout
    np=$1
    shift
    r=resume_from_tp_np$np
    if [ "$np" -gt 1 ]; then
        timeout 300 mpirun -np "$np" "$LOOM" train "${common[@]}" --out "$r" --resume tp2_dp2_half/checkpoints/step_00000004 "$@" >"$r.log" 2>&1
    else
        "$LOOM" train "${common[@]}" --out "$r" --resume tp2_dp2_half/checkpoints/step_00000004 >"$r.log" 2>&1
    fi
    if [ $? -eq 0 ]; then
        series single/metrics.jsonl | awk '$1 > 4' >single.tail
        series "$r/metrics.jsonl" >"$r.series"
        if out=$(close_series single.tail "$r.series"); then ok; else fail "$r after resume: $out"; fi
        if out=$("$CMP" "$r/checkpoints/step_00000008/model.safetensors" single/checkpoints/step_00000008/model.safetensors 1e-5 2>&1); then ok; else fail "$r final parameters: $out"; fi
    else
        fail "$r: $(tail -3 "$r.log")"
    fi
done

# pipeline parallelism: both schedules, 1..8 micro-batches, uneven stages, with DP and TP
run pp2_gpipe 2 --pipeline-parallel 2 --schedule gpipe
compare_run pp2_gpipe
run pp2_mb8 2 --pipeline-parallel 2 --micro-batch-size 1
compare_run pp2_mb8
run pp2_tp2 4 --pipeline-parallel 2 --tensor-parallel 2
compare_run pp2_tp2
run pp2_tp2_dp2 8 --pipeline-parallel 2 --tensor-parallel 2 --data-parallel 2 --zero1
compare_run pp2_tp2_dp2
# fused embedding sync (one allreduce of the tied embedding over both ends of every replica)
# trains the same model as the separate sums, so as one process
run pp2_dp2_fused 4 --pipeline-parallel 2 --data-parallel 2 --no-zero1 --embedding-sync fused
compare_run pp2_dp2_fused
if [ "$quick" != 1 ]; then
    run pp2_tp2_dp2_fused 8 --pipeline-parallel 2 --tensor-parallel 2 --data-parallel 2 --zero1 --embedding-sync fused
    compare_run pp2_tp2_dp2_fused
fi

# --init-from under TP and PP: each rank reads only its slices of the file, and training goes on
# as one process does from the same weights
start=single/checkpoints/step_00000008/model.safetensors
"$LOOM" train "${common[@]}" --init-from "$start" --out single_init >single_init.log 2>&1 ||
    fail "single-process --init-from: $(tail -3 single_init.log)"
run init_tp2_pp2 4 --tensor-parallel 2 --pipeline-parallel 2 --init-from "$start"
compare_run init_tp2_pp2 single_init
run init_pp2_checkpoint 2 --pipeline-parallel 2 --init-from single
compare_run init_pp2_checkpoint single_init

# activation recomputation: all stages, or only those a plan file marks
run pp2_recompute 2 --pipeline-parallel 2 --micro-batch-size 1 --recompute
compare_run pp2_recompute
run pp2_gpipe_recompute 2 --pipeline-parallel 2 --schedule gpipe --recompute
compare_run pp2_gpipe_recompute
# one process recomputes too when asked (the same arithmetic: equal to the plain run)
"$LOOM" train "${common[@]}" --recompute --out single_recompute >single_recompute.log 2>&1 ||
    fail "single-process recompute run: $(tail -3 single_recompute.log)"
compare_run single_recompute
# "always" (Megatron's full recomputation) reruns the forward before every backward, even where
# the activations are still there (one stage: every backward follows its own forward, so as
# needed reruns none): the same numbers, and the trace shows each rerun
"$LOOM" train "${common[@]}" --recompute-always --trace always.trace.json --out single_always \
    >single_always.log 2>&1 || fail "single-process --recompute-always: $(tail -3 single_always.log)"
compare_run single_always
"$LOOM" train "${common[@]}" --recompute --steps 2 --trace needed.trace.json --out single_needed \
    >single_needed.log 2>&1 || fail "single-process --recompute (trace): $(tail -3 single_needed.log)"
reruns() { grep -o '"name": *"recompute"' "$1" | wc -l; }
# 8 steps x 4 micro-batches, and none as needed
if [ "$(reruns always.trace.json)" -eq 32 ] && [ "$(reruns needed.trace.json)" -eq 0 ]; then ok; else
    fail "recompute spans: always $(reruns always.trace.json) (expected 32), as needed $(reruns needed.trace.json) (expected 0)"
fi
run pp2_recompute_always 2 --pipeline-parallel 2 --micro-batch-size 1 --recompute-always
compare_run pp2_recompute_always
cat >plan_recompute.json <<'PLAN'
{"model": {"layers": 2, "heads": 2, "d_model": 16, "context": 16, "vocab": 257},
 "batch": {"global": 8, "micro": 2, "schedule": "1f1b"},
 "mesh": {"dp": 1, "tp": 1, "pp": 2},
 "stages": [{"layers": [0, 1], "embedding": true, "recompute": true},
            {"layers": [1, 2], "head": true}]}
PLAN
# with --plan, the flags that set what the plan sets (model, batch sizes) are left out
plan_common=(--data 'data/train_*.bin' --val-data 'data/val_*.bin' --steps 8 --seq-len 16
    --lr 3e-3 --warmup-steps 2 --eval-every 4 --eval-batches 2 --threads 1 --log-every 100
    --comm-timeout 60)
if timeout 300 mpirun -np 2 "$LOOM" train "${plan_common[@]}" --out pp2_plan_recompute \
    --plan plan_recompute.json >pp2_plan_recompute.log 2>&1; then ok; else
    fail "pp2_plan_recompute: exit $?: $(grep -m1 error pp2_plan_recompute.log)"
fi
compare_run pp2_plan_recompute
if grep -q "recompute" pp2_plan_recompute.log; then ok; else fail "plan recompute not reported"; fi

# the plan's mesh.zero (the planner writes it): followed unless a flag says otherwise
"$LOOM" plan --model tiny --dp 2 --micro-batch-size 2 --global-batch-size 8 --out plan_dp2.json >/dev/null
sed 's/"zero": 1}/"zero": 0}/' plan_dp2.json >plan_dp2_nozero1.json
if timeout 300 mpirun -np 2 "$LOOM" train "${plan_common[@]}" --out dp2_plan_nozero1 \
    --plan plan_dp2_nozero1.json >dp2_plan_nozero1.log 2>&1; then ok; else
    fail "dp2_plan_nozero1: exit $?: $(grep -m1 error dp2_plan_nozero1.log)"
fi
compare_run dp2_plan_nozero1
if grep -q '"zero": 0}' plan_dp2_nozero1.json && grep -q "ZeRO-1 off: the plan's mesh.zero" dp2_plan_nozero1.log; then ok; else
    fail "the plan's zero1 not followed: $(grep -m1 ZeRO dp2_plan_nozero1.log)"
fi

# three layers, micro-batches of 3 sequences: uneven stages, 1 and 3 micro-batches per step
l3=(--layers 3 --micro-batch-size 1 --global-batch-size 3)
"$LOOM" train "${common[@]}" "${l3[@]}" --out single_l3 >single_l3.log 2>&1 || fail "single 3-layer run"
run pp2_uneven_1f1b 2 "${l3[@]}" --pipeline-parallel 2 --stage-layers 1,2
compare_run pp2_uneven_1f1b single_l3
if [ "$quick" != 1 ]; then
    run pp2_uneven_gpipe 2 "${l3[@]}" --pipeline-parallel 2 --stage-layers 2,1 --schedule gpipe
    compare_run pp2_uneven_gpipe single_l3
fi
run pp3_mb1 3 --layers 3 --micro-batch-size 3 --global-batch-size 3 --pipeline-parallel 3
compare_run pp3_mb1 single_l3

# a checkpoint written under (dp 2, tp 2, pp 2) continues under (dp 1, tp 4, pp 2), under
# the same layout (bit-exact) and under one process
h4=(--heads 4)
run p222_full 8 "${h4[@]}" --data-parallel 2 --tensor-parallel 2 --pipeline-parallel 2
run p222_half 8 "${h4[@]}" --data-parallel 2 --tensor-parallel 2 --pipeline-parallel 2 --save-every 4
half=p222_half/checkpoints/step_00000004
run p222_resume_p142 8 "${h4[@]}" --tensor-parallel 4 --pipeline-parallel 2 --resume "$half"
run p222_resume_same 8 "${h4[@]}" --data-parallel 2 --tensor-parallel 2 --pipeline-parallel 2 --resume "$half"
"$LOOM" train "${common[@]}" "${h4[@]}" --out p222_resume_single --resume "$half" >p222_resume_single.log 2>&1 || fail "resume (2,2,2) in one process"
series single_h4/metrics.jsonl | awk '$1 > 4' >single_h4.tail
for r in p222_resume_p142 p222_resume_single p222_resume_same; do
    series "$r/metrics.jsonl" >"$r.series"
    if out=$(close_series single_h4.tail "$r.series"); then ok; else fail "$r after resume: $out"; fi
done
if cmp -s p222_full/checkpoints/step_00000008/model.safetensors p222_resume_same/checkpoints/step_00000008/model.safetensors &&
    cmp -s p222_full/checkpoints/step_00000008/state.safetensors p222_resume_same/checkpoints/step_00000008/state.safetensors; then
    ok
else
    fail "resume under the same (2,2,2) layout is not bit-exact"
fi

# --trace: one Chrome trace-event file for the job, a process per rank, the pipeline visible
run traced 4 --pipeline-parallel 2 --data-parallel 2 --trace traced/trace.json
if [ -s traced/trace.json ] && grep -q '"traceEvents"' traced/trace.json &&
    [ "$(grep -o '"name":"process_name"' traced/trace.json | wc -l)" -eq 4 ] &&
    grep -q '"send_act"' traced/trace.json && grep -q '"recv_grad"' traced/trace.json &&
    grep -q '"gradient sync (wait)"' traced/trace.json; then
    ok
else
    fail "trace file: $(head -c 300 traced/trace.json)"
fi

# a rank that dies or hangs mid-training ends the whole job, non-zero, within the timeout,
# and the messages name the rank
for mode in exit hang; do
    start=$(date +%s)
    LOOM_DEBUG_FAIL="1:3:$mode" timeout 120 mpirun -np 2 "$LOOM" train "${common[@]}" --out "fail_$mode" --comm-timeout 3 >"fail_$mode.log" 2>&1
    code=$?
    elapsed=$(($(date +%s) - start))
    if [ "$code" -ne 0 ] && [ "$code" -ne 124 ] && [ "$elapsed" -lt 30 ] && grep -q -E "rank 1|\],1\]" "fail_$mode.log"; then
        ok
    else
        fail "rank 1 $mode: exit $code after ${elapsed}s: $(grep -i -E 'error|rank 1' "fail_$mode.log" | head -3)"
    fi
done

# every event lies within the run: timestamps from 0 (the barrier before training) up to the
# run's length, and each rank's pipeline actions in order (an origin subtracted twice, or a
# wrong clock, puts them far outside)
if python3 - traced/trace.json <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
ts = [e["ts"] for e in ev]
ok = ev and min(ts) >= 0 and max(ts) < 600e6
sys.exit(0 if ok else 1)
PY
then ok; else fail "trace timestamps outside the run"; fi

# replicas that stop agreeing end the job with an error naming them (the invariant compression
# will rely on); LOOM_DEBUG_DIVERGE changes one parameter on replica 1 before the check
LOOM_DEBUG_DIVERGE=1 timeout 120 mpirun -np 2 "$LOOM" train "${common[@]}" --out diverged \
    >diverged.log 2>&1
code=$?
if [ "$code" -ne 0 ] && grep -q "data-parallel replicas differ: replica(s) 1 " diverged.log; then ok; else
    fail "diverged replicas: exit $code: $(grep -m2 -i -E 'error|replica' diverged.log)"
fi

# a plan's compression is executed: int8 gradients and bf16 activations between the stages
sed 's/"mesh"/"compression": {"pp": {"method": "int8", "forward": "bf16"}}, "mesh"/' \
    plan_recompute.json >plan_compressed.json
timeout 120 mpirun -np 2 "$LOOM" train "${plan_common[@]}" --plan plan_compressed.json \
    --out compressed >compressed.log 2>&1
code=$?
if [ "$code" -eq 0 ] && grep -q "compression: dp none, pp int8" compressed.log &&
    jq -s -e 'any(.[]; .pp_grad_sends_compressed == 4)' compressed/metrics.jsonl >/dev/null; then
    ok
else
    fail "plan with compression: exit $code: $(grep -m1 error compressed.log)"
fi

# SIGTERM reaching one rank (as a scheduler's preemption does) stops every rank after the same
# step: they save one checkpoint together and exit 0, and the run resumes from it
mpirun -np 2 "$LOOM" train "${common[@]}" --steps 100000 --eval-every 0 --log-every 1 \
    --pipeline-parallel 2 --out sigterm >sigterm.log 2>&1 &
job=$!
for _ in $(seq 1 200); do grep -q "step  *3/" sigterm.log 2>/dev/null && break; sleep 0.1; done
victim=$(pgrep -P $job -x loom | sed -n 2p)
[ -n "$victim" ] && kill -TERM "$victim"
timeout 60 tail --pid=$job -f /dev/null
wait $job
code=$?
if [ -n "$victim" ] && [ "$code" -eq 0 ] && grep -q "stopping after step" sigterm.log &&
    [ -f sigterm/checkpoints/latest ]; then ok; else
    fail "SIGTERM to rank 1: exit $code, victim '$victim': $(grep -m2 -iE 'error|stopping' sigterm.log)"
fi
saved=$(sed 's/step_0*//' sigterm/checkpoints/latest 2>/dev/null)
if timeout 120 mpirun -np 2 "$LOOM" train "${common[@]}" --steps $((saved + 1)) --eval-every 0 \
    --pipeline-parallel 2 --resume sigterm --out sigterm >sigterm_resume.log 2>&1; then ok; else
    fail "resume after SIGTERM: $(grep -m1 error sigterm_resume.log)"
fi

finish
