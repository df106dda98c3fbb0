#!/usr/bin/env bash
# bench/planner.sh — the cost model against measurement (issue 10, first table): profiles this
# machine's 2 ranks (loom profile, once; kept in OUT), then predicts every pipeline layout that
# bench/schedules.sh measured (small and gpt2 124M, pp 2, m 4 and 8, every schedule) with
# `loom plan --predict` and prints predicted vs measured step time (the median over the steps
# after the first) and the error. Run bench/schedules.sh first (its outputs are read, not rerun).
# usage: bash bench/planner.sh [OUT]   (build first)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=${LOOM:-$ROOT/build/loom}
OUT=${1:-$ROOT/bench/out/planner}
RUNS=$ROOT/bench/out/schedules
mkdir -p "$OUT"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
cluster=$OUT/local2.json
if [ ! -s "$cluster" ]; then
    echo "  \$ mpirun -np 2 loom profile --threads 1 --out $cluster"
    mpirun -np 2 "$LOOM" profile --threads 1 --out "$cluster" >"$OUT/profile.log" 2>&1
fi
for model in small:4:128 gpt2:2:64; do
    IFS=: read -r name micro seq <<<"$model"
    for m in 4 8; do
        for s in 1f1b interleaved zb-h1 zb-v; do
            extra=()
            [ "$s" = interleaved ] && extra=(--virtual-stages 2)
            run=$RUNS/${name}_p2_m${m}_$s
            [ -s "$run/metrics.jsonl" ] || { echo "$name m=$m $s: no measured run in $run"; continue; }
            plan=$OUT/${name}_m${m}_$s.json
            "$LOOM" plan --model "$name" --pp 2 --micro-batch-size "$micro" \
                --global-batch-size $((micro * m)) --schedule "$s" "${extra[@]}" --out "$plan" >/dev/null
            pred=$("$LOOM" plan --predict "$plan" --cluster "$cluster" --seq-len "$seq" |
                sed -n 's/^ *step \([0-9.]*\) s = pipeline [0-9.]* s (bubble \([0-9.]*\) %.*/\1 \2/p')
            meas=$(python3 -c "
import json, statistics
r = [json.loads(l) for l in open('$run/metrics.jsonl')]
print(statistics.median(x['ms'] for x in r if 'ms' in x and x['step'] > 1) / 1e3)")
            echo "$name $m $s $pred $meas"
        done
    done
done | python3 -c '
import statistics, sys
errs = []
for line in sys.stdin:
    f = line.split()
    if len(f) != 6:
        print(line.rstrip())
        continue
    name, m, s, pred, bubble, meas = f[0], f[1], f[2], float(f[3]), float(f[4]), float(f[5])
    err = 100 * (pred - meas) / meas
    errs.append(abs(err))
    print(f"{name:6s} m={m} {s:12s} predicted {pred:8.4f} s (bubble {bubble:5.1f}%)  measured {meas:8.4f} s  error {err:+6.1f}%")
if errs:
    print(f"median |error| {statistics.median(errs):.1f}% over {len(errs)} layouts, worst {max(errs):.1f}%")
'
