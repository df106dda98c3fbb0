#!/usr/bin/env bash
# Parallel layouts against one process: gpt2 124M, micro batch 4, sequence 64, global batch 8,
# OMP threads x ranks = 2 on this machine. Prints, per layout, ms/step, tokens/s, MFU and the
# share of rank 0's step spent waiting on each group's communication, then each layout's
# throughput as a ratio to the single-process 2-thread run. With NETNS=1 (root, iproute2) it
# also runs 2-rank DP over TCP inside a network namespace whose loopback tc limits to 1 Gbit/s
# and 100 Mbit/s: the baseline that gradient compression will be measured against.
# usage: bash bench/parallel.sh [STEPS]   (build first: bash scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=$PWD/build/loom
STEPS=${1:-12}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle=1
common=(--train --model gpt2 --micro-batch-size 4 --seq-len 64 --global-batch-size 8 --steps "$STEPS" --warmup 2)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() { # name, command...
    local name=$1
    shift
    echo "== $name" >&2
    "$@" --out "$out/$name" | tee "$out/$name.txt"
}
tokens() { sed -n 's/.*| *\([0-9.]*\) tok\/s.*/\1/p' "$out/$1.txt"; }

run single "$LOOM" bench "${common[@]}" --threads 2
run dp2 mpirun -np 2 "$LOOM" bench "${common[@]}" --threads 1 --data-parallel 2 --no-zero1
run dp2_zero1 mpirun -np 2 "$LOOM" bench "${common[@]}" --threads 1 --data-parallel 2 --zero1
run pp2 mpirun -np 2 "$LOOM" bench "${common[@]}" --threads 1 --pipeline-parallel 2
run tp2 mpirun -np 2 "$LOOM" bench "${common[@]}" --threads 1 --tensor-parallel 2

if [ "${NETNS:-0}" = 1 ]; then
    ns=loom_bench_$$
    for rate in 1gbit 100mbit; do
        ip netns add "$ns"
        ip netns exec "$ns" ip link set lo up
        ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$rate" burst 256kb latency 50ms
        steps=$STEPS
        [ "$rate" = 100mbit ] && steps=4
        run "dp2_tcp_$rate" ip netns exec "$ns" mpirun -np 2 --mca btl tcp,self \
            --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
            "$LOOM" bench --train --model gpt2 --micro-batch-size 4 --seq-len 64 \
            --global-batch-size 8 --steps "$steps" --warmup 1 --threads 1 --data-parallel 2 || true
        ip netns del "$ns"
    done
fi

base=$(tokens single)
echo
echo "throughput relative to one process with 2 threads ($base tok/s):"
for f in "$out"/*.txt; do
    name=$(basename "$f" .txt)
    t=$(tokens "$name")
    [ -n "$t" ] && awk -v n="$name" -v t="$t" -v b="$base" 'BEGIN { printf "  %-16s %8.0f tok/s  %.2fx\n", n, t, t / b }'
done
