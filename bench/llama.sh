#!/usr/bin/env bash
# The Llama family against GPT-2 on this machine (docs/llama.md, "Measured").
#
# Throughput (default): a Llama of GPT-2 124M's size (12 layers, width 768, 12 heads over 4 kv
# heads, SwiGLU 2048, untied head; GPT-2's vocabulary) against GPT-2 124M, one process on THREADS
# threads (default 2): `loom bench --cases a,l` (micro batch 4, sequence 64, forward, backward
# and AdamW; the median of STEPS timed steps after 2 untimed): tokens/s and MFU (model FLOPs
# 6 N + 6 L d T a token, N without the padded rows and, for the untied Llama, without the input
# embedding; against the sgemm peak measured at start-up, printed), and where each step's time
# goes by kernel.
#
# Loss (LOSS=1): the quick start's job (scripts/demo.sh: the default corpus, bytes, 2
# data-parallel ranks, sequence 128, batch 16, LOSS_STEPS steps (default 1500), lr 3e-3 with 200
# warm-up steps) for the `small` GPT and for a Llama of the same parameter count (4 layers,
# width 128, 4 heads over 2 kv heads, SwiGLU 384, untied head): validation loss after the same
# tokens, from each run's last evaluation.
#
# usage: bash bench/llama.sh            (build first: bash scripts/build.sh build)
#        STEPS=10 THREADS=2 bash bench/llama.sh
#        LOSS=1 LOSS_STEPS=1500 bash bench/llama.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=$PWD/build/loom
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle=1
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) cores; outputs in $out"

if [ "${LOSS:-0}" != 1 ]; then
    "$LOOM" bench --cases a,l --threads "${THREADS:-2}" --steps "${STEPS:-10}" | tee "$out/throughput.txt"
    exit 0
fi

corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
# shellcheck disable=SC2086
"$LOOM" prepare --text $corpus --out "$out/data" --seq-len 128 >/dev/null
steps=${LOSS_STEPS:-1500}
common=(--context 128 --seq-len 128 --data "$out/data/train_*.bin" --val-data "$out/data/val_*.bin"
    --steps "$steps" --micro-batch-size 8 --global-batch-size 16 --lr 3e-3 --warmup-steps 200
    --eval-every 250 --log-every 250 --threads 1 --no-save)
for run in gpt2_small llama_small; do
    if [ "$run" = gpt2_small ]; then
        flags=(--model small)
    else
        flags=(--arch llama --layers 4 --d-model 128 --heads 4 --kv-heads 2 --ffn-dim 384)
    fi
    echo "== $run: mpirun -np 2 loom train ${flags[*]} ${common[*]}"
    mpirun -np 2 --oversubscribe "$LOOM" train "${flags[@]}" "${common[@]}" --out "$out/$run" \
        >"$out/$run.log" 2>&1 || {
        tail -5 "$out/$run.log"
        exit 1
    }
    grep -m1 "model:" "$out/$run.log"
    echo "$run: validation loss after $steps steps:" \
        "$(jq -r 'select(has("val_loss")) | .val_loss' "$out/$run/metrics.jsonl" | tail -1)" \
        "; seconds: $(jq -s '[.[] | select(has("ms")) | .ms] | add / 1000' "$out/$run/metrics.jsonl")"
done
