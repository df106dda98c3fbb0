#!/usr/bin/env bash
# mpi_failure.sh — runs test_comm_failure MODE on 2 ranks (2 s timeout) and checks how the job
# ends: a dead or hung rank must end the whole job with a non-zero status within seconds, with
# a message naming the rank (ours, or mpirun's for a rank that died); a slow but live peer must
# not end it; a stopped rank (SIGSTOP: alive, but running nothing) must be named by a waiting
# rank. Prints "N passed, N failed" and exits non-zero on failure.
#
# usage: bash tests/mpi_failure.sh MODE TEST_PROGRAM MPIEXEC [MPIEXEC_ARGS...]
#   e.g. bash tests/mpi_failure.sh hang build/tests/test_comm_failure mpirun -np 2 --oversubscribe
set -u
if [ $# -lt 3 ]; then
    echo "usage: $0 MODE TEST_PROGRAM MPIEXEC [MPIEXEC_ARGS...]" >&2
    exit 2
fi
mode=$1
program=$2
shift 2
launcher=("$@")

# Defaults for a run outside CTest (which sets these itself).
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

out=$(mktemp) err=$(mktemp)
# A stopped rank that the job left behind (its pid is in the output) is continued and killed.
kill_stopped() {
    local pid
    pid=$(sed -n 's/^\[rank 1\] test: stopping pid \([0-9]*\)$/\1/p' "$err" | head -n1)
    if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$program")" ]; then
        echo "$mode: killing the stopped rank (pid $pid), still there after the job"
        kill -CONT "$pid" 2>/dev/null
        kill -9 "$pid" 2>/dev/null
    fi
}
trap 'kill_stopped; rm -f "$out" "$err"' EXIT

passed=0
failed=0
check() { # NAME CONDITION-STATUS
    if [ "$2" -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok    $mode: $1"
    else
        failed=$((failed + 1))
        echo "FAIL  $mode: $1"
    fi
}
has() { grep -Eq -- "$1" "$err"; }
our_error_lines() { grep -Ec '^\[rank [0-9]+\] error:' "$err"; }

start=$(date +%s%N)
timeout 60 "${launcher[@]}" "$program" "$mode" >"$out" 2>"$err"
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "$mode: exit status $rc after $((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000))) s"
fast=$((elapsed_ms < 20000))

case $mode in
slow_peer)
    check "succeeds" $((rc != 0))
    grep -q "slow peer ok" "$out"
    check "reports success" $?
    has 'error:'
    check "prints no error" $((1 - $?))
    ;;
exit | killed)
    check "ends non-zero" $((rc == 0 || rc == 124))
    check "ends within 20 s" $((fast != 1))
    # mpirun names the rank that died ("process rank 1", "Process name: [[...],1]")
    has 'rank 1|\[\[[0-9]+,[0-9]+\],1\]'
    check "names rank 1" $?
    ;;
hang)
    check "ends non-zero" $((rc == 0 || rc == 124))
    check "ends within 20 s" $((fast != 1))
    # rank 1's watchdog or rank 0's wait deadline, whichever comes first
    has "^\[rank 1\] error: no progress for [0-9.]+ s during 'test: about to hang'|^\[rank 0\] error: timed out after [0-9.]+ s waiting in allreduce on group 'world' \(ranks 0,1\)"
    check "names the hung rank or the timed-out wait" $?
    ;;
watchdog)
    check "ends non-zero" $((rc == 0 || rc == 124))
    check "ends within 20 s" $((fast != 1))
    has "^\[rank 1\] error: no progress for [0-9.]+ s during 'test: about to hang' — this rank hangs; aborting the job$"
    check "rank 1's watchdog names it" $?
    check "one error line" $(($(our_error_lines) != 1))
    ;;
busy_peer)
    check "ends non-zero" $((rc == 0 || rc == 124))
    check "ends within 20 s" $((fast != 1))
    has "^\[rank 0\] error: timed out after [0-9.]+ s waiting in allreduce on group 'dp' \(ranks 0,1\) during 'step 3: backward'; a peer rank has died or hangs — aborting the job$"
    check "rank 0's deadline names the operation, group, ranks and step" $?
    check "one error line" $(($(our_error_lines) != 1))
    ;;
stopped)
    check "ends non-zero" $((rc == 0 || rc == 124))
    check "ends within 20 s" $((fast != 1))
    has "^\[rank [0-9]+\] error: rank 1 stopped responding \(no answer to liveness pings for [0-9.]+ s while waiting in allreduce on group 'world' \(ranks [0-9,]+\) during 'test: allreduce with a peer that stops'\) — aborting the job$"
    check "a waiting rank names rank 1 as stopped" $?
    check "names no other rank" $(($(grep -c 'stopped responding' "$err") != $(grep -c 'error: rank 1 stopped responding' "$err")))
    has 'timed out'
    check "named before the wait deadline" $((1 - $?))
    ;;
test_deadline)
    check "ends non-zero" $((rc == 0 || rc == 124))
    check "ends within 20 s" $((fast != 1))
    has "^\[rank 0\] error: timed out after [0-9.]+ s waiting in recv from rank 1 on group 'world' \(ranks 0,1\) during 'test: polling a receive'"
    check "rank 0's deadline names the receive and the peer" $?
    check "one error line" $(($(our_error_lines) != 1))
    ;;
*)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac

if [ "$failed" -ne 0 ]; then
    sed 's/^/      stdout: /' "$out" | head -n 20
    sed 's/^/      stderr: /' "$err" | head -n 40
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
