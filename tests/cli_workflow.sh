#!/usr/bin/env bash
# cli_workflow.sh — the happy path of the `loom` command end to end on a generated text of about
# 50 KB: prepare -> train (tiny model, checkpoints and validation every 3 steps) -> the files a
# run writes -> sample -> eval -> resume. A run stopped after 3 steps and resumed to 6 must log
# byte-identical losses and gradient norms, and save byte-identical checkpoints, to a run of 6
# steps without a stop (same thread count), with exactly one metrics record per step.
#
# usage: bash tests/cli_workflow.sh LOOM_BINARY TMPDIR   (TMPDIR is emptied first)
source "$(dirname "$0")/cli_harness.bash" "$@"

# run NAME LOG COMMAND...: the command must exit 0 without a crash report; output goes to LOG
# (stdout) and LOG.err (stderr).
run() {
    local name=$1 log=$2
    shift 2
    "$@" >"$log" 2>"$log.err" </dev/null
    local rc=$? why=""
    if crashed "$rc" "$log.err"; then
        why="crashed (exit $rc)"
    elif [ "$rc" -ne 0 ]; then
        why="exit status $rc"
    fi
    check "$name" "$why"
    if [ -n "$why" ]; then
        echo "      command: $*"
        tail -n 8 "$log.err" | sed 's/^/      stderr: /'
    fi
    [ -z "$why" ]
}

# step_records FILE: "STEP LOSS GRAD_NORM" for each training record, in file order (read with jq;
# a file that is not JSON lines gives nothing, so every check on it fails)
step_records() {
    jq -r 'select(has("loss")) | "\(.step) \(.loss) \(.grad_norm)"' "$1" 2>/dev/null
}

# ---- a deterministic text: words picked by a linear congruential generator ----------------

words=(the quick brown fox jumps over a lazy dog and then runs far away into deep green forest
    while birds sing songs of old kings who ruled the land by the sea)
