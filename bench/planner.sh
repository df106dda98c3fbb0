#!/usr/bin/env bash
# bench/planner.sh — the cost model against measurement (issue 10, part 5). Profiles this
# machine's 2 ranks once (loom profile --threads 1; kept in OUT), then:
#   schedules  predicts every pipeline layout bench/schedules.sh measured (small and gpt2 124M,
#              pp 2, m 4 and 8, every schedule; its outputs are read, not rerun)
#   layouts    measures every layout of 1 and 2 ranks (1 thread each) for small (global batch
#              16 x 128) and gpt2 (8 x 64) with `loom bench --train`, 3 runs each, the median of
#              the runs' median step times (kept in OUT/layouts; a layout measured before is not
#              rerun), beside the prediction of `loom plan --predict`; the largest resident set
#              of any rank (/usr/bin/time) beside the predicted peak; then the planner's own pick
#              (loom plan --devices 2 on the profile) against the fastest measured layout
#   slow       in network namespaces (100 Mbit/s and 1 Gbit/s; one shaped link for 2 ranks, two
#              emulated hosts for 4): loom profile there, the planner's pick without and with
#              --allow-compression all, each trained there: predicted vs measured (root)
#   megatron   Megatron-LM SC'21 Table 1's layouts predicted on clusters/dgx-a100.json, TFLOP/s
#              per GPU by Megatron's count against the published, and the planner's own choice
# Errors are (predicted - measured) / measured; every layout is printed, the bad ones too.
# usage: bash bench/planner.sh [schedules|layouts|megatron|slow] [OUT]   (build first)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=${LOOM:-$ROOT/build/loom}
what=${1:-schedules}
OUT=${2:-$ROOT/bench/out/planner}
RUNS=$ROOT/bench/out/schedules
mkdir -p "$OUT"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
cluster=$OUT/local2.json
if [ ! -s "$cluster" ]; then
    echo "  \$ mpirun -np 2 loom profile --threads 1 --out $cluster"
    mpirun -np 2 "$LOOM" profile --threads 1 --out "$cluster" >"$OUT/profile.log" 2>&1
fi
schedules() {
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
}

# ---- every layout of 1 and 2 ranks, measured and predicted ----
# name:model:global:seq:ranks:flags (flags of both loom plan and loom bench --train)
layout_list() {
    local m g t
    for spec in small:16:128 gpt2:8:64; do
        IFS=: read -r m g t <<<"$spec"
        local b1=$((g / 4)) b2=$((g / 2))
        echo "$m-r1-mb$b1:$m:$g:$t:1:--micro-batch-size $b1"
        echo "$m-r1-mb$b2:$m:$g:$t:1:--micro-batch-size $b2"
        echo "$m-r1-mb$g:$m:$g:$t:1:--micro-batch-size $g"
        echo "$m-dp2-mb$b1:$m:$g:$t:2:--dp 2 --micro-batch-size $b1 --no-zero1"
        echo "$m-dp2-mb$b1-zero1:$m:$g:$t:2:--dp 2 --micro-batch-size $b1 --zero1"
        echo "$m-dp2-mb$b2-zero1:$m:$g:$t:2:--dp 2 --micro-batch-size $b2 --zero1"
        echo "$m-tp2-mb$b2:$m:$g:$t:2:--tp 2 --micro-batch-size $b2"
        echo "$m-tp2-mb$g:$m:$g:$t:2:--tp 2 --micro-batch-size $g"
        for s in 1f1b interleaved zb-h1 zb-v; do
            echo "$m-pp2-$s:$m:$g:$t:2:--pp 2 --micro-batch-size $b1 --schedule $s"
        done
        echo "$m-pp2-1f1b-recompute:$m:$g:$t:2:--pp 2 --micro-batch-size $b1 --recompute"
        echo "$m-pp2-1f1b-mb$b2:$m:$g:$t:2:--pp 2 --micro-batch-size $b2"
    done
}

# loom plan's spelling of a layout's flags, and loom train's
plan_flags() { sed -e 's/--no-zero1//; s/--zero1//' <<<"$1"; }
train_flags() {
    sed -e 's/--dp /--data-parallel /; s/--tp /--tensor-parallel /; s/--pp /--pipeline-parallel /' <<<"$1"
}

