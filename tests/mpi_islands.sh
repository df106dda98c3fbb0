#!/usr/bin/env bash
# Islands (DiLoCo-style training; --islands K) against independent references:
#  - one island with outer SGD at lr 1 and momentum 0 is plain training (the outer step puts back the
#    parameters it measured), in every layout kind inside the island (one process, dp 2 with ZeRO 0,
#    1 and 3, tp 2, pp 2 with 1F1B and ZB-V; GPipe, ZB-H1 and interleaved in the full matrix), with 1
#    and 2 fragments, and with the sync overlapped with 2 inner steps: losses, grad norms and
#    validation losses as one plain process's;
#  - K islands fed the same data (a test hook) are one island: the outer average of K equal outer
#    gradients is that gradient, so 2 islands (of 1 rank, and of dp 2) with Nesterov equal one
#    island with the islands' batch, and so do 2 islands of tp 2 and of interleaved pp 2 (2
#    fragments, overlapped; both in the full matrix); so do top-k outer gradients keeping every entry (inside
#    islands of dp 2, over 2 fragments, overlapped), and PowerSGD's shared by an island's 2
#    replicas equal one replica's;
#  - each fragment syncs at exactly its steps (outer_syncs per step), the progress line names the
#    round and the islands' mean loss +- spread as metrics.jsonl has them, islands on their own data
#    differ (a spread of losses) and send only at syncs, int8 outer gradients send about a
#    quarter of fp32's bytes, PowerSGD's and top-k's far fewer;
#  - a resume from an islands checkpoint mid-round, with a sync in flight and int8 error
#    feedback, continues bit for bit (islands of 1 rank, of dp 2 with ZeRO-3, of pp 2; PowerSGD
#    and top-k outer gradients' compressors); another
#    island count or layout restarts the round with a warning (the global state resharded); a run without islands refuses it;
#    validation scores the global model (`loom eval` of the checkpoint's), not an island's;
#  - a lost or hung island ends the job within the timeout, naming the rank;
#  - what islands cannot do is refused by name.
# usage: bash tests/mpi_islands.sh LOOM_BINARY TMPDIR
# LOOM_SANITIZED=1 / LOOM_TEST_QUICK=1 run a representative subset.
set -u
LOOM=$1
TMP=$2
. "$(cd "$(dirname "$0")" && pwd)/mpi_harness.bash"
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1

prepare_corpus

common=(--model tiny --layers 4 --heads 4 --data 'data/train_*.bin' --val-data 'data/val_*.bin'
    --steps 9 --seq-len 16 --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --warmup-steps 2
    --eval-every 3 --eval-batches 2 --threads 1 --log-every 100 --comm-timeout 60 --no-save)
identity=(--islands 1 --inner-steps 3 --outer-optimizer sgd --outer-lr 1 --outer-momentum 0)

# same NAME REFERENCE [train]: losses, grad norms and (unless "train") validation losses as
# close_series says. Islands validate the global model (the round starts), which is the
# trained one only right after a sync of every fragment: validation is compared with one
# fragment and --eval-every a multiple of the inner steps.
same() {
    series "$2/metrics.jsonl" >"$2.series"
    series "$1/metrics.jsonl" >"$1.series"
    if out=$(close_series "$2.series" "$1.series"); then ok; else fail "$1 differs from $2: $out"; fi
    [ "${3:-}" = train ] && return
    vseries "$2/metrics.jsonl" >"$2.vseries"
    vseries "$1/metrics.jsonl" >"$1.vseries"
    if out=$(close_series "$2.vseries" "$1.vseries"); then ok; else fail "$1 validation differs from $2: $out"; fi
}

# syncs RUN: the steps whose record says an outer sync ran, "2 4 6 8"
syncs() { jq -r 'select(has("outer_syncs") and .outer_syncs > 0) | .step' "$1/metrics.jsonl" | tr '\n' ' '; }

