#!/usr/bin/env bash
# ZeRO-2 and ZeRO-3 against ZeRO-1 on this machine.
#
# Throughput (default): gpt2 124M, data parallel 2 (one thread per rank), the `loom bench
# --train` defaults (micro batch 4, sequence 64, global batch 8, synthetic tokens), median step
# time over STEPS timed steps: ZeRO-1, ZeRO-2, and ZeRO-3 with prefetch 0 (each block gathered
# just in time), 1 (the default) and 2. Prints each run's ms/step and tokens/s, then each one's
# throughput as a ratio to ZeRO-1's, measured in the same run of this script.
# LINK=RATE (root) runs the same five through one link shaped to RATE (e.g. 5gbit): the ranks
# talk TCP over a network namespace's loopback, shaped by tc (bench/netns.bash), so that the
# transfers take time on a wire, not the CPU that computes. Here, with shared memory, Open MPI
# copies a gather with the very cores that compute (both ranks compute on the 2 cores), so a
# prefetched gather has nothing idle to use and prefetch can show only on a link.
#
# Largest model (LARGEST=1): for ZeRO-1, 2 and 3, the largest GPT of GPT-2's shape family
# (vocabulary 50257, heads of 64 channels) on a ladder of widths and depths, tried from the top
# down: the first that `loom train` starts (its memory check refuses a rank that would not fit
# this machine before allocating, in a second) and trains for 2 steps is the stage's largest;
# a run that starts and then fails (killed for memory) counts as not fitting. Sequence 256,
# micro batch 1 (no recomputation: with one micro-batch in flight loom's recomputation keeps the
# same one activation set, so it would only cost time), --comm-timeout 1800 (4 ranks share 2
# cores here, so a rank can wait minutes at a collective for one still computing),
# data parallel 4 on 4 ranks (--oversubscribe), synthetic tokens. Prints each stage's largest
# model, its parameter count and each rank's peak resident memory, then ZeRO-3's parameters as
# a ratio to ZeRO-1's and ZeRO-2's. Long: each trained step of a large model takes minutes here.
#
# usage: bash bench/zero.sh [STEPS [FLAGS...]]   (build first: bash scripts/build.sh; FLAGS go
#                                                 to every `loom bench`, e.g. --seq-len 256)
#        LINK=5gbit bash bench/zero.sh [STEPS [FLAGS...]]
#        LARGEST=1 bash bench/zero.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=$PWD/build/loom
STEPS=${1:-8}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) cores" \
    "$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"

if [ "${LARGEST:-0}" != 1 ]; then
    common=(--train --model gpt2 --steps "$STEPS" --warmup 2 --threads 1 --data-parallel 2 "${@:2}")
    runs=("zero1:--zero 1" "zero2:--zero 2" "zero3_prefetch0:--zero 3 --zero3-prefetch 0"
        "zero3_prefetch1:--zero 3 --zero3-prefetch 1" "zero3_prefetch2:--zero 3 --zero3-prefetch 2")
    launch=(mpirun -np 2)
    if [ -n "${LINK:-}" ]; then
        [ "$(id -u)" -eq 0 ] || { echo "LINK: needs root (ip netns, tc)" >&2; exit 1; }
        ns=loom_zbench_$$
        . "$ROOT/bench/netns.bash"
        netns_one_link "$LINK"
        trap 'ip netns del "$ns" 2>/dev/null; rm -rf "$out"' EXIT
        launch=(netns_mpirun 2 "")
        echo "one link shaped to $LINK: $(netns_mpirun_text 2 "")"
    fi
    for r in "${runs[@]}"; do
        name=${r%%:*}
        read -r -a flags <<<"${r#*:}"
        echo "== $name: ${launch[*]} loom bench ${common[*]} ${flags[*]}" >&2
        "${launch[@]}" "$LOOM" bench "${common[@]}" "${flags[@]}" --out "$out/$name" |
            tee "$out/$name.txt"
    done
    tokens() { sed -n 's/.*| *\([0-9.]*\) tok\/s.*/\1/p' "$out/$1.txt" | tail -1; }
    base=$(tokens zero1)
    echo
    echo "throughput relative to ZeRO-1 (gpt2, dp 2, same run${LINK:+, one link of $LINK}):"
    for r in "${runs[@]}"; do
        name=${r%%:*}
        awk -v n="$name" -v t="$(tokens "$name")" -v b="$base" \
            'BEGIN { printf "  %-16s %8.0f tok/s  %.3fx\n", n, t, t / b }'
    done
    exit 0
fi

# (layers, width) from small to large: GPT-2's shapes and the steps between them
ladder=("16 1024" "20 1024" "24 1024" "28 1024" "32 1024" "24 1280" "28 1280" "32 1280" "36 1280"
    "40 1280" "44 1280" "48 1280" "36 1600" "40 1600" "44 1600" "48 1600" "56 1600" "48 2048"
    "56 2048" "64 2048")
params() { # layers width: GPT-2's count (tied embedding, context 1024)
    awk -v l="$1" -v c="$2" 'BEGIN { printf "%.0f", l * (12 * c * c + 13 * c) + (50304 + 1024) * c + 2 * c }'
}
declare -A largest
for z in 1 2 3; do
    best=""
    for ((i = ${#ladder[@]} - 1; i >= 0; i--)); do
        shape=${ladder[i]}
        read -r layers width <<<"$shape"
        name=z${z}_l${layers}_c$width
        echo "== ZeRO-$z: $layers layers, width $width ($(params "$layers" "$width") parameters)" >&2
        if mpirun -np 4 "$LOOM" bench --train --layers "$layers" --d-model "$width" \
            --heads $((width / 64)) --context 1024 --seq-len 256 --micro-batch-size 1 \
            --global-batch-size 4 --steps 2 --warmup 1 --threads 1 --data-parallel 4 --zero "$z" \
            --comm-timeout 1800 \
            --out "$out/$name" >"$out/$name.txt" 2>&1; then
            best=$shape
            jq -r '"   trained; peak resident set per rank \([.ranks[].peak_rss] | max / 1073741824 * 100 | round / 100) GiB"' \
                "$out/$name/memory.json" >&2 || true
            break
        fi
        grep -h "error" "$out/$name.txt" | head -1 >&2 || true
    done
    largest[$z]=$best
done
echo
echo "largest model trained (sequence 256, micro batch 1, dp 4):"
for z in 1 2 3; do
    read -r layers width <<<"${largest[$z]:-0 0}"
    echo "  ZeRO-$z  $layers layers x $width: $(params "$layers" "$width") parameters"
done
p1=$(read -r l c <<<"${largest[1]:-0 1}"; params "$l" "$c")
p2=$(read -r l c <<<"${largest[2]:-0 1}"; params "$l" "$c")
p3=$(read -r l c <<<"${largest[3]:-0 1}"; params "$l" "$c")
awk -v a="$p1" -v b="$p2" -v c="$p3" 'BEGIN { if (a > 0 && b > 0) printf "ZeRO-3 / ZeRO-1 %.2fx, ZeRO-3 / ZeRO-2 %.2fx (targets 2.2x, 1.25x)\n", c / a, c / b }'
