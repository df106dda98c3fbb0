#!/usr/bin/env bash
# bench/schedules.sh — issue 9's figures for the pipeline schedules (docs/results.md, "Pipeline
# schedules"): for `small` and gpt2 124M, pipeline-parallel 2 (and 4, reported but not a target:
# 4 ranks on this machine's 2 cores fill each other's bubbles), m = 4 and 8 micro-batches, each
# of 1f1b, interleaved (2 virtual stages per rank), zb-h1 and zb-v:
#   ms/step, tokens/s and MFU (medians over the steps after the first, from metrics.jsonl);
#   the bubble measured from the trace: the share of the step's pipeline part (first pipeline
#   action on any rank to the last) each rank spends not computing, averaged over the ranks;
#   the simulator's bubble (pipe_sim fed each virtual stage's median F, B, W from the same
#   trace, free links) and the paper's formula with equal stage times: 1F1B (p-1)/(m+p-1),
#   interleaved (p-1)/(v m+p-1), ZB-H1 with F = B = W (p-1)/(3m+p-1), ZB-V (p-1)/(6m+p-1).
# usage: bash bench/schedules.sh [small|gpt2|all] [OUT]   (build first: build/loom and
#        build/tests/pipe_sim); REUSE=1 keeps the runs already in OUT and only reports
# Every figure is printed with the command that made it. About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=${LOOM:-$ROOT/build/loom}
PIPE_SIM=${PIPE_SIM:-$ROOT/build/tests/pipe_sim}
what=${1:-all}
OUT=${2:-$ROOT/bench/out/schedules}
mkdir -p "$OUT"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1

corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
[ -n "$corpus" ] || corpus=/usr/share/common-licenses/GPL-3
data=$OUT/data
if [ ! -d "$data" ]; then
    cat $corpus >"$OUT/corpus.txt"
    "$LOOM" prepare --text "$OUT/corpus.txt" --out "$data" >"$OUT/prepare.log" 2>&1
fi

show() {
    echo "  \$ $*" | sed "s|$ROOT/||g"
    "$@"
}