# exact NAME FULL: NAME, resumed from FULL's step-6 checkpoint, trains steps 7-9 as FULL did,
# bit for bit (losses, grad norms, islands' losses, validation)
exact() {
    jq -c 'select(.step > 6) | [.step, .loss, .grad_norm, .islands_losses, .val_loss]' \
        "$2/metrics.jsonl" >"$1.want"
    jq -c 'select(.step > 6) | [.step, .loss, .grad_norm, .islands_losses, .val_loss]' \
        "$1/metrics.jsonl" >"$1.got"
    if [ -s "$1.want" ] && cmp -s "$1.want" "$1.got"; then ok; else fail "$1 after resume: $(diff "$1.want" "$1.got" | head -4)"; fi
}

# refused NAME RANKS MESSAGE FLAGS...: the run ends with exit 2 and the message
refused() {
    local name=$1 np=$2 message=$3
    shift 3
    timeout 120 mpirun -np "$np" "$LOOM" train "${common[@]}" --out "$name" "$@" >"$name.log" 2>&1
    local rc=$?
    if [ "$rc" -eq 2 ] && grep -qF -- "$message" "$name.log"; then
        ok
    else
        fail "$name: expected exit 2 and '$message', got exit $rc: $(grep -m2 -i 'error' "$name.log")"
    fi
}

single plain
# ---- one island with the identity outer step is plain training ----
single one "${identity[@]}"
same one plain
# overlapped: the result lands 2 steps after the send, on top of the island's progress since
single one_tau "${identity[@]}" --outer-fragments 2 --outer-overlap-steps 2
same one_tau plain train
if [ "$core_only" != 1 ]; then
    single one_f2 "${identity[@]}" --outer-fragments 2
    same one_f2 plain train
    if [ "$(syncs one_f2)" = "1 3 4 6 7 9 " ]; then ok; else fail "one_f2: syncs at steps $(syncs one_f2), expected 1 3 4 6 7 9 (fragment 1 at 1, 4, 7; fragment 0 at 3, 6, 9)"; fi
fi
# (the sanitizer phase's quick core: ZeRO-3, whose shard and whole-held units the outer step
# updates; every layout kind in the release run)
layouts=("dp2_zero3:2:--data-parallel 2 --zero 3")
[ "$core_only" = 1 ] || layouts+=("dp2_zero0:2:--data-parallel 2 --zero 0" "pp2:2:--pipeline-parallel 2"
    "dp2_zero1:2:--data-parallel 2 --zero 1"
    "tp2:2:--tensor-parallel 2" "zbv:2:--pipeline-parallel 2 --schedule zb-v --micro-batch-size 1"
    "dp2_pp2:4:--data-parallel 2 --pipeline-parallel 2 --zero 2")
# (the other schedules, the full matrix's)
[ "$quick" = 1 ] || layouts+=("gpipe:2:--pipeline-parallel 2 --schedule gpipe"
    "zbh1:2:--pipeline-parallel 2 --schedule zb-h1" "interleaved:2:--pipeline-parallel 2 --schedule interleaved --micro-batch-size 1")
for l in "${layouts[@]}"; do
    IFS=: read -r name np flags <<<"$l"
    read -r -a f <<<"$flags"
    run "one_$name" "$np" "${identity[@]}" "${f[@]}" && same "one_$name" plain
    [ "$core_only" = 1 ] && continue
    # (the representative run: fragments on ZeRO-3's shards and on a pipeline with dp)
    [ "$quick" = 1 ] && [ "$name" != dp2_zero3 ] && [ "$name" != dp2_pp2 ] && continue
    run "one_${name}_f2" "$np" "${identity[@]}" --outer-fragments 2 "${f[@]}" &&
        same "one_${name}_f2" plain train
done

# ---- islands on the same data are one island ----
nesterov=(--inner-steps 3)
single ref_one --islands 1 "${nesterov[@]}"
# (the validation windows are --eval-batches global batches: the islands' batch is twice as large)
LOOM_DEBUG_ISLANDS_SAME_DATA=1 run same2 2 --islands 2 "${nesterov[@]}" --global-batch-size 8 \
    --eval-batches 1 && same same2 ref_one
if [ "$core_only" != 1 ]; then
    LOOM_DEBUG_ISLANDS_SAME_DATA=1 run same2_dp2 4 --islands 2 --data-parallel 2 "${nesterov[@]}" \
        --global-batch-size 8 --eval-batches 1 && same same2_dp2 ref_one
