#!/usr/bin/env bash
# Llama 3 405B's published training layouts predicted on clusters/dgx-h100.json (docs/llama.md,
# "Validation"). The Llama 3 Herd of Models (2024), Table 4, and the SC'24 talk on the same runs:
# sequence 8192, 16M tokens (2048 sequences) a step, TP 8, PP 16; 8,192 H100s at DP 64: 430
# TFLOP/s per GPU; 16,384 at DP 128: 400. Each row is `loom plan` with the layout, then `loom
# plan --predict` on the H100 description in bf16; TFLOP/s per GPU from the predicted step as the
# acceptance check counts it: (6 N + 12 L d s) x tokens, N without the input embedding (PaLM's
# count). Rows:
#   acceptance  interleaved, 2 chunks a rank, the default split, nothing else (the check's command)
#   paper v=V   the paper's text: interleaved, one layer fewer on the first and the last stage,
#               no activation checkpointing, Megatron's sequence parallelism with TP (the paper
#               cites Korthikanti et al. 2023 for its TP); V chunks a rank (the paper does not say
#               how many: 2 and 4). The H100 description prices the attention core fused
#               (FlashAttention: "attention": "fused"), in every row.
# then the planner's own pick for each device count (`loom plan --model llama3-405b --devices N`).
# usage: bash bench/llama3_405b.sh   (build first: bash scripts/build.sh build; seconds each)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=$PWD/build/loom
H100=$PWD/clusters/dgx-h100.json
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); outputs in $out"
split2="3$(printf ',4%.0s' $(seq 30)),3"   # 32 virtual stages: 3, 4 x 30, 3 = 126
split4="1$(printf ',2%.0s' $(seq 62)),1"   # 64 virtual stages: 1, 2 x 62, 1 = 126

tflops() { # PREDICTED_JSON DEVICES PUBLISHED LOG NAME
    python3 - "$@" <<'PY'
import json, re, sys
path, n, pub, log, name = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
step = json.load(open(path))["predicted"]["step_s"]
L, d, ff, H, KV, V, s, B = 126, 16384, 53248, 128, 8, 128256, 8192, 2048
hd = d // H
N = L * (d * d * 2 + 2 * d * KV * hd + 3 * d * ff + 2 * d) + d + V * d
tf = (6 * N + 12 * L * d * s) * B * s / step / n / 1e12
text = open(log).read()
m = re.search(r"pipeline [0-9.]+ s \(bubble ([0-9.]+) %\) \+ data-parallel sync not hidden ([0-9.]+) s", text)
peak = re.search(r"peak memory ([0-9.]+) GiB", text)
print(f"| {name} | {n} | {step:.2f} s | {tf:.0f} | {pub:.0f} | {(tf - pub) / pub * 100:+.1f} % | "
      f"{m.group(1) if m else '?'} % | {m.group(2) if m else '?'} s | {peak.group(1) if peak else '?'} GiB |")
PY
}

echo "| row | GPUs | predicted step | TFLOP/s per GPU | published | error | bubble | DP sync exposed | peak memory |"
echo "|---|---|---|---|---|---|---|---|---|"
for row in "8192 64 430" "16384 128 400"; do
    read -r n dp pub <<<"$row"
    common=(--model llama3-405b --dp "$dp" --tp 8 --pp 16 --micro-batch-size 1
        --global-batch-size 2048 --context 8192 --schedule interleaved)
    for variant in acceptance paper_v2 paper_v4; do
        case $variant in
        acceptance) flags=(--virtual-stages 2) ;;
        paper_v2) flags=(--virtual-stages 2 --stage-layers "$split2" --sequence-parallel) ;;
        paper_v4) flags=(--virtual-stages 4 --stage-layers "$split4" --sequence-parallel) ;;
        esac
        name=${variant}_$n
        "$LOOM" plan "${common[@]}" "${flags[@]}" --out "$out/$name.json" >"$out/$name.plan.log" 2>&1
        "$LOOM" plan --predict "$out/$name.json" --cluster "$H100" --precision bf16 --seq-len 8192 \
            --out "$out/$name.predicted.json" >"$out/$name.log" 2>&1
        tflops "$out/$name.predicted.json" "$n" "$pub" "$out/$name.log" "$variant"
    done
done
for n in 8192 16384; do
    "$LOOM" plan --model llama3-405b --cluster "$H100" --devices "$n" --global-batch-size 2048 \
        --seq-len 8192 --out "$out/pick_$n.json" >"$out/pick_$n.log" 2>&1
    echo "planner's pick for $n GPUs:"
    grep -A1 "^  #  dp" "$out/pick_$n.log"
done
