#!/usr/bin/env bash
# ZeRO's memory, measured by the kernel, not counted by the code under test: each rank's peak
# resident set (getrusage, OUT/memory.json's peak_rss) for ZeRO 0-3 at dp 4, on a model where the
# parameters dominate, at two depths (4 and 16 blocks of width 256, a 257-token vocabulary). The
# difference between the depths divided by the difference in parameters is what each stage holds
# per parameter, the process's fixed costs cancelling; it must match the stage's rule within 15 %
# (20 % for ZeRO-3's small figure):
#   ZeRO-0   weights 4 + gradients 4 + AdamW 8                             = 16 bytes
#   ZeRO-1   4 + 4 + 8/dp + the reduce-scatter ring's receive buffers 4(dp-1)/dp
#   ZeRO-2   4 + gradient shard 4/dp + 8/dp                                 (a full-size gradient
#            buffer kept would add 4(dp-1)/dp = 3 and fail)
#   ZeRO-3   16/dp                                                          (full-size parameters
#            kept would add 3 and fail)
# The parameter count is GPT-2's per-block formula, 12 C^2 + 13 C, written here.
# usage: bash tests/mpi_memory.sh LOOM_BINARY TMPDIR
set -u
LOOM=$1
TMP=$2
. "$(cd "$(dirname "$0")" && pwd)/mpi_harness.bash"
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1
prepare_corpus

dp=4
for z in 0 1 2 3; do
    for layers in 4 16; do
        name=z${z}_l$layers
        if timeout 300 mpirun -np $dp "$LOOM" train --layers $layers --heads 4 --d-model 256 \
            --context 16 --vocab 257 --seq-len 16 --micro-batch-size 1 --global-batch-size $dp \
            --steps 2 --data 'data/train_*.bin' --threads 1 --eval-every 0 --no-save --zero $z \
            --out $name >$name.log 2>&1 && [ -s $name/memory.json ]; then
            ok
        else
            fail "$name: $(tail -3 $name.log)"
        fi
    done
done

out=$(python3 - $dp <<'PY'
import json, sys
dp = int(sys.argv[1])
C = 256
per_block = 12 * C * C + 13 * C
expected = {0: 16.0, 1: 8 + 8 / dp + 4 * (dp - 1) / dp, 2: 4 + 12 / dp, 3: 16 / dp}
tolerance = {0: 0.15, 1: 0.15, 2: 0.15, 3: 0.20}
bad = 0
for z in range(4):
    try:
        a = json.load(open(f"z{z}_l4/memory.json"))["ranks"]
        b = json.load(open(f"z{z}_l16/memory.json"))["ranks"]
    except (OSError, ValueError, KeyError) as e:
        print(f"ZeRO-{z}: no memory report ({e})"); bad = 1; continue
    slopes = sorted((y["peak_rss"] - x["peak_rss"]) / (12 * per_block) for x, y in zip(a, b))
    median = slopes[len(slopes) // 2]
    ok = abs(median - expected[z]) <= tolerance[z] * expected[z]
    print(f"ZeRO-{z}: {median:.2f} bytes per parameter measured (ranks {' '.join(f'{s:.2f}' for s in slopes)}), "
          f"expected {expected[z]:.2f} within {tolerance[z]:.0%}{'' if ok else '  <-- FAIL'}")
    bad |= not ok
sys.exit(bad)
PY
)
code=$?
echo "$out"
if [ $code -eq 0 ]; then ok; else fail "peak resident memory per parameter does not follow the ZeRO stage"; fi
finish
