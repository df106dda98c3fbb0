#!/usr/bin/env bash
# bench/compression.sh — issue 8's figures for communication compression (docs/results.md, "Compression").
#   throughput  every compressor's GB/s of input on gpt2 124M's shapes (loom bench --compressors)
#   bytes       gpt2 124M, dp 2: DP bytes per step uncompressed and with PowerSGD rank 1/4/8,
#               top-k 1 %, sign, int8, bf16 (the runs' own dp_bytes / dp_bytes_raw); pipeline
#               backward bytes at (dp 1, pp 2), micro batch 4, sequence 64, low-rank rank 8
#   parity      `small` on the default corpus (fortunes), 2,000 steps: dp 2 with every method with
#               and without error feedback (sign: with only) beside 3 uncompressed seeds (the noise
#               band); (dp 2, pp 2) with compressed backpropagation (low-rank r8) with and without
#               lazy error propagation, and the policies all / epilogue / slack. Final validation
#               losses, and OUT/parity.svg with every curve
#   slow        step time on slow links (ip netns + tc, 1 Gbit/s and 100 Mbit/s; root) with a
#               model whose gradient is 43 MB (6 layers, width 384): dp 2 over one shaped link, and
#               (dp 2, pp 2) on two emulated hosts with DP or PP across them, without and with
#               compression; then time to the uncompressed run's final validation loss = steps
#               to that loss (from the parity runs) x step time on the slow link
#   width       PowerSGD rank 4 against uncompressed on a wider model (6 x 384, 1,000 steps)
# usage: bash bench/compression.sh [throughput|bytes|parity|slow|time-to-loss|width|all] [OUT]
# (build first)
# Every figure is printed with the command that made it; the parity runs take about an hour on 2
# cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=$ROOT/build/loom
what=${1:-all}
OUT=${2:-$ROOT/bench/out/compression}
mkdir -p "$OUT"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1

corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
data=$OUT/data
if [ ! -f "$data/.done" ]; then
    "$LOOM" prepare --text $corpus --out "$data" --seq-len 128 >/dev/null
    touch "$data/.done"
fi

# the value of KEY in the last record of RUN's metrics that has it
last() { python3 - "$1/metrics.jsonl" "$2" <<'PY'
import json, sys
v = [r[sys.argv[2]] for r in map(json.loads, open(sys.argv[1])) if sys.argv[2] in r]
print(v[-1] if v else "")
PY
}
show() { echo "\$ $*" >&2; "$@"; }

throughput() {
    echo "== compressor throughput"
    show "$LOOM" bench --compressors
}

bytes() {
    echo "== bytes per step, gpt2 124M, dp 2 (micro 1, seq 64, 3 steps; the last step's figures)"
    local gpt2=(--model gpt2 --micro-batch-size 1 --seq-len 64 --global-batch-size 2 --steps 3
        --threads 1 --data "$data/train_*.bin" --eval-every 0 --no-save --log-every 1)
    printf "%-14s %12s %12s %8s\n" method "sent MB" "raw MB" ratio
    for m in none powersgd:1 powersgd:4 powersgd:8 topk sign int8 bf16; do
        local flags=(--dp-compression "${m%%:*}")
        [ "${m%%:*}" = powersgd ] && flags+=(--dp-compression-rank "${m##*:}")
        [ "$m" = none ] && flags=(--no-zero1)
        local run=$OUT/bytes_${m/:/_}
        show mpirun -np 2 "$LOOM" train "${gpt2[@]}" "${flags[@]}" --out "$run" >"$run.log" 2>&1 ||
            { echo "  $m failed: $(tail -2 "$run.log")"; continue; }
        local sent raw
        sent=$(last "$run" dp_bytes) raw=$(last "$run" dp_bytes_raw)
        [ -z "$raw" ] && raw=$sent
        awk -v m="$m" -v s="$sent" -v r="$raw" 'BEGIN { printf "%-14s %12.2f %12.2f %7.1fx\n", m, s / 1e6, r / 1e6, r / s }'
    done
    echo "== pipeline backward bytes per step, gpt2 124M, (dp 1, pp 2), micro 4, seq 64, 2 micro-batches"
    local run=$OUT/bytes_pp_lowrank8
    show mpirun -np 2 "$LOOM" train --model gpt2 --micro-batch-size 4 --seq-len 64 --global-batch-size 8 \
        --steps 3 --threads 1 --data "$data/train_*.bin" --eval-every 0 --no-save --log-every 1 \
        --pipeline-parallel 2 --pp-compression lowrank --pp-compression-rank 8 --out "$run" >"$run.log" 2>&1
    local sent raw
    sent=$(last "$run" pp_grad_bytes) raw=$(last "$run" pp_grad_bytes_raw)
    awk -v s="$sent" -v r="$raw" 'BEGIN { printf "lowrank r8: %.3f MB sent, %.3f MB raw: %.1fx fewer\n", s / 1e6, r / 1e6, r / s }'
}