text="" seed=12345 i=0
while [ ${#text} -lt 50000 ]; do
    seed=$(((seed * 1103515245 + 12345) % 2147483648))
    text+=${words[$(((seed >> 8) % ${#words[@]}))]}
    i=$((i + 1))
    if ((i % 12 == 0)); then text+=$'.\n'; else text+=" "; fi
done
printf '%s' "${text:0:50000}" >text.txt

# ---- prepare -------------------------------------------------------------------------------

run "prepare" prepare.log "$LOOM" prepare --text text.txt --out data --seq-len 16
why=""
for f in data/train_000000.bin data/val_000000.bin; do
    [ -s "$f" ] || why="$f missing"
done
check "prepare wrote train and val shards" "$why"

# ---- train ---------------------------------------------------------------------------------

# A constant learning rate after warm-up: a run of 3 steps then resumed to 6 follows the same
# schedule as a run of 6 (a cosine schedule depends on the total step count).
FLAGS=(--model tiny --data 'data/train_*.bin' --val-data 'data/val_*.bin' --save-every 3
    --eval-every 3 --threads 1 --seq-len 16 --micro-batch-size 2 --global-batch-size 4
    --warmup-steps 2 --lr-schedule constant)
run "train 6 steps" train_a.log "$LOOM" train "${FLAGS[@]}" --steps 6 --out run_a

metrics=run_a/metrics.jsonl
why=""
if [ ! -s "$metrics" ]; then
    why="$metrics missing or empty"
else
    steps=$(step_records "$metrics" | cut -d' ' -f1 | tr '\n' ' ')
    [ "$steps" = "1 2 3 4 5 6 " ] || why="step records for steps '$steps', expected '1 2 3 4 5 6 '"
fi
check "metrics.jsonl has one record per step 1..6" "$why"

# loom writes a non-finite value as null: every one of these keys must hold a JSON number
why=$(jq -r 'select(has("loss")) | . as $r | ("step", "loss", "lr", "grad_norm", "ms",
        "tokens_per_s", "mfu") | select(($r[.] | type) != "number") |
        "key \u0027\(.)\u0027 is \($r[.] | tojson) (not a finite number) in: \($r | tojson)"' \
    "$metrics" 2>&1 | head -n1)
check "step records carry step, loss, lr, grad_norm, ms, tokens_per_s, mfu" "$why"

why=""
vals=$(jq -r 'select(has("val_loss")) | "\(.step)=\(.val_loss | numbers)"' "$metrics" 2>/dev/null |
    tr '\n' ' ')
if ! [[ $vals =~ ^3=[-0-9.eE+]+\ 6=[-0-9.eE+]+\ $ ]]; then
    why="val_loss records '$vals', expected finite values at steps 3 and 6"
fi
check "validation records at steps 3 and 6" "$why"

why=""
if [ ! -s run_a/loss.svg ]; then
    why="run_a/loss.svg missing"
elif ! grep -q '</svg>' run_a/loss.svg; then
    why="run_a/loss.svg has no </svg>"
fi
check "loss.svg written" "$why"

why=""
latest=$(cat run_a/checkpoints/latest 2>/dev/null)
if [ "$latest" != step_00000006 ]; then
    why="checkpoints/latest is '$latest', expected step_00000006"
else
    for f in step_00000003/model.safetensors step_00000003/state.safetensors \
        step_00000006/model.safetensors step_00000006/state.safetensors; do
        [ -s "run_a/checkpoints/$f" ] || why="run_a/checkpoints/$f missing"
    done
fi
check "checkpoints at steps 3 and 6, latest names step 6" "$why"

# ---- sample and eval -----------------------------------------------------------------------

if run "sample" sample.txt "$LOOM" sample --checkpoint run_a --tokens 20 --threads 1; then
    bytes=$(wc -c <sample.txt)
    check "sample printed at least 20 bytes" "$([ "$bytes" -ge 20 ] || echo "got $bytes bytes")"
    run "sample again (same seed)" sample2.txt "$LOOM" sample --checkpoint run_a --tokens 20 \
        --threads 1
    check "sample is deterministic for a seed" "$(cmp -s sample.txt sample2.txt || echo differs)"
fi
run "sample from a step folder with a prompt" sample3.txt "$LOOM" sample \
    --checkpoint run_a/checkpoints/step_00000003 --prompt "the fox " --tokens 8 --threads 1 &&
    check "sample output starts with the prompt" \
        "$(head -c 8 sample3.txt | grep -q '^the fox $' || echo "got '$(head -c 40 sample3.txt)'")"

if run "eval" eval.txt "$LOOM" eval --checkpoint run_a --data 'data/val_*.bin' --threads 1; then
    loss=$(sed -n 's/^loss \([^ ]*\) .*/\1/p' eval.txt)
    check "eval prints a finite loss" \
        "$([[ $loss =~ $NUMBER ]] || echo "loss line: '$(head -n 1 eval.txt)'")"
fi

# ---- resume --------------------------------------------------------------------------------

run "train 3 steps (to be resumed)" train_b1.log "$LOOM" train "${FLAGS[@]}" --steps 3 --out run_b
run "resume to 6 steps" train_b2.log "$LOOM" train "${FLAGS[@]}" --steps 6 --resume run_b \
    --out run_b
check "resume says where it continued" \
    "$(grep -q 'resumed from run_b/checkpoints/step_00000003 at step 3' train_b2.log ||
        echo 'no "resumed from ... at step 3" line')"

records_a=$(step_records run_a/metrics.jsonl)
records_b=$(step_records run_b/metrics.jsonl)
steps_b=$(cut -d' ' -f1 <<<"$records_b" | tr '\n' ' ')
check "resumed metrics: one record per step 1..6" \
    "$([ "$steps_b" = "1 2 3 4 5 6 " ] || echo "steps '$steps_b'")"
check "resumed metrics: one val_loss record each at steps 3 and 6" \
    "$(v=$(jq -r 'select(has("val_loss")) | .step' run_b/metrics.jsonl | tr '\n' ' ')
        [ "$v" = "3 6 " ] || echo "val_loss steps '$v'")"
why=""
for s in 4 5 6; do
    a=$(grep "^$s " <<<"$records_a")
    b=$(grep "^$s " <<<"$records_b")
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        why="step $s: uninterrupted '$a', resumed '$b' (step loss grad_norm)"
        break
    fi
done
check "resumed steps 4..6: loss and grad_norm byte-identical" "$why"
check "steps 1..3 identical too" \
    "$([ "$(head -n 3 <<<"$records_a")" = "$(head -n 3 <<<"$records_b")" ] || echo differ)"
why=""
for f in model.safetensors state.safetensors; do
    cmp -s "run_a/checkpoints/step_00000006/$f" "run_b/checkpoints/step_00000006/$f" ||
        why="step_00000006/$f differs"
done
check "resumed final checkpoint byte-identical" "$why"

# resuming a finished run does nothing and keeps its metrics as they are
cp run_a/metrics.jsonl metrics_before.jsonl
run "resume a finished run" train_a2.log "$LOOM" train "${FLAGS[@]}" --steps 6 --resume run_a \
    --out run_a
check "finished run's metrics unchanged" \
    "$(cmp -s metrics_before.jsonl run_a/metrics.jsonl || echo 'metrics.jsonl changed')"

# a fresh run from the trained weights
run "init-from a safetensors file" train_c.log "$LOOM" train "${FLAGS[@]}" --steps 1 \
    --init-from run_a/checkpoints/step_00000006/model.safetensors --out run_c
check "init-from says so" "$(grep -q 'initialised from' train_c.log || echo 'no such line')"

# booleans spelled out: --no-save=false saves, --no-save=true does not
run "--no-save=false" train_d.log "$LOOM" train "${FLAGS[@]}" --steps 1 --no-save=false --out run_d
check "--no-save=false writes a checkpoint" "$([ -f run_d/checkpoints/latest ] || echo 'no checkpoint')"
run "--no-save=1" train_e.log "$LOOM" train "${FLAGS[@]}" --steps 1 --no-save=1 --out run_e
check "--no-save=1 writes none" "$([ ! -e run_e/checkpoints ] || echo 'a checkpoint was written')"
echo '{"no_save": 0}' >no_save_0.json
run "config no_save 0" train_f.log "$LOOM" train "${FLAGS[@]}" --steps 1 --config no_save_0.json \
    --out run_f
check "\"no_save\": 0 writes a checkpoint" "$([ -f run_f/checkpoints/latest ] || echo 'no checkpoint')"

# one run per folder: a second run with the same --out is refused while the first runs
"$LOOM" train "${FLAGS[@]}" --steps 100000 --save-every 0 --eval-every 0 --out run_busy \
    >busy_first.log 2>&1 &
first=$!
for _ in $(seq 1 100); do grep -q "step " busy_first.log 2>/dev/null && break; sleep 0.1; done
"$LOOM" train "${FLAGS[@]}" --steps 1 --out run_busy >busy_second.log 2>&1
rc=$?
kill "$first" 2>/dev/null
wait "$first" 2>/dev/null
check "a second run on a busy --out exits 2 naming the folder" \
    "$([ $rc -eq 2 ] && grep -q 'run_busy: another run is writing to this folder' busy_second.log || echo "exit $rc: $(tail -1 busy_second.log)")"
run "the folder is free again once the first run is gone" train_g.log "$LOOM" train "${FLAGS[@]}" \
    --steps 1 --out run_busy

# the progress bar is for terminals: --progress off never draws it, on always does
run "--progress on" train_h.log "$LOOM" train "${FLAGS[@]}" --steps 2 --progress on --out run_h
check "--progress on draws the bar" "$(grep -q 'ETA' train_h.log || echo 'no bar')"
run "--progress auto into a file" train_i.log "$LOOM" train "${FLAGS[@]}" --steps 2 --out run_i
check "--progress auto draws no bar into a file" "$(! grep -q 'ETA' train_i.log || echo 'a bar')"

# SIGTERM (a preempted job) finishes the step, saves a checkpoint and exits 0; --resume goes on
"$LOOM" train "${FLAGS[@]}" --steps 100000 --save-every 0 --eval-every 0 --log-every 1 \
    --out run_term >term.log 2>&1 &
job=$!
for _ in $(seq 1 100); do grep -q "step  *2/" term.log 2>/dev/null && break; sleep 0.1; done
kill -TERM "$job"
wait "$job"
rc=$?
check "SIGTERM: exit 0 after saving" "$([ $rc -eq 0 ] && grep -q 'stopping after step .*stop signal' term.log &&
    [ -f run_term/checkpoints/latest ] || echo "exit $rc: $(tail -2 term.log)")"
saved=$(sed 's/step_0*//' run_term/checkpoints/latest 2>/dev/null)
run "resume after SIGTERM" term_resume.log "$LOOM" train "${FLAGS[@]}" --steps $((saved + 2)) \
    --resume run_term --out run_term
check "resume after SIGTERM goes on from the saved step" \
    "$(grep -q "resumed from .* at step $saved" term_resume.log || echo "$(grep -m1 resumed term_resume.log)")"

# a wall-clock budget: the same clean stop
run "--exit-after-minutes" budget.log "$LOOM" train "${FLAGS[@]}" --steps 100000 --save-every 0 \
    --eval-every 0 --exit-after-minutes 0.01 --out run_budget
check "--exit-after-minutes stops and saves" "$(grep -q 'stopping after step .*time budget' budget.log &&
    [ -f run_budget/checkpoints/latest ] || echo "$(tail -1 budget.log)")"

# --keep-last 2 keeps the newest two checkpoints
run "--keep-last 2" keep.log "$LOOM" train "${FLAGS[@]}" --steps 5 --save-every 1 --keep-last 2 \
    --out run_keep
check "--keep-last 2 leaves two step folders, the newest" \
    "$(ls run_keep/checkpoints | tr '\n' ' ' | grep -qx 'latest step_00000004 step_00000005 ' ||
        echo "left: $(ls run_keep/checkpoints | tr '\n' ' ')")"

# what a killed save leaves (a temporary file, an empty step folder) is cleaned up on the next start
cp -r run_keep run_dirty
head -c 1000 /dev/zero >run_dirty/checkpoints/step_00000005/model.safetensors.tmp.12345
mkdir run_dirty/checkpoints/step_00000006
run "start over a killed save's leftovers" dirty.log "$LOOM" train "${FLAGS[@]}" --steps 6 \
    --resume run_dirty --out run_dirty
check "leftovers of a killed save removed, with a warning" \
    "$([ ! -e run_dirty/checkpoints/step_00000005/model.safetensors.tmp.12345 ] &&
        [ -f run_dirty/checkpoints/step_00000006/state.safetensors ] &&
        grep -q 'left by an interrupted save' dirty.log* || echo 'not cleaned')"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