measure() { # NAME MODEL GLOBAL SEQ RANKS FLAGS -> OUT/layouts/NAME.runs (ms and peak KiB per run)
    local name=$1 model=$2 g=$3 t=$4 ranks=$5 flags=$6 dir=$OUT/layouts
    mkdir -p "$dir"
    [ -f "$dir/$name.runs" ] && [ "$(wc -l <"$dir/$name.runs")" -ge 3 ] && return 0
    : >"$dir/$name.runs"
    local launch=()
    [ "$ranks" -gt 1 ] && launch=(mpirun -np "$ranks")
    for run in 1 2 3; do
        # shellcheck disable=SC2046
        "${launch[@]}" /usr/bin/time -f "peak_kib %M" -o "$dir/$name.time.%q{OMPI_COMM_WORLD_RANK}" \
            "$LOOM" bench --train --model "$model" --global-batch-size "$g" --seq-len "$t" \
            --threads 1 --steps 8 --warmup 2 --out "$dir/$name.out" $(train_flags "$flags") \
            >"$dir/$name.log" 2>&1 </dev/null || { echo "  $name run $run failed: $(tail -2 "$dir/$name.log")"; return 0; }
        local ms peak
        ms=$(sed -n 's/.*| *\([0-9.]*\) ms\/step |.*/\1/p' "$dir/$name.log" | tail -1)
        peak=$(cat "$dir/$name.time."* 2>/dev/null | sed -n 's/peak_kib //p' | sort -n | tail -1)
        rm -f "$dir/$name.time."*
        echo "$ms $peak" >>"$dir/$name.runs"
    done
}