# ---- loss parity ----
small=(--model small --context 128 --seq-len 128 --data "$data/train_*.bin" --val-data "$data/val_*.bin"
    --steps 2000 --micro-batch-size 8 --global-batch-size 16 --lr 3e-3 --warmup-steps 200
    --eval-every 250 --eval-batches 16 --log-every 500 --threads 1 --no-save)
parity_runs_dp=(
    "none_seed1:--seed 1" "none_seed2:--seed 2" "none_seed3:--seed 3"
    "powersgd_ef:--seed 1 --dp-compression powersgd --dp-compression-rank 4"
    "powersgd_noef:--seed 1 --dp-compression powersgd --dp-compression-rank 4 --no-error-feedback"
    "topk_ef:--seed 1 --dp-compression topk"
    "topk_noef:--seed 1 --dp-compression topk --no-error-feedback"
    "int8_ef:--seed 1 --dp-compression int8"
    "int8_noef:--seed 1 --dp-compression int8 --no-error-feedback"
    "bf16_ef:--seed 1 --dp-compression bf16"
    "bf16_noef:--seed 1 --dp-compression bf16 --no-error-feedback"
    "sign_ef:--seed 1 --dp-compression sign"
    "powersgd_ef_warm200:--seed 1 --dp-compression powersgd --dp-compression-rank 4 --dp-compression-warmup-steps 200"
    "powersgd_ef_r8:--seed 1 --dp-compression powersgd --dp-compression-rank 8"
    "powersgd_ef_r16:--seed 1 --dp-compression powersgd --dp-compression-rank 16"
    "powersgd_ef_r32:--seed 1 --dp-compression powersgd --dp-compression-rank 32"
    # longer schedules, for the time to the uncompressed run's final loss (each method may
    # train for as many steps as it needs; the learning-rate schedule stretches with --steps)
    "powersgd_ef_r16_3000:--seed 1 --dp-compression powersgd --dp-compression-rank 16 --steps 3000"
    "powersgd_ef_r4_4000:--seed 1 --dp-compression powersgd --dp-compression-rank 4 --steps 4000")
# micro batch 4: 2 micro-batches per step and replica, so that 1F1B has a cool-down to single out
parity_runs_pp=(
    "pp_none:--seed 1"
    "pp_cb_lazy:--seed 1 --pp-compression lowrank --pp-compression-rank 8"
    "pp_cb_nolazy:--seed 1 --pp-compression lowrank --pp-compression-rank 8 --no-lazy-error"
    "pp_cb_epilogue:--seed 1 --pp-compression lowrank --pp-compression-rank 8 --pp-compression-policy epilogue"
    "pp_cb_slack:--seed 1 --pp-compression lowrank --pp-compression-rank 8 --pp-compression-policy slack")