fi
if [ "$core_only" != 1 ]; then
    single ref_one_tau --islands 1 "${nesterov[@]}" --outer-overlap-steps 1
    LOOM_DEBUG_ISLANDS_SAME_DATA=1 run same2_tau 2 --islands 2 "${nesterov[@]}" --outer-overlap-steps 1 \
        --global-batch-size 8 --eval-batches 1 && same same2_tau ref_one_tau train
    # top-k keeping every entry sends the islands' outer gradients whole (values and indices,
    # summed in island order): two equal ones average to that one; here inside islands of dp 2
    # (each replica compresses its share of each fragment's matrices), over 2 fragments whose
    # rounds run behind a step
    single ref_one_f2_tau --islands 1 "${nesterov[@]}" --outer-fragments 2 --outer-overlap-steps 1
    LOOM_DEBUG_ISLANDS_SAME_DATA=1 run same2_topk 4 --islands 2 --data-parallel 2 "${nesterov[@]}" \
        --outer-fragments 2 --outer-overlap-steps 1 --outer-compression topk \
        --outer-topk-fraction 1 --global-batch-size 8 --eval-batches 1 &&
        same same2_topk ref_one_f2_tau train
    # PowerSGD's arithmetic does not depend on how an island's replicas share its matrices: dp 2
    # (ZeRO-1) as dp 1, and each island sends every matrix once (the shares' bytes add up to one
    # rank's)
    psgd=(--outer-compression powersgd --outer-compression-rank 2 --outer-fragments 2
        --outer-overlap-steps 1 --global-batch-size 8 --eval-batches 1)
    LOOM_DEBUG_ISLANDS_SAME_DATA=1 run same2_psgd 2 --islands 2 "${nesterov[@]}" "${psgd[@]}" &&
        LOOM_DEBUG_ISLANDS_SAME_DATA=1 run same2_psgd_dp2 4 --islands 2 --data-parallel 2 --zero 1 \
            "${nesterov[@]}" "${psgd[@]}" && same same2_psgd_dp2 same2_psgd train &&
        a=$(jq -s '[.[] | .outer_bytes // 0] | add' same2_psgd/metrics.jsonl) &&
        b=$(jq -s '[.[] | .outer_bytes // 0] | add' same2_psgd_dp2/metrics.jsonl) &&
        # (less the start check's two all-reduces of 2 doubles, 32 bytes a rank, on 2 more ranks)
        if [ "$a" -gt 0 ] && [ $((b - 64)) = "$a" ]; then ok; else fail "same2_psgd_dp2: $b outer bytes, dp 1 sent $a"; fi
    # islands composed with tensor and pipeline parallelism: the outer step pairs each rank
    # with the ranks of the same coordinates in the other islands (tp 2: each its own shard of
    # the matrices; interleaved pp 2: each its two chunks, fragments grouping their layers)
    # (the full matrix's: 4 ranks each)
    if [ "$quick" != 1 ]; then
        LOOM_DEBUG_ISLANDS_SAME_DATA=1 run same2_tp2 4 --islands 2 --tensor-parallel 2 \
            "${nesterov[@]}" --global-batch-size 8 --eval-batches 1 && same same2_tp2 ref_one
        LOOM_DEBUG_ISLANDS_SAME_DATA=1 run same2_pp2i 4 --islands 2 --pipeline-parallel 2 \
            --schedule interleaved --micro-batch-size 1 "${nesterov[@]}" --outer-fragments 2 \
            --outer-overlap-steps 1 --global-batch-size 8 --eval-batches 1 &&
            same same2_pp2i ref_one_f2_tau train
    fi
fi
# and the outer step is not the identity here: Nesterov moves past the islands' mean
if ! cmp -s plain.series ref_one.series 2>/dev/null && [ -s ref_one.series ]; then ok; else fail "ref_one: Nesterov's outer step left training as plain"; fi