# model-name micro-batch-size seq-len steps
bench_model() {
    local name=$1 micro=$2 seq=$3 steps=$4
    echo "== $name: micro-batch $micro x $seq tokens, $steps steps"
    for p in 2 4; do
        for m in 4 8; do
            for sched in 1f1b interleaved zb-h1 zb-v; do
                local run=$OUT/${name}_p${p}_m${m}_$sched extra=()
                [ "$sched" = interleaved ] && extra=(--virtual-stages 2)
                [ "${REUSE:-0}" = 1 ] && [ -s "$run/metrics.jsonl" ] && continue
                rm -rf "$run"
                show mpirun -np "$p" "$LOOM" train --model "$name" --pipeline-parallel "$p" \
                    --schedule "$sched" "${extra[@]}" --micro-batch-size "$micro" \
                    --global-batch-size $((micro * m)) --seq-len "$seq" --steps "$steps" \
                    --eval-every 0 --no-save --threads 1 --log-every 1 --data "$data/train_*.bin" \
                    --trace "$run/trace.json" --out "$run" >"$run.log" 2>&1 ||
                    echo "  failed: $(grep -m2 -i error "$run.log")"
            done
        done
    done
    python3 - "$OUT" "$name" "$PIPE_SIM" <<'PY'
import json, os, re, statistics, subprocess, sys
out, name, pipe_sim = sys.argv[1:4]
# MFU against one sgemm peak per rank count: the median of what the runs measured at their start
# (a run that started while the machine was busy would otherwise get a low peak and a high MFU)
def peak_of(run):
    m = re.search(r"sgemm peak ([0-9.]+) GFLOP/s", open(run + ".log").read()) if os.path.exists(run + ".log") else None
    return float(m.group(1)) if m else None
peaks = {p: statistics.median([x for x in (peak_of(f"{out}/{name}_p{p}_m{m}_{s}") for m in (4, 8)
                                for s in ("1f1b", "interleaved", "zb-h1", "zb-v")) if x] or [float("nan")])
         for p in (2, 4)}
print("MFU: (6 x parameters + attention) FLOPs x tokens/s against the sgemm peak, "
      + ", ".join(f"{peaks[p]:.1f} GFLOP/s for {p} ranks" for p in (2, 4)) + " (median of the runs' own measurements)")
COMPUTE = {"forward", "backward", "backward_input", "backward_weight"}
PIPELINE = COMPUTE | {"recv_act", "send_act", "recv_grad", "send_grad"}
print(f"{'p':>2} {'m':>2} {'schedule':12s} {'ms/step':>8s} {'tok/s':>7s} {'MFU':>6s}"
      f" {'bubble':>7s} {'simulated':>9s} {'formula':>8s}")
for p in (2, 4):
    for m in (4, 8):
        for sched in ("1f1b", "interleaved", "zb-h1", "zb-v"):
            run = f"{out}/{name}_p{p}_m{m}_{sched}"
            if not os.path.exists(run + "/metrics.jsonl"):
                why = open(run + ".log").read() if os.path.exists(run + ".log") else ""
                why = "n/a: more virtual stages than layers" if "at most" in why and "layer" in why else "(no run)"
                print(f"{p:2d} {m:2d} {sched:12s} {why}")
                continue
            recs = [json.loads(l) for l in open(run + "/metrics.jsonl")]
            steps = [r for r in recs if "ms" in r and r["step"] > 1]
            ms = statistics.median(r["ms"] for r in steps)
            tok = statistics.median(r["tokens_per_s"] for r in steps)
            # achieved FLOP/s from the run's own MFU and peak, then against the common peak
            mfu = statistics.median(r["mfu"] for r in steps) * (peak_of(run) or peaks[p]) / peaks[p]
            events = [e for e in json.load(open(run + "/trace.json"))["traceEvents"]
                      if e.get("ph") == "X" and e["name"] in PIPELINE and e.get("args", {}).get("step", 0) > 1]
            ranks = sorted({e["pid"] for e in events})
            bubbles = []
            for step in sorted({e["args"]["step"] for e in events}):
                mine = [e for e in events if e["args"]["step"] == step]
                span = max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)
                for r in ranks:
                    busy = sum(e["dur"] for e in mine if e["pid"] == r and e["name"] in COMPUTE)
                    bubbles.append(1 - busy / span)
            bubble = statistics.mean(bubbles)
            # the simulator, from each virtual stage's median durations
            v = 2 if sched in ("interleaved", "zb-v") else 1
            def med(op, s):
                d = [e["dur"] * 1e-6 for e in events if e["name"] == op and e["args"].get("stage", -1) == s]
                return statistics.median(d) if d else 0.0
            V = p * v
            f = [med("forward", s) for s in range(V)]
            if sched.startswith("zb"):
                bi, bw = [med("backward_input", s) for s in range(V)], [med("backward_weight", s) for s in range(V)]
                b = [x + y for x, y in zip(bi, bw)]
            else:
                b = [med("backward", s) for s in range(V)]
                bi = bw = [x / 2 for x in b]
            kind = f"interleaved:{v}" if sched == "interleaved" else sched
            j = lambda xs: ",".join(f"{x:.9f}" for x in xs)
            zeros = ",".join(["0"] * (V - 1)) if V > 1 else ""
            args = [pipe_sim, kind, str(m), j(f), j(b)] + ([zeros, zeros, j(bi), j(bw)] if V > 1 else [])
            lines = subprocess.run(args, capture_output=True, text=True).stdout.split("\n")
            try:
                makespan = float(lines[0])
                busy = [float(l.split()[3]) for l in lines[1:] if l.startswith("rank ")]
                simulated = statistics.mean(1 - x / makespan for x in busy)
            except (ValueError, IndexError, ZeroDivisionError):
                simulated = float("nan")
            formula = {"1f1b": (p - 1) / (m + p - 1), "interleaved": (p - 1) / (v * m + p - 1),
                       "zb-h1": (p - 1) / (3 * m + p - 1), "zb-v": (p - 1) / (6 * m + p - 1)}[sched]
            print(f"{p:2d} {m:2d} {sched:12s} {ms:8.1f} {tok:7.0f} {100 * mfu:5.1f}%"
                  f" {100 * bubble:6.1f}% {100 * simulated:8.1f}% {100 * formula:7.1f}%")
PY
}

case $what in
small) bench_model small 4 128 8 ;;
gpt2) bench_model gpt2 2 64 5 ;;
all) bench_model small 4 128 8 && bench_model gpt2 2 64 5 ;;
*) echo "usage: $0 [small|gpt2|all] [OUT]" >&2; exit 2 ;;
esac