layouts() {
    local cluster=$OUT/local2.json
    echo "== every layout of 1 and 2 ranks (1 thread each), predicted on $cluster vs measured"
    echo "   (medians of 3 runs of loom bench --train --steps 8 --warmup 2)"
    layout_list | while IFS=: read -r name model g t ranks flags; do
        measure "$name" "$model" "$g" "$t" "$ranks" "$flags"
        local plan=$OUT/layouts/$name.plan.json zero1=()
        grep -q -- "--zero1" <<<"$flags" && zero1=(--zero1)
        grep -q -- "--no-zero1" <<<"$flags" && zero1=(--no-zero1)
        # shellcheck disable=SC2046
        "$LOOM" plan --model "$model" --global-batch-size "$g" $(plan_flags "$flags") \
            --out "$plan" >/dev/null </dev/null || { echo "$name: loom plan failed"; continue; }
        local pred
        "$LOOM" plan --predict "$plan" --cluster "$cluster" --seq-len "$t" "${zero1[@]}" \
            --out "$plan.predicted" >/dev/null || { echo "$name: loom plan --predict failed"; continue; }
        pred=$(python3 -c "
import json; p = json.load(open('$plan.predicted'))['predicted']
print(p['step_s'], max(p['peak_bytes_per_rank']) / 2**30)")
        echo "$name $pred $(tr '\n' ' ' <"$OUT/layouts/$name.runs")"
    done | python3 -c '
import statistics, sys
errs, mem = {}, []
rows = []
for line in sys.stdin:
    f = line.split()
    if len(f) < 5:
        print(line.rstrip()); continue
    name, pred, pred_gib = f[0], float(f[1]), float(f[2])
    runs = [(float(f[i]), float(f[i + 1])) for i in range(3, len(f) - 1, 2)]
    meas = statistics.median(r[0] for r in runs) / 1e3
    peak = max(r[1] for r in runs) / 1048576  # GiB
    err = 100 * (pred - meas) / meas
    merr = 100 * (pred_gib - peak) / peak
    errs[name] = err
    if name.startswith("gpt2"): mem.append(abs(merr))
    rows.append((name, meas))
    print(f"{name:26s} predicted {pred*1e3:8.1f} ms  measured {meas*1e3:8.1f} ms  error {err:+6.1f}%   "
          f"memory predicted {pred_gib:6.3f} GiB  measured {peak:6.3f} GiB ({merr:+5.1f}%)")
a = [abs(e) for e in errs.values()]
if a:
    print(f"step time: median |error| {statistics.median(a):.1f}% over {len(a)} layouts, worst {max(a):.1f}%")
for m in ("small", "gpt2"):
    r = [x for x in rows if x[0].startswith(m + "-") and "-r1-" not in x[0]]
    if r:
        best = min(r, key=lambda x: x[1])
        print(f"{m}: fastest measured 2-rank layout {best[0]} ({best[1]*1e3:.1f} ms)")
if mem:
    print(f"gpt2 peak memory: median |error| {statistics.median(mem):.1f}%, worst {max(mem):.1f}%")
'
    for spec in small:16:128 gpt2:8:64; do
        IFS=: read -r model g t <<<"$spec"
        echo "\$ loom plan --model $model --cluster $cluster --devices 2 --global-batch-size $g --seq-len $t"
        "$LOOM" plan --model "$model" --cluster "$cluster" --devices 2 --global-batch-size "$g" \
            --seq-len "$t" --out "$OUT/layouts/pick_$model.json" | sed -n '1,4p'
    done
}

# ---- Megatron-LM SC'21 Table 1 (REFERENCE.md) on the DGX A100 description ----
megatron() {
    local cluster=$ROOT/clusters/dgx-a100.json dir=$OUT/megatron
    mkdir -p "$dir"
    echo "== Megatron-LM SC'21 Table 1: the published layouts predicted on $cluster (bf16, micro 1,"
    echo "   interleaved with the fewest chunks (>= 2) that divide a stage's layers where p > 1,"
    echo "   full recomputation (--recompute-always: the forward rerun before every backward, as"
    echo "   Megatron's count and time include), the gradient sync after the backward and AdamW"
    echo "   unsharded (Megatron-LM's local DDP and optimizer of 2021: --no-overlap-grad-reduce,"
    echo "   --no-zero1)), TFLOP/s per GPU by Megatron's count, and the"
    echo "   planner's own choice for the same model, GPUs and batch"
    # params heads hidden layers t p GPUs batch published-TFLOP/s
    while read -r name a h l t p n b pub; do
        local d=$((n / (t * p))) sched=(--schedule 1f1b) v=2
        # interleaved with the fewest chunks >= 2 that divide each stage's layers, as Megatron
        # requires (the paper does not say v; 76.1B and 529.6B cannot use 2: 15 and 3 layers)
        while [ $((l % (p * v))) -ne 0 ]; do v=$((v + 1)); done
        [ "$p" -gt 1 ] && sched=(--schedule interleaved --virtual-stages "$v")
        local model=(--model gpt3-175b --layers "$l" --heads "$a" --d-model "$h" --context 2048 --vocab 51200)
        "$LOOM" plan "${model[@]}" --dp "$d" --tp "$t" --pp "$p" --micro-batch-size 1 \
            --global-batch-size "$b" "${sched[@]}" --recompute-always --no-overlap-grad-reduce \
            --out "$dir/$name.json" >/dev/null </dev/null ||
            { echo "$name: loom plan failed"; continue; }
        "$LOOM" plan --predict "$dir/$name.json" --cluster "$cluster" --precision bf16 --seq-len 2048 \
            --no-zero1 --out "$dir/$name.pred.json" >/dev/null </dev/null || { echo "$name: --predict failed"; continue; }
        local t0 t1
        t0=$(date +%s.%N)
        "$LOOM" plan "${model[@]}" --cluster "$cluster" --devices "$n" --global-batch-size "$b" \
            --seq-len 2048 --precision bf16 --out "$dir/$name.pick.json" >"$dir/$name.pick.log" </dev/null ||
            { echo "$name: the search failed: $(tail -1 "$dir/$name.pick.log")"; continue; }
        t1=$(date +%s.%N)
        python3 - "$dir/$name.pred.json" "$dir/$name.pick.json" "$name" "$pub" "$t0" "$t1" <<'PY'
import json, sys
pred, pick = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
name, pub, secs = sys.argv[3], float(sys.argv[4]), float(sys.argv[6]) - float(sys.argv[5])
m = pred["model"]; B, s, l, h, V = pred["batch"]["global"], 2048, m["layers"], m["d_model"], 51200
F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))  # Megatron's count, per iteration
def tflops(p):
    n = p["mesh"]["dp"] * p["mesh"]["tp"] * p["mesh"]["pp"]
    return F / p["predicted"]["step_s"] / n / 1e12
a, c = tflops(pred), tflops(pick)
k = pick["mesh"]
words = sorted({str(st.get("recompute", "none")) for st in pick["stages"]} - {"none", "False"})
extra = f" zero {k.get('zero', 0)}" + (" sp" if k.get("sequence_parallel") else "")
extra += f" recompute {'+'.join(words)}" if words else ""
print(f"{name:7s} published {pub:5.0f}  predicted {a:6.1f} ({100 * (a - pub) / pub:+5.1f}%)  "
      f"planner: dp {k['dp']} tp {k['tp']} pp {k['pp']} micro {pick['batch']['micro']} "
      f"{pick['batch']['schedule']}{extra} -> {c:6.1f} "
      f"({'at least as fast' if c >= a * (1 - 1e-9) else 'SLOWER'}; searched in {secs:.1f} s)")
PY
    done <<'ROWS'