# ---- islands on their own data ----
if run own2 2 --islands 2 --inner-steps 4 --outer-fragments 2; then
    if [ "$(syncs own2)" = "2 4 6 8 " ]; then ok; else fail "own2: syncs at $(syncs own2), expected 2 4 6 8"; fi
    # every island's loss: island 0's is the lead's, their mean the islands' loss
    if jq -s -e '[.[] | select(.step == 3 and has("loss")) | (.islands_losses | length) == 2 and
        .islands_losses[0] == .loss and
        ((.islands_losses | add) / 2 - .islands_loss | if . < 0 then -. else . end) < 1e-6 * .loss] |
        length == 1 and all' own2/metrics.jsonl >/dev/null; then
        ok
    else
        fail "own2: islands' losses $(jq -c 'select(.step == 3 and has("loss")) | [.loss, .islands_loss, .islands_losses]' own2/metrics.jsonl)"
    fi
    # each island's step time (island 0's is the lead's, its sync included) and time blocked in
    # the sync of step 4 (their mean is a rank's)
    if jq -s -e '[.[] | select(.step == 4 and has("loss")) | (.islands_ms | length) == 2 and
        ((.islands_ms[0] - .ms) | if . < 0 then -. else . end) < 1e-6 * .ms and
        (.islands_ms | min) > 0 and
        (.islands_outer_s | length) == 2 and .outer_s > 0 and (.islands_outer_s | min) > 0 and
        ((.islands_outer_s | add) / 2 - .outer_s | if . < 0 then -. else . end) < 1e-6 * .outer_s] |
        length == 1 and all' own2/metrics.jsonl >/dev/null; then
        ok
    else
        fail "own2: islands' times $(jq -c 'select(.step == 4 and has("loss")) | [.ms, .outer_s, .islands_ms, .islands_outer_s]' own2/metrics.jsonl)"
    fi
    spread=$(metric own2 3 islands_loss_spread)
    if awk -v s="$spread" 'BEGIN { exit !(s > 0) }'; then ok; else fail "own2: islands on their own data have the same loss (spread $spread)"; fi
    quiet=$(metric own2 3 outer_bytes) sent=$(metric own2 4 outer_bytes) raw=$(metric own2 4 outer_bytes_raw)
    if [ "$quiet" = 0 ] && [ "$sent" -gt 0 ] && [ "$sent" = "$raw" ]; then ok; else fail "own2: outer bytes at step 3 $quiet (expected 0), step 4 $sent (expected fp32's $raw)"; fi
    # what rank 0 prints: the islands at start-up, and on the last step's progress line the
    # round (step 9 of H 4: round 3) and the islands' mean loss +- their spread as
    # metrics.jsonl has them (within the line's 4 decimals)
    want=$(jq -r 'select(.step == 9 and has("loss")) | "\(.islands_loss) \(.islands_loss_spread)"' own2/metrics.jsonl)
    got=$(grep -o "step      9/9 .*" own2.log | grep -o "round .*")
    if [ -n "$got" ] && [ -n "$want" ] && awk -v a="$got" -v b="$want" 'BEGIN { split(a, x, " "); split(b, y, " ");
        d = x[5] - y[1]; e = x[7] - y[2]; if (d < 0) d = -d; if (e < 0) e = -e;
        exit !(x[2] == "3," && d < 1e-4 && e < 1e-4) }' &&
        grep -q "islands: 2 of 1 rank each; a round is 4 inner steps, then outer nesterov (lr 0.7, momentum 0.9) over 2 fragments, outer gradients none; outer state [0-9.]* MiB a rank" own2.log; then
        ok
    else
        fail "own2: the progress line says '$got', metrics.jsonl '$want' (or no islands line at start-up)"
    fi
fi
if run own2_int8 2 --islands 2 --inner-steps 4 --outer-fragments 2 --outer-compression int8; then
    sent=$(metric own2_int8 4 outer_bytes) raw=$(metric own2_int8 4 outer_bytes_raw)
    # int8 with one fp32 scale per 256 entries: (1 + 4/256) / 4 of fp32's
    if awk -v s="$sent" -v r="$raw" 'BEGIN { x = s / r; exit !(x > 0.25 && x < 0.26) }'; then ok; else fail "own2_int8: $sent of fp32's $raw bytes"; fi
