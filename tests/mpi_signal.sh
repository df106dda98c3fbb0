#!/usr/bin/env bash
# mpi_signal.sh — a stop signal to the launcher, not to a rank: SIGTERM and SIGINT sent to
# Open MPI's mpirun reach the ranks' stop path (src/train/stop.c): mpirun sends them SIGCONT,
# SIGTERM after odls_base_sigkill_timeout (1 s), SIGKILL after as long again, and does not read
# their output meanwhile. The ranks log every step (so rank 0's stdout pipe fills while mpirun
# waits), yet they finish the step, save the stop checkpoint and say so within the delay; mpirun
# exits 1 (Open MPI's status for a job it was told to end, documented in stop.c); the run
# resumes from that checkpoint.
# usage: bash tests/mpi_signal.sh LOOM_BINARY TMPDIR
set -u
LOOM=$1
TMP=$2
. "$(cd "$(dirname "$0")" && pwd)/mpi_harness.bash"
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1
if ! mpirun --version 2>&1 | grep -q "Open MPI"; then
    echo "SKIPPED: mpirun is not Open MPI's (this test follows its kill sequence)"
    exit 77
fi

prepare_corpus

common=(--model tiny --data 'data/train_*.bin' --seq-len 16 --micro-batch-size 2
    --global-batch-size 8 --lr 3e-3 --eval-every 0 --threads 1 --log-every 1 --comm-timeout 60)

# stop SIGNAL: start a 2-rank run, send SIGNAL to mpirun after the first steps
stop() {
    local sig=$1 name=stop_$1
    mpirun -np 2 "$LOOM" train "${common[@]}" --steps 100000000 --out "$name" >"$name.log" 2>&1 &
    local job=$!
    for _ in $(seq 1 100); do grep -q "step  *3/" "$name.log" 2>/dev/null && break; sleep 0.1; done
    kill -"$sig" "$job"
    timeout 20 tail --pid="$job" -f /dev/null
    wait "$job"
    local code=$?
    [ "$code" = 1 ] && ok || fail "SIG$sig to mpirun: exit $code, expected mpirun's 1"
    local latest saved
    latest=$(cat "$name/checkpoints/latest" 2>/dev/null)
    saved=${latest#step_}
    saved=$((10#${saved:-0}))
    [ -n "$latest" ] && [ -f "$name/checkpoints/$latest/model.safetensors" ] && ok ||
        fail "SIG$sig to mpirun: no stop checkpoint ($(ls "$name/checkpoints" 2>&1 | head -3))"
    # (the line may follow a progress line cut short: stdout is non-blocking by then)
    grep -q "\[rank 0\] warning: stopping after step $saved of 100000000: a stop signal (SIGTERM or SIGINT); saving a checkpoint" \
        "$name.log" && ok || fail "SIG$sig to mpirun: no message naming the stop at step $saved:" \
        "$(grep -m2 -E 'stopping|error' "$name.log")"
    pgrep -f "out $name" >/dev/null && fail "SIG$sig to mpirun: a rank is still running" || ok
    # the stop checkpoint is a checkpoint: the run goes on from it
    if timeout 60 mpirun -np 2 "$LOOM" train "${common[@]}" --steps $((saved + 1)) \
        --resume "$name" --out "$name" >"${name}_resume.log" 2>&1 &&
        grep -q "resumed from .* at step $saved" "${name}_resume.log"; then ok; else
        fail "SIG$sig: resume from the stop checkpoint: $(grep -m1 -E 'error|resumed' "${name}_resume.log")"
    fi
}
stop TERM
stop INT

finish