1.7B 24 2304 24 1 1 32 512 137
3.6B 32 3072 30 2 1 64 512 138
7.5B 32 4096 36 4 1 128 512 142
18.4B 48 6144 40 8 1 256 1024 135
39.1B 64 8192 48 8 2 512 1536 138
76.1B 80 10240 60 8 4 1024 1792 140
145.6B 96 12288 80 8 8 1536 2304 148
310.1B 128 16384 96 8 16 1920 2160 155
529.6B 128 20480 105 8 35 2520 2520 163
1008B 160 25600 128 8 64 3072 3072 163
ROWS
}

# ---- slow links: the planner with and without compression (root: ip netns, tc) ----
ns=loom_pbench_$$
slow() {
    [ "$(id -u)" -eq 0 ] || { echo "slow: needs root (ip netns, tc)"; return 0; }
    . "$ROOT/bench/netns.bash"
    local dir=$OUT/slow data=$OUT/slow/data
    mkdir -p "$dir"
    if [ ! -f "$data/.done" ]; then
        "$LOOM" prepare --text $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort) \
            --out "$data" --seq-len 64 >/dev/null
        touch "$data/.done"
    fi
    local model=(--model small --layers 6 --d-model 384 --heads 6 --context 128)
    echo "== slow links: 6 layers, width 384 (43 MB of gradient), global batch 8 x 64; each setting"
    echo "   profiled in its namespace (loom profile --quick), then the planner without and with"
    echo "   --allow-compression all, each pick trained 5 steps there (median after the first)"
    for setting in 100mbit:link:2 1gbit:link:2 100mbit:hosts:4 1gbit:hosts:4; do
        IFS=: read -r rate kind np <<<"$setting"
        local hosts="" pretend=() name=${rate}_$kind
        if [ "$kind" = link ]; then netns_one_link "$rate"; else netns_two_hosts "$rate"; hosts=0,0,1,1; pretend=(--pretend-hosts 2); fi
        netns_mpirun "$np" "$hosts" "$LOOM" profile --quick --threads 1 "${pretend[@]}" \
            --out "$dir/$name.cluster.json" >"$dir/$name.profile.log" 2>&1 </dev/null ||
            { echo "$name: profile failed: $(tail -2 "$dir/$name.profile.log")"; ip netns del "$ns"; continue; }
        for allow in none all; do
            local pick=$dir/${name}_$allow.json
            "$LOOM" plan "${model[@]}" --cluster "$dir/$name.cluster.json" --devices "$np" \
                --global-batch-size 8 --seq-len 64 --allow-compression "$allow" --out "$pick" \
                >"$pick.log" 2>&1 </dev/null || { echo "$name $allow: plan failed: $(tail -1 "$pick.log")"; continue; }
            netns_mpirun "$np" "$hosts" "$LOOM" train --plan "$pick" --data "$data/train_*.bin" \
                --seq-len 64 --steps 5 --threads 1 --eval-every 0 --no-save --log-every 1 \
                --out "$dir/${name}_$allow.run" >"$dir/${name}_$allow.run.log" 2>&1 </dev/null ||
                { echo "$name $allow: train failed: $(tail -2 "$dir/${name}_$allow.run.log")"; continue; }
            python3 - "$pick" "$dir/${name}_$allow.run/metrics.jsonl" "$name" "$allow" <<'PY'
import json, statistics, sys
p = json.load(open(sys.argv[1]))
ms = [r["ms"] for r in map(json.loads, open(sys.argv[2])) if "ms" in r and r["step"] > 1]
meas, pred = statistics.median(ms) / 1e3, p["predicted"]["step_s"]
m, c = p["mesh"], p.get("compression", {})
def text(k, v):
    t = f"{k} {v['method']}{v.get('rank', '')}"
    if v.get("policy", "all") != "all": t += f" {v['policy']}"
    for key in ("stages", "links"):
        if key in v: t += f" {key} " + ",".join(map(str, v[key]))
    return t
comp = ", ".join(text(k, v) for k, v in c.items()
                 if isinstance(v, dict) and v.get("method", "none") != "none") or "none"
print(f"{sys.argv[3]:14s} allow {sys.argv[4]:4s}: dp {m['dp']} tp {m['tp']} pp {m['pp']} micro "
      f"{p['batch']['micro']} {p['batch']['schedule']}, compression {comp:22s} predicted "
      f"{pred:7.3f} s  measured {meas:7.3f} s  error {100 * (pred - meas) / meas:+6.1f}%")
PY
        done
        ip netns del "$ns"
    done
}

case $what in
schedules) schedules ;;
layouts) layouts ;;
megatron) megatron ;;
slow) slow ;;
*) echo "usage: bash bench/planner.sh [schedules|layouts|megatron|slow] [OUT]" >&2; exit 2 ;;
esac