fi
# with 4 islands the quarter holds only if int8 travels as int8 through the reduction (reduce-
# scatter and all-gather, as the fp32 ring's 2 (K - 1) / K of the model a rank): int8 gathered
# whole to every island would send (K - 1) of it, half of fp32's bytes
# (the full matrix's; acceptance 14-islands-bytes measures the same at 4 islands of `small`)
if [ "$quick" != 1 ] && run own4_int8 4 --islands 4 --inner-steps 4 --outer-compression int8 \
    --global-batch-size 8 --eval-batches 1 --steps 4; then
    sent=$(metric own4_int8 4 outer_bytes) raw=$(metric own4_int8 4 outer_bytes_raw)
    if awk -v s="$sent" -v r="$raw" 'BEGIN { x = s / r; exit !(x > 0.25 && x < 0.26) }'; then ok; else fail "own4_int8: $sent of fp32's $raw bytes"; fi
fi

if [ "$core_only" != 1 ] && run own2_psgd 4 --islands 2 --inner-steps 4 --data-parallel 2 --zero 3 \
    --outer-fragments 2 --outer-compression powersgd --outer-compression-rank 2 --global-batch-size 8; then
    sent=$(metric own2_psgd 4 outer_bytes) raw=$(metric own2_psgd 4 outer_bytes_raw)
    last=$(jq -r 'select(has("loss")) | .loss' own2_psgd/metrics.jsonl | tail -1)
    first=$(jq -r 'select(has("loss")) | .loss' own2_psgd/metrics.jsonl | head -1)
    # rank 2 of 4-layer tiny's matrices, its 1-D tensors whole: about a fifth of fp32's (islands
    # of dp 2 with ZeRO-3: the replicas' shares of the matrices)
    if awk -v s="$sent" -v r="$raw" -v a="$first" -v b="$last" 'BEGIN { exit !(s > 0 && s < r / 4 && b < a) }'; then ok; else fail "own2_psgd: $sent of fp32's $raw bytes, loss $first -> $last"; fi
fi

# ---- outer state memory: as the memory model predicts it, per rank ----
for r in own2 own2_int8 one_tau one_dp2_zero3; do
    [ -f "$r/memory.json" ] || continue
    if jq -e '[.ranks[] | .outer > 0 and .outer == .predicted.outer] | all' "$r/memory.json" >/dev/null; then
        ok
    else
        fail "$r: outer state $(jq -c '[.ranks[] | [.outer, .predicted.outer]]' "$r/memory.json") (measured, predicted)"
    fi
done
# PowerSGD's state inside islands of dp 2: each replica its share of the matrices' (unequal:
# whole buckets), the model their mean
if [ "$core_only" = 1 ]; then
    :
elif jq -e '[.ranks[] | .predicted.outer] as $p | [.ranks[] | .outer] | add == ($p | add) and all(. > 0)' own2_psgd/memory.json >/dev/null 2>&1; then
    ok
else
    fail "own2_psgd: outer state $(jq -c '[.ranks[] | [.outer, .predicted.outer]]' own2_psgd/memory.json 2>&1) (measured, predicted: equal sums)"
fi
# 3 buffers of 4 bytes a parameter; int8's residual a fourth
p=$(jq '.ranks[0].outer' own2/memory.json 2>/dev/null)
q=$(jq '.ranks[0].outer' own2_int8/memory.json 2>/dev/null)
if [ -n "$p" ] && [ -n "$q" ] && [ $((p / 3 * 4)) -eq "$q" ]; then ok; else fail "outer state: none $p, int8 $q bytes (expected 3:4)"; fi

# ---- a lost or hung island ends the job within the timeout, naming its rank ----
if [ "$core_only" != 1 ]; then
    for mode in exit hang; do
        begin=$(date +%s)
        LOOM_DEBUG_FAIL="1:3:$mode" timeout 120 mpirun -np 2 "$LOOM" train "${common[@]}" \
            --islands 2 --inner-steps 2 --out "lost_$mode" --comm-timeout 3 >"lost_$mode.log" 2>&1
        code=$?
        elapsed=$(($(date +%s) - begin))
        # (a hung rank names its island; a rank that exits is named by mpirun)
        named="rank 1\]|\],1\]|ranks 0,1"
        [ "$mode" = hang ] && named="this rank \(island 1\) hangs"
        if [ "$code" -ne 0 ] && [ "$code" -ne 124 ] && [ "$elapsed" -lt 30 ] &&
            grep -v "warning:" "lost_$mode.log" | grep -q -E "$named"; then
            ok
        else
            fail "island 1 $mode: exit $code after ${elapsed}s: $(grep -i -E 'error|rank 1' "lost_$mode.log" | head -3)"
        fi
    done
