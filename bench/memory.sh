#!/usr/bin/env bash
# bench/memory.sh — the per-rank memory model (loom_plan_rank_memory, src/parallel/memory.c)
# against the kernel's measurement (issue 20, part 5). Each mode is a `loom train` of a few steps
# (gpt2 124M, --seq-len 256, micro batch 1, 1 thread per rank, --no-save, --eval-every 0, on a
# byte-level corpus prepared from README.md); at its end every rank writes OUT/runs/NAME/
# memory.json with its peak resident set (getrusage's ru_maxrss, `peak_rss`) and the predicted
# per-rank total (`predicted.total`, what `loom train` printed at start-up). Modes:
#   dp 2        ZeRO 0, 1, 2, 3  x  recompute none, selective, needed          (2 ranks)
#   dp 4        ZeRO 0, 1, 2, 3, recompute none                                 (4 ranks)
#   tp 2 dp 2   ZeRO 0, 1, 2, 3  x  with and without --sequence-parallel
#               x  recompute none, selective, needed                            (4 ranks)
#   pp 2 dp 2   1F1B over 4 micro-batches, ZeRO 0-3, and ZeRO 1 with recompute needed;
#               ZB-V, ZeRO 1 and 2                                              (4 ranks)
#   small       the `small` preset (--seq-len 128): dp 2 ZeRO 0-3, tp 2 dp 2 SP ZeRO 1 and 3
# and prints one row per mode: the rank whose prediction is furthest from its measurement, its
# predicted and measured peak (MiB) and the error (predicted - measured) / measured; then the
# median and worst |error| of the gpt2 rows. A mode whose memory.json is there is not rerun
# (delete OUT/runs/NAME, or all of OUT, after changing the code). One run at a time: the runs
# measure memory, not time, but a run beside another heavy one takes twice as long.
# usage: bash bench/memory.sh [OUT]   (build first; LOOM=path/to/loom to use another binary;
#        MODES='regex' to run only the modes whose name matches)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=${LOOM:-$ROOT/build/loom}
OUT=${1:-$ROOT/bench/out/memory}
MODES=${MODES:-.}
STEPS=${STEPS:-2}
mkdir -p "$OUT/runs"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
if [ ! -s "$OUT/data/train_000000.bin" ]; then
    "$LOOM" prepare --text "$ROOT/README.md" --out "$OUT/data" --seq-len 256 >/dev/null
fi

# run NAME MODEL SEQ RANKS GLOBAL FLAGS...: one `loom train`, kept in OUT/runs/NAME
run() {
    local name=$1 model=$2 seq=$3 ranks=$4 global=$5
    shift 5
    [[ $name =~ $MODES ]] || return 0
    local dir=$OUT/runs/$name
    [ -s "$dir/memory.json" ] && return 0
    echo "  \$ mpirun -np $ranks loom train --model $model --seq-len $seq --micro-batch-size 1" \
        "--global-batch-size $global $* --steps $STEPS --threads 1 --eval-every 0 --no-save" >&2
    rm -rf "$dir"
    if ! timeout 900 mpirun --oversubscribe -np "$ranks" "$LOOM" train --model "$model" \
        --seq-len "$seq" --micro-batch-size 1 --global-batch-size "$global" "$@" \
        --steps "$STEPS" --threads 1 --eval-every 0 --no-save --data "$OUT/data/train_*.bin" \
        --out "$dir" >"$OUT/runs/$name.log" 2>&1; then
        echo "$name: failed, see $OUT/runs/$name.log" >&2
    fi
}

recompute_flags() { # none | selective | needed
    case $1 in
    none) ;;
    *) echo "--recompute $1" ;;
    esac
}

for z in 0 1 2 3; do
    for r in none selective needed; do
        # shellcheck disable=SC2046
        run "gpt2_dp2_z${z}_$r" gpt2 256 2 2 --data-parallel 2 --zero $z $(recompute_flags $r)
    done
done
for z in 0 1 2 3; do
    run "gpt2_dp4_z${z}_none" gpt2 256 4 4 --data-parallel 4 --zero $z
done
for z in 0 1 2 3; do
    for sp in 0 1; do
        for r in none selective needed; do
            flags=(--tensor-parallel 2 --data-parallel 2 --zero $z)
            [ $sp = 1 ] && flags+=(--sequence-parallel)
            # shellcheck disable=SC2046
            run "gpt2_tp2dp2_sp${sp}_z${z}_$r" gpt2 256 4 2 "${flags[@]}" $(recompute_flags $r)
        done
    done
done
for z in 0 1 2 3; do
    run "gpt2_pp2dp2_1f1b_z${z}_none" gpt2 256 4 8 --pipeline-parallel 2 --data-parallel 2 --zero $z
done
run gpt2_pp2dp2_1f1b_z1_needed gpt2 256 4 8 --pipeline-parallel 2 --data-parallel 2 --zero 1 \
    --recompute needed
for z in 1 2; do
    run "gpt2_pp2dp2_zbv_z${z}_none" gpt2 256 4 8 --pipeline-parallel 2 --data-parallel 2 \
        --zero $z --schedule zb-v
done
for z in 0 1 2 3; do
    run "small_dp2_z${z}_none" small 128 2 2 --data-parallel 2 --zero $z
done
for z in 1 3; do
    run "small_tp2dp2_sp1_z${z}_none" small 128 4 2 --tensor-parallel 2 --data-parallel 2 \
        --zero $z --sequence-parallel
done

python3 - "$OUT/runs" <<'PY'
import glob, json, os, statistics, sys
rows = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "memory.json"))):
    name = os.path.basename(os.path.dirname(path))
    ranks = json.load(open(path))["ranks"]
    worst = max(ranks, key=lambda r: abs(r["predicted"]["total"] - r["peak_rss"]) / r["peak_rss"])
    pred, meas = worst["predicted"]["total"], worst["peak_rss"]
    rows.append((name, worst["rank"], pred, meas, 100.0 * (pred - meas) / meas))
mib = 1048576.0
print(f"| mode | rank | predicted MiB | measured MiB | error |")
print(f"|---|---|---|---|---|")
for name, rank, pred, meas, err in rows:
    print(f"| {name} | {rank} | {pred / mib:.1f} | {meas / mib:.1f} | {err:+.1f} % |")
for model in ("gpt2", "small"):
    errs = [abs(r[4]) for r in rows if r[0].startswith(model + "_")]
    if errs:
        print(f"{model}: {len(errs)} modes, median |error| {statistics.median(errs):.1f} %, "
              f"worst {max(errs):.1f} %, within 10 %: {sum(e <= 10 for e in errs)}")
PY