parity() {
    echo "== loss parity: small, fortunes, 2000 steps, global batch 16 x 128"
    for r in "${parity_runs_dp[@]}"; do
        local name=${r%%:*} run=$OUT/parity_${r%%:*}
        # shellcheck disable=SC2086
        [ -f "$run/metrics.jsonl" ] && [ -n "$(last "$run" val_loss)" ] ||
            show mpirun -np 2 "$LOOM" train "${small[@]}" --data-parallel 2 ${r#*:} --out "$run" >"$run.log" 2>&1 ||
            echo "  $name failed: $(tail -2 "$run.log")"
    done
    for r in "${parity_runs_pp[@]}"; do
        local name=${r%%:*} run=$OUT/parity_${r%%:*}
        # shellcheck disable=SC2086
        [ -f "$run/metrics.jsonl" ] && [ -n "$(last "$run" val_loss)" ] ||
            show mpirun -np 4 "$LOOM" train "${small[@]}" --data-parallel 2 --pipeline-parallel 2 \
                --micro-batch-size 4 ${r#*:} \
                --out "$run" >"$run.log" 2>&1 || echo "  $name failed: $(tail -2 "$run.log")"
    done
    python3 - "$OUT" <<'PY'
import json, glob, os, sys, statistics
out = sys.argv[1]
runs = {}
for d in sorted(glob.glob(out + "/parity_*")):
    if not os.path.isdir(d) or not os.path.exists(d + "/metrics.jsonl"): continue
    recs = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    runs[os.path.basename(d)[7:]] = {
        "train": [(r["step"], r["loss"]) for r in recs if "loss" in r and r["loss"] is not None],
        "val": [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]}
base = [runs[k]["val"][-1][1] for k in ("none_seed1", "none_seed2", "none_seed3") if k in runs]
if not base: sys.exit("no uncompressed runs")
mean, lo, hi = statistics.mean(base), min(base), max(base)
print(f"uncompressed dp 2, 3 seeds: final validation loss {mean:.4f} (band {lo:.4f} .. {hi:.4f}, "
      f"spread {100 * (hi - lo) / mean:.2f} %)")
ref_pp = runs["pp_none"]["val"][-1][1] if runs.get("pp_none", {}).get("val") else None
for k, v in runs.items():
    if k.startswith("none_seed") or not v["val"]: continue
    final = v["val"][-1][1]
    ref = ref_pp if k.startswith("pp_") and ref_pp else runs["none_seed1"]["val"][-1][1]
    inside = "inside" if lo <= final <= hi else "outside"
    print(f"  {k:16s} {final:.4f}  {100 * (final / ref - 1):+6.2f} % vs its uncompressed run (seed 1), "
          f"{inside} the seed band")
# one SVG: every validation curve
W, H, L, B = 900, 520, 60, 40
steps = [s for v in runs.values() for s, _ in v["val"]]
vals = [x for v in runs.values() for _, x in v["val"]]
x0, x1, y0, y1 = 0, max(steps), min(vals), max(vals)
def X(s): return L + (W - L - 220) * (s - x0) / (x1 - x0 or 1)
def Y(v): return H - B - (H - B - 20) * (v - y0) / (y1 - y0 or 1)
colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d"]
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<text x="{L}" y="14">validation loss, small on fortunes, 2000 steps (compressed vs uncompressed)</text>',
       f'<line x1="{L}" y1="{H-B}" x2="{W-220}" y2="{H-B}" stroke="black"/><line x1="{L}" y1="20" x2="{L}" y2="{H-B}" stroke="black"/>']
for t in range(5):
    v = y0 + (y1 - y0) * t / 4
    svg.append(f'<text x="4" y="{Y(v)+4:.1f}">{v:.2f}</text>')
    s = x0 + (x1 - x0) * t / 4
    svg.append(f'<text x="{X(s)-10:.1f}" y="{H-B+16}">{s:.0f}</text>')
for i, (k, v) in enumerate(runs.items()):
    c = colors[i % len(colors)]
    pts = " ".join(f"{X(s):.1f},{Y(x):.1f}" for s, x in v["val"])
    svg.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{pts}"/>')
    svg.append(f'<text x="{W-210}" y="{30 + 16 * i}" fill="{c}">{k}</text>')
svg.append("</svg>")
open(out + "/parity.svg", "w").write("\n".join(svg))
print(f"curves: {out}/parity.svg")
PY
}

# ---- does a wider model close PowerSGD rank 4's gap? 6 layers of width 384, 1,000 steps ----
wide=(--layers 6 --d-model 384 --heads 6 --context 128 --seq-len 128 --data "$data/train_*.bin"
    --val-data "$data/val_*.bin" --steps 1000 --micro-batch-size 8 --global-batch-size 16 --lr 1e-3
    --warmup-steps 100 --eval-every 250 --eval-batches 16 --log-every 100 --threads 1 --no-save
    --data-parallel 2 --seed 1)
width() {
    echo "== PowerSGD rank 4 on a wider model: 6 x 384, dp 2, 1000 steps (about 15 min a run)"
    local loss base
    for r in "none:--no-zero1" "powersgd:--dp-compression powersgd --dp-compression-rank 4"; do
        local name=${r%%:*} run=$OUT/width_${r%%:*}
        # shellcheck disable=SC2086
        [ -f "$run/metrics.jsonl" ] && [ -n "$(last "$run" val_loss)" ] ||
            show mpirun -np 2 "$LOOM" train "${wide[@]}" ${r#*:} --out "$run" >"$run.log" 2>&1 ||
            { echo "  $name failed: $(tail -2 "$run.log")"; continue; }
        loss=$(last "$run" val_loss)
        [ "$name" = none ] && base=$loss
        awk -v n="$name" -v v="$loss" -v b="$base" 'BEGIN { printf "  %-9s final validation loss %.4f (%+.1f %%)\n", n, v, 100 * (v / b - 1) }'
    done
}

# ---- slow links ----
# Two settings, both in a network namespace of this machine (root):
#   one link   every rank's traffic goes through the namespace's loopback, shaped by tc (tbf)
#   two hosts  ranks get the address of an emulated host (10.9.1.1 on veth va, 10.9.2.1 on vb;
#              bench/host_of_rank.sh picks Open MPI's interface per rank): ranks of one host meet
#              over the unshaped loopback, ranks of different hosts through an htb class shaped
#              to the rate. (dp 2, pp 2): hosts 0,0,1,1 put the two stages on different hosts
#              (PP across hosts), 0,1,0,1 the two replicas (DP across hosts).
slow_model=(--layers 6 --d-model 384 --heads 6 --context 128 --seq-len 64 --micro-batch-size 4
    --global-batch-size 8 --threads 1 --data "$data/train_*.bin" --eval-every 0 --no-save --log-every 1)
ns=loom_cbench_$$
. "$ROOT/bench/netns.bash"
slow_run() { # name ranks hosts(or "") steps flags...
    local name=$1 np=$2 hosts=$3 steps=$4
    shift 4
    local run=$OUT/slow_$name
    echo "\$ $(netns_mpirun_text "$np" "$hosts") loom train ${slow_model[*]} --steps $steps $*" >&2
    netns_mpirun "$np" "$hosts" "$LOOM" train "${slow_model[@]}" --steps "$steps" "$@" --out "$run" \
        >"$run.log" 2>&1 || echo "  $name failed: $(tail -2 "$run.log")"
}

slow() {
    [ "$(id -u)" -eq 0 ] || { echo "slow: needs root (ip netns, tc)"; return 0; }
    echo "== step time on slow links: 6 layers, width 384 (43 MB of gradient), micro 4, seq 64"
    local psgd=(--dp-compression powersgd --dp-compression-rank 4)
    local cb=(--pp-compression lowrank --pp-compression-rank 8)
    for rate in 1gbit 100mbit; do
        local few=6
        [ "$rate" = 100mbit ] && few=4
        netns_one_link "$rate"
        slow_run "${rate}_link_dp2_none" 2 "" "$few" --data-parallel 2 --no-zero1
        slow_run "${rate}_link_dp2_powersgd" 2 "" 12 --data-parallel 2 "${psgd[@]}"
        slow_run "${rate}_link_dp2_powersgd_r16" 2 "" 12 --data-parallel 2 --dp-compression powersgd --dp-compression-rank 16
        ip netns del "$ns"
        netns_two_hosts "$rate"
        slow_run "${rate}_dpx_none" 4 0,1,0,1 "$few" --data-parallel 2 --pipeline-parallel 2 --no-zero1
        slow_run "${rate}_dpx_powersgd" 4 0,1,0,1 12 --data-parallel 2 --pipeline-parallel 2 "${psgd[@]}"
        slow_run "${rate}_dpx_powersgd_r16" 4 0,1,0,1 12 --data-parallel 2 --pipeline-parallel 2 --dp-compression powersgd --dp-compression-rank 16
        slow_run "${rate}_ppx_none" 4 0,0,1,1 "$few" --data-parallel 2 --pipeline-parallel 2 --no-zero1
        slow_run "${rate}_ppx_cb" 4 0,0,1,1 "$few" --data-parallel 2 --pipeline-parallel 2 --no-zero1 "${cb[@]}"
        slow_run "${rate}_ppx_cb_epilogue" 4 0,0,1,1 "$few" --data-parallel 2 --pipeline-parallel 2 --no-zero1 "${cb[@]}" --pp-compression-policy epilogue
        slow_run "${rate}_ppx_cb_slack" 4 0,0,1,1 "$few" --data-parallel 2 --pipeline-parallel 2 --no-zero1 "${cb[@]}" --pp-compression-policy slack
        ip netns del "$ns"
    done
    time_to_loss
}

# Time to the uncompressed run's final validation loss: steps to it (from the parity runs, which
# do not depend on the link) x the slow runs' step time. Reads outputs only.
time_to_loss() {
    python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
def step_s(name):  # median over the steps after the first
    path = f"{out}/slow_{name}/metrics.jsonl"
    if not os.path.exists(path): return None
    ms = [r["ms"] for r in map(json.loads, open(path)) if "ms" in r and r["step"] > 1]
    return statistics.median(ms) / 1e3 if ms else None
def val_curve(run):  # [] when the run has not been made
    path = f"{out}/parity_{run}/metrics.jsonl"
    if not os.path.exists(path): return []
    return [(r["step"], r["val_loss"]) for r in map(json.loads, open(path)) if "val_loss" in r]
def steps_to(run, target):  # the first validation at or below target (None: not within the run)
    for s, v in val_curve(run):
        if v <= target: return s
    return None
pairs = [("link_dp2", "none_seed1", "powersgd", "powersgd_ef"),
         ("link_dp2", "none_seed1", "powersgd", "powersgd_ef_warm200"),
         ("link_dp2", "none_seed1", "powersgd_r16", "powersgd_ef_r16"),
         ("link_dp2", "none_seed1", "powersgd", "powersgd_ef_r4_4000"),
         ("link_dp2", "none_seed1", "powersgd_r16", "powersgd_ef_r16_3000"),
         ("dpx", "none_seed1", "powersgd", "powersgd_ef"),
         ("dpx", "none_seed1", "powersgd_r16", "powersgd_ef_r16"),
         ("dpx", "none_seed1", "powersgd", "powersgd_ef_r4_4000"),
         ("dpx", "none_seed1", "powersgd_r16", "powersgd_ef_r16_3000"),
         ("ppx", "pp_none", "cb", "pp_cb_lazy"),
         ("ppx", "pp_none", "cb_epilogue", "pp_cb_epilogue"),
         ("ppx", "pp_none", "cb_slack", "pp_cb_slack")]
for layout, ref, method, parity in pairs:
    if not val_curve(ref) or not val_curve(parity):
        print(f"{layout:8s} {parity:20s} (no parity run yet: bash bench/compression.sh parity)")
        continue
    target = val_curve(ref)[-1][1]
    n_ref, n_c = steps_to(ref, target), steps_to(parity, target)
    for rate in ("1gbit", "100mbit"):
        a, b = step_s(f"{rate}_{layout}_none"), step_s(f"{rate}_{layout}_{method}")
        if not a or not b: continue
        warm = 200 if "warm200" in parity else 0  # those steps run uncompressed
        if n_c:
            tc = min(warm, n_c) * a + max(n_c - warm, 0) * b
            t = f"time to val loss {target:.4f}: {n_ref * a / 60:.1f} min vs {tc / 60:.1f} min = {n_ref * a / tc:.1f}x shorter"
        else:
            # the other way round: how long the uncompressed run takes to reach the compressed
            # run's final loss (validations every 250 steps, linear in between)
            last = val_curve(parity)[-1]
            prev, n_back = (0, 99.0), None
            for s, v in val_curve(ref):
                if v <= last[1]:
                    n_back = prev[0] + (s - prev[0]) * (prev[1] - last[1]) / (prev[1] - v)
                    break
                prev = (s, v)
            t = f"{parity} does not reach {target:.4f} in {last[0]} steps (ends at {last[1]:.4f})"
            if n_back:
                tc = min(warm, last[0]) * a + max(last[0] - warm, 0) * b
                t += (f"; to {last[1]:.4f}: uncompressed {n_back * a / 60:.1f} min (step {n_back:.0f}) "
                      f"vs {tc / 60:.1f} min = {n_back * a / tc:.1f}x shorter")
        print(f"{rate:7s} {layout:8s} {parity:20s} step {a:.3f} s -> {b:.3f} s ({a / b:.1f}x); {t}")
PY
}

case $what in
throughput) throughput ;;
bytes) bytes ;;
parity) parity ;;
slow) slow ;;
time-to-loss) time_to_loss ;;
width) width ;;
all) throughput && bytes && parity && slow ;;
*) echo "usage: $0 [throughput|bytes|parity|slow|time-to-loss|width|all] [OUT]" >&2; exit 2 ;;
esac