fi

# ---- refusals ----
# ---- checkpoints: a bit-exact resume mid-round, with a sync in flight ----
# H 4 over 2 fragments (fragment 1 syncs after steps 2 and 6, fragment 0 after 4 and 8), each
# sync landing a step after it left, int8 outer gradients with error feedback: the step-6
# checkpoint holds fragment 1's sync in flight, fragment 0 mid-round, and every island's own
# residual, parameters and moments.
ckpt=(--islands 2 --inner-steps 4 --outer-fragments 2 --outer-overlap-steps 1
    --outer-compression int8)
if run ck_full 2 "${ckpt[@]}" --save-every 6; then
    run ck_res 2 "${ckpt[@]}" --resume ck_full/checkpoints/step_00000006 && exact ck_res ck_full
    # validation measures the global model (the round starts), not an island's: step 6's
    # validation loss is `loom eval` of the checkpoint's model on the same 8 windows (2 batches
    # of 4), and island 0's own model scores otherwise (mid-round, they differ)
    v=$(metric ck_full 6 val_loss)
    g=$("$LOOM" eval --checkpoint ck_full/checkpoints/step_00000006 --data 'data/val_*.bin' \
        --seq-len 16 --max-windows 8 --threads 1 2>/dev/null | sed -n 's/^loss \([^ ]*\) .*/\1/p')
    i0=$("$LOOM" eval --checkpoint ck_full/checkpoints/step_00000006/island_0/model.safetensors \
        --data 'data/val_*.bin' --seq-len 16 --max-windows 8 --threads 1 2>/dev/null |
        sed -n 's/^loss \([^ ]*\) .*/\1/p')
    if awk -v v="$v" -v g="$g" -v i="$i0" 'BEGIN { d = v - g; e = v - i; if (d < 0) d = -d;
        if (e < 0) e = -e; exit !(v != "" && g != "" && i != "" && d < 2e-5 * v && e > 1e-3 * v) }'; then
        ok
    else
        fail "ck_full: step 6's validation $v, loom eval of the global model $g, of island 0's $i0"
    fi
    # a run without islands refuses it by name; another island count restarts the round
    refused ck_plain 1 "a checkpoint of island training" --resume ck_full/checkpoints/step_00000006
    if [ "$core_only" != 1 ]; then
        run ck_k1 1 --islands 1 --inner-steps 4 --resume ck_full/checkpoints/step_00000006 &&
            if grep -q "every island restarts the round from the global model" ck_k1.log; then ok; else fail "ck_k1: no warning that the round restarts"; fi
        # the global model is a model file like any other
        run ck_init 1 --init-from ck_full/checkpoints/step_00000006
    fi
fi
if [ "$core_only" != 1 ]; then
    # inside islands of dp 2 with ZeRO-3 (each rank's range of the global state, streamed) and
    # of pp 2 with bf16 outer gradients
    # (the full matrix's: the representative one resumes PowerSGD inside islands of dp 2 below)
    z3=(--islands 2 --inner-steps 4 --data-parallel 2 --zero 3 --outer-fragments 2
        --outer-compression int8 --global-batch-size 8)
    [ "$quick" = 1 ] || { run ck_z3 4 "${z3[@]}" --save-every 6 &&
        run ck_z3_res 4 "${z3[@]}" --resume ck_z3/checkpoints/step_00000006 && exact ck_z3_res ck_z3; }
    # another layout inside the islands restarts the round (a warning), and the global state
    # reshards like the model: the ZeRO-3 shards' outer momentum read back whole (dp 1) and in
    # ZeRO-1's halves (dp 2) trains alike (the step-8 sync applies it)
    re=(--islands 2 --inner-steps 4 --outer-fragments 2 --outer-compression int8
        --global-batch-size 8 --resume ck_z3/checkpoints/step_00000006)
    [ "$quick" = 1 ] || { run ck_z3_dp2 4 "${re[@]}" --data-parallel 2 --zero 1 &&
        run ck_z3_dp1 2 "${re[@]}" && same ck_z3_dp1 ck_z3_dp2 train &&
        if grep -q "every island restarts the round" ck_z3_dp1.log; then ok; else fail "ck_z3_dp1: no warning that the round restarts"; fi; }
    pp=(--islands 2 --inner-steps 4 --pipeline-parallel 2 --outer-compression bf16
        --outer-overlap-steps 2)
    [ "$quick" = 1 ] || { run ck_pp 4 "${pp[@]}" --save-every 6 &&
        run ck_pp_res 4 "${pp[@]}" --resume ck_pp/checkpoints/step_00000006 && exact ck_pp_res ck_pp; }
    # PowerSGD's and top-k's outer compressors (error feedback, PowerSGD's warm-start factors):
    # the step-4 sync's residuals shape the step-8 one; PowerSGD inside islands of dp 2 over 2
    # fragments, fragment 1's rounds in flight at the checkpoint
    for c in "psgd:4:--outer-compression powersgd --outer-compression-rank 2 --data-parallel 2 --outer-fragments 2 --outer-overlap-steps 1 --global-batch-size 8" \
        "topk:2:--outer-compression topk --outer-topk-fraction 0.05"; do
        IFS=: read -r name np flags <<<"$c"
        read -r -a f <<<"$flags"
        run "ck_$name" "$np" --islands 2 --inner-steps 4 "${f[@]}" --save-every 6 &&
            run "ck_${name}_res" "$np" --islands 2 --inner-steps 4 "${f[@]}" \
                --resume "ck_$name/checkpoints/step_00000006" && exact "ck_${name}_res" "ck_$name"
    done
    # top-k at 5 %: 8 bytes (value, index) an entry sent, so about a tenth of fp32's bytes
    sent=$(metric ck_topk 4 outer_bytes) raw=$(metric ck_topk 4 outer_bytes_raw)
    if awk -v s="$sent" -v r="$raw" 'BEGIN { x = s / r; exit !(x > 0.09 && x < 0.2) }'; then ok; else fail "ck_topk: $sent of fp32's $raw bytes"; fi
    if jq -e '[.ranks[] | .outer > 0 and .outer == .predicted.outer] | all' ck_topk/memory.json >/dev/null 2>&1; then ok; else fail "ck_topk: outer state $(jq -c '[.ranks[] | [.outer, .predicted.outer]]' ck_topk/memory.json 2>&1) (measured, predicted)"; fi
    # a checkpoint without islands starts every island from it (a data-parallel warm start)
    single ck_dp --save-every 6
    run ck_warm 2 --islands 2 --inner-steps 4 --resume ck_dp/checkpoints/step_00000006
fi

refused bad_ranks 3 "islands.count: expected islands x dp*tp*pp to equal the 3 ranks launched" \
    --islands 2 --data-parallel 1
[ "$core_only" = 1 ] || refused bad_h 2 "islands.inner_steps: expected at least 1 inner step a round, got -1" --islands 2 --inner-steps -1
[ "$core_only" = 1 ] || refused bad_fragments 2 "islands.fragments: expected 1 to 3 fragments" --islands 2 --inner-steps 3 --outer-fragments 4
[ "$core_only" = 1 ] || refused bad_topk 2 "--outer-topk-fraction: expected only with --outer-compression topk" \
    --islands 2 --outer-compression int8 --outer-topk-fraction 0.1
[ "$core_only" = 1 ] || refused bad_flag 2 "--outer-lr: expected only with --islands K" --outer-lr 0.5
if [ "$core_only" != 1 ]; then # the planner does not plan islands: said before it profiles
    timeout 60 mpirun -np 2 "$LOOM" train --plan auto --islands 2 --model tiny --seq-len 16 \
        --data 'data/train_*.bin' --steps 2 --threads 1 --no-save --out auto_islands >auto_islands.log 2>&1
    code=$?
    if [ "$code" -eq 2 ] && grep -qF -- "--plan auto: --islands: the planner does not plan islands yet" auto_islands.log; then
        ok
    else
        fail "auto_islands: exit $code, $(grep -m1 error auto_islands.log)"
    fi
fi
finish
