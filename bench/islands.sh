#!/usr/bin/env bash
# Islands (DiLoCo) against data parallelism on this machine: loss parity and bytes.
#
# `small` (context 128) on the default corpus (the fortunes database, as scripts/demo.sh), 4
# ranks, global batch 16 of 128 bytes, the demo's AdamW schedule (lr 3e-3, 200 warm-up steps)
# for STEPS steps (2000), validation every 250 steps on 32 windows: data parallelism on 4 ranks
# (fp32 ring all-reduce, no ZeRO) against 4 islands of 1 rank (outer Nesterov, lr 0.7, momentum
# 0.9) for every row of ROWS, each with every seed of SEEDS (the weights' and the data order's).
# Prints each run's final validation loss, its ratio to data parallelism's (same seed), and the
# bytes it sent between islands (data parallelism: between its ranks) per token trained; draws
# every run's validation curve into OUT/islands.svg (bench/curves.py).
#
# SLOW=RATES (root; e.g. SLOW="100mbit 10mbit"): instead, time on slow links. The compression
# benchmark's 6 x 384 model (43 MB of gradient; micro 4, sequence 64, global 16), 4 ranks whose
# every byte crosses one link shaped to each rate (ip netns + tc, bench/netns.bash, TCP): data
# parallelism (fp32 ring all-reduce), data parallelism with PowerSGD rank 16, and 4 islands of 1
# rank at H = 100 with int8 and with fp32 outer gradients (100 steps: one outer sync; the data-
# parallel runs 4 and 10 steps), and with int8 overlapped by TAUS steps (4 8 16). Prints each
# run's median and mean step time (the mean carries the sync), the islands' seconds in outer
# syncs, the time exposed (the step times from the send to the apply beyond the median step
# before the first sync), and the cost model's step (its mean, the sync's share in it) and
# exposed time per sync, for the same plan on a profile of this machine's 4 ranks (loom profile; CLUSTER=FILE reuses one) with
# the link described as the rate shared by the 4 ranks. ISLANDS=K: K ranks and K islands instead
# of 4 (global batch 4K; ISLANDS=2 keeps one rank a core on this 2-core machine, where the
# profile's figures hold: with 4 ranks on 2 cores they are reported, not targeted), its runs
# and profile named slow_RATE_kK_* and profile_kK.json.
#
# TTL=1: time to data parallelism's final validation loss on the 6 x 384 model. On shared memory
# (the arithmetic does not depend on the link): data parallelism on 4 ranks for TTL_STEPS (1000)
# steps sets the target; DP with PowerSGD r16 and 4 islands (int8, H 50 and 100) train stretched
# schedules (--steps grows, the cosine with it), shortest first, until one reaches the target;
# steps-to-loss = its first validation step at or under it. Times a step come from SLOW's runs in
# the same OUT (islands: the median step before the sync + the sync's exposed time / H, the best
# of the overlaps measured), so run both: SLOW="100mbit 10mbit" TTL=1 OUT=DIR bash bench/islands.sh
#
# WARM=N: a warm start, as DiLoCo's paper trains: data parallelism saves its step-N checkpoint,
# and every islands row resumes from it (each island starts from its model and AdamW state, the
# schedule and the data where data parallelism left them) for the remaining steps.
#
# usage: bash bench/islands.sh              (build first: bash scripts/build.sh)
#        WARM=500 ROWS="h50:--inner-steps 50" bash bench/islands.sh
#        STEPS=1000 SEEDS="1 2 3" ROWS="h50:--inner-steps 50" bash bench/islands.sh
#        SLOW="100mbit 10mbit" bash bench/islands.sh
#        SLOW=100mbit ONLY=tau TAUS="4 8" bash bench/islands.sh   (ONLY: the rows whose name matches)
#        SLOW="100mbit 10mbit" TTL=1 OUT=DIR bash bench/islands.sh   (DP_SLOW_STEPS=3: fewer DP steps)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=$PWD/build/loom
STEPS=${STEPS:-2000}
SEEDS=${SEEDS:-1}
ROWS=${ROWS:-"h10:--inner-steps 10;h50:--inner-steps 50;h100:--inner-steps 100;h500:--inner-steps 500;h100_f4:--inner-steps 100 --outer-fragments 4;h50_int8:--inner-steps 50 --outer-compression int8;h100_int8:--inner-steps 100 --outer-compression int8"}
OUT=${OUT:-$(mktemp -d)}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) cores; runs in $OUT"
data=$OUT/data
if [ ! -d "$data" ]; then
    corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
    # shellcheck disable=SC2086
    "$LOOM" prepare --text $corpus --out "$data" --seq-len 128 >/dev/null
fi
common=(--model small --context 128 --seq-len 128 --data "$data/train_*.bin"
    --val-data "$data/val_*.bin" --steps "$STEPS" --micro-batch-size 4 --global-batch-size 16
    --lr 3e-3 --warmup-steps 200 --eval-every 250 --eval-batches 2 --log-every 500 --threads 1
    --no-save)

# final validation loss, and bytes per token (KEY summed over the run)
# (of a run that reached STEPS: one stopped early has none)
final_val() { jq -r --argjson n "$STEPS" 'select(has("val_loss") and .step == $n) | .val_loss' "$1/metrics.jsonl" 2>/dev/null | tail -1; }
bytes_per_token() {
    jq -s --arg k "$2" --argjson t $((16 * 128)) '[.[] | select(has($k)) | .[$k]] | add / (length * $t)' \
        "$1/metrics.jsonl"
}

run() { # name flags...
    local name=$1
    shift
    if [ -f "$OUT/$name/metrics.jsonl" ] && [ -n "$(final_val "$OUT/$name")" ]; then return 0; fi
    echo "== $name: mpirun -np 4 loom train ${common[*]} $*" >&2
    mpirun -np 4 "$LOOM" train "${common[@]}" "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1 ||
        echo "   $name failed: $(tail -2 "$OUT/$name.log")" >&2
}

if [ -n "${SLOW:-}" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "SLOW: needs root (ip netns, tc)" >&2; exit 1; }
    ROOT=$PWD
    ns=loom_ibench_$$
    . "$ROOT/bench/netns.bash"
    trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
    # (a generous --comm-timeout: at 10 Mbit/s a data-parallel step takes minutes, and the
    # liveness pings queue behind its all-reduce on the same connections)
    K=${ISLANDS:-4}
    tag=$([ "$K" -eq 4 ] || echo "k${K}_")
    slow_model=(--layers 6 --d-model 384 --heads 6 --context 128 --seq-len 64 --micro-batch-size 4
        --global-batch-size $((4 * K)) --threads 1 --data "$data/train_*.bin" --eval-every 0 --no-save
        --log-every 1000 --comm-timeout 3600)
    # the cost model's view of this machine: a profile of the 4 ranks (CLUSTER=FILE reuses one)
    cluster=${CLUSTER:-$OUT/profile${tag:+_${tag%_}}.json}
    if [ ! -f "$cluster" ]; then
        mpirun -np "$K" "$LOOM" profile --threads 1 --out "$cluster" >"${cluster%.json}.log" 2>&1 ||
            { echo "loom profile failed: $(tail -2 "${cluster%.json}.log")" >&2; exit 1; }
    fi
    printf '%-9s %-20s %10s %10s %8s %10s %10s %10s %12s\n' link run "median ms" "mean ms" "outer s" \
        "exposed s" "last isl. s" "pred. ms" "pred. exp s"
    # rows: name:steps:flags; steps enough for the medians and, for islands, one outer sync
    # landing inside the run (100 + overlap + 5)
    rows=("dp:${DP_SLOW_STEPS:-4}:--data-parallel $K --zero 0"
        "dp_psgd16:10:--data-parallel $K --dp-compression powersgd --dp-compression-rank 16"
        "isl_h50_int8:50:--islands $K --inner-steps 50 --outer-compression int8"
        "isl_h100_int8:100:--islands $K --inner-steps 100 --outer-compression int8"
        "isl_h100:100:--islands $K --inner-steps 100")
    for tau in ${TAUS:-4 8 16}; do
        rows+=("isl_h100_int8_tau$tau:$((105 + tau)):--islands $K --inner-steps 100 --outer-compression int8 --outer-overlap-steps $tau")
    done
    for rate in $SLOW; do
        netns_one_link "$rate"
        # the link as the cost model sees it: the rate shared by the K ranks, no latency
        bytes_s=$(awk -v r="$rate" -v k="$K" 'BEGIN { n = r + 0; u = substr(r, length(n "") + 1);
            m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; print n * m / 8 / k }')
        jq --argjson b "$bytes_s" --arg k "$K" '. + {islands: {nodes: 1, link: {bandwidth: $b, latency_s: 0,
            source: "bench/islands.sh: the tc-shaped link shared by \($k) ranks"}}}' "$cluster" \
            >"$OUT/cluster_$tag$rate.json"
        for r in "${rows[@]}"; do
            IFS=: read -r name steps flagtext <<<"$r"
            [[ $name =~ ${ONLY:-.} ]] || continue
            read -r -a flags <<<"$flagtext"
            h=$(sed -n 's/.*--inner-steps \([0-9]*\).*/\1/p' <<<"$flagtext")
            run=$OUT/slow_${rate}_$tag$name
            echo "== $name on $rate: $(netns_mpirun_text "$K" "") loom train ${slow_model[*]} --steps $steps ${flags[*]}" >&2
            netns_mpirun "$K" "" "$LOOM" train "${slow_model[@]}" --steps "$steps" "${flags[@]}" --out "$run" \
                >"$run.log" 2>&1 || { echo "   $name failed: $(tail -2 "$run.log")" >&2; continue; }
            # the prediction: the same plan (islands: their syncs over the link), on the profile
            pred="- -"
            if [ "${name#isl}" != "$name" ] &&
                "$LOOM" plan "${slow_model[@]:0:8}" --global-batch-size $((4 * K)) --micro-batch-size 4 \
                    --dp 1 "${flags[@]}" --out "$run.plan.json" >/dev/null 2>&1 &&
                "$LOOM" plan --predict "$run.plan.json" --cluster "$OUT/cluster_$tag$rate.json" \
                    --seq-len 64 >"$run.predict.txt" 2>&1; then
                # "so a step S s" and "A s a step not hidden": the mean step over this run's
                # steps, which hold one sync (S - A, plus A x H over the steps: S itself when the
                # run is H steps), and the exposure per sync (A x H)
                pred=$(awk -v h="${h:-100}" -v n="$steps" '/islands: a sync/ { for (i = 1; i <= NF; i++) {
                    if ($i == "step" && $(i + 1) ~ /^[0-9.]+$/) step = $(i + 1);
                    if ($(i + 1) == "s" && $(i + 2) == "a" && $(i + 3) == "step" && $(i + 4) == "not") e = $i } }
                    END { if (step != "") print (step - e + e * h / n) * 1000, e * h }' "$run.predict.txt")
                [ -n "$pred" ] || pred="- -"
            fi
            # exposed: the step times beyond the median of the steps before the first sync, over
            # the steps the sync can touch: from its send (step H) to its apply (H + tau), its
            # waits and the steps the transfer ran beside (steps outside that window add only
            # their noise, seconds over a hundred steps when ranks share cores); each island's
            # (islands_ms), since they drift apart between syncs: the first to reach the sync
            # waits for the last (the column "exposed s"), which sees less by the drift ("last
            # isl. s"). The cost model's islands are identical: it prices the first's.
            tau=$(sed -n 's/.*--outer-overlap-steps \([0-9]*\).*/\1/p' <<<"$flagtext")
            jq -s -r --arg link "$rate" --arg run "$name" --arg pred "$pred" --argjson h "${h:-100}" \
                --argjson tau "${tau:-0}" \
                '[.[] | select(has("ms"))] as $s | ($s | map(.ms) | sort) as $t |
                 ($s[0].islands_ms // [0] | length) as $n |
                 [range(0; $n) as $k |
                  ([$s[] | select(.step >= 2 and .step < $h) | (.islands_ms[$k] // .ms)] | sort) as $b |
                  [$s[] | select(.step >= $h and .step <= $h + $tau) | (.islands_ms[$k] // .ms)] as $w |
                  ((($w | add // 0) - ($w | length) * $b[($b | length) / 2 | floor]) / 1000)] as $e |
                 "\($link) \($run) \($t[($t | length) / 2 | floor]) \(($t | add) / ($t | length)) \($s | map(.outer_s // 0) | add) \($e | max) \($e | min) \($pred)"' \
                "$run/metrics.jsonl" |
                awk '{ printf "%-9s %-20s %10.1f %10.1f %8.2f %10.2f %10.2f %10s %12s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
        done
        ip netns del "$ns"
    done
    [ -n "${TTL:-}" ] || exit 0
fi

if [ -n "${TTL:-}" ]; then
    # steps to data parallelism's loss on shared memory (the arithmetic does not depend on the
    # link), every schedule stretched (--steps; warm-up fixed, cosine to the end)
    wide=(--layers 6 --d-model 384 --heads 6 --context 128 --seq-len 64 --micro-batch-size 4
        --global-batch-size 16 --threads 1 --data "$data/train_*.bin" --val-data "$data/val_*.bin"
        --lr 1e-3 --warmup-steps 100 --eval-every 100 --eval-batches 8 --log-every 500 --no-save
        --seed 1)
    TTL_STEPS=${TTL_STEPS:-1000}
    # name|flags|schedules, tried shortest first until one reaches the target
    ttl_rows=("isl_h100_int8|--islands 4 --inner-steps 100 --outer-compression int8|2000 4000"
        "isl_h50_int8|--islands 4 --inner-steps 50 --outer-compression int8|3000"
        "dp_psgd16|--data-parallel 4 --dp-compression powersgd --dp-compression-rank 16|1000 1500")
    ttl_run() { # dir steps flags...
        local dir=$1 steps=$2
        shift 2
        # (slurped: jq 1.6's -e answers for the last input line, and an islands run's last line
        # is its last step's record, written after the validation)
        jq -s -e --argjson n "$steps" 'any(.[]; has("val_loss") and .step == $n)' \
            "$dir/metrics.jsonl" >/dev/null 2>&1 && return 0
        echo "== ${dir##*/}: mpirun -np 4 loom train ${wide[*]} --steps $steps $*" >&2
        mpirun -np 4 "$LOOM" train "${wide[@]}" --steps "$steps" "$@" --out "$dir" >"$dir.log" 2>&1 ||
            { echo "   ${dir##*/} failed: $(tail -2 "$dir.log")" >&2; return 1; }
    }
    # the first validation step at or under the target, if any
    reached() { jq -r --argjson t "$2" 'select(has("val_loss") and .val_loss <= $t) | .step' \
        "$1/metrics.jsonl" 2>/dev/null | head -1; }
    ttl_run "$OUT/ttl_dp_$TTL_STEPS" "$TTL_STEPS" --data-parallel 4 --zero 0
    target=$(jq -r --argjson n "$TTL_STEPS" 'select(has("val_loss") and .step == $n) | .val_loss' \
        "$OUT/ttl_dp_$TTL_STEPS/metrics.jsonl")
    echo "target: data parallelism's validation loss after $TTL_STEPS steps, $target"
    printf '%s %s\n' dp "$TTL_STEPS $TTL_STEPS" >"$OUT/ttl_steps.txt"
    for r in "${ttl_rows[@]}"; do
        IFS='|' read -r name flagtext schedules <<<"$r"
        [[ $name =~ ${ONLY:-.} ]] || continue
        read -r -a flags <<<"$flagtext"
        got=
        for s in $schedules; do
            ttl_run "$OUT/ttl_${name}_$s" "$s" "${flags[@]}" || break
            got=$(reached "$OUT/ttl_${name}_$s" "$target")
            [ -n "$got" ] && { echo "$name $s $got" >>"$OUT/ttl_steps.txt"; break; }
            echo "  $name, $s steps: final $(jq -r --argjson n "$s" 'select(has("val_loss") and .step == $n) | .val_loss' "$OUT/ttl_${name}_$s/metrics.jsonl"), not reached" >&2
        done
        [ -n "$got" ] || echo "$name - -" >>"$OUT/ttl_steps.txt"
    done
    # time to the target on each link: steps x time a step measured there (SLOW's runs in OUT:
    # islands, the median step before the first sync + its exposed time / H; the best overlap)
    python3 - "$OUT" <<'PY'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
steps = {}
for line in open(out + "/ttl_steps.txt"):
    name, sched, at = line.split()
    steps[name] = (sched, at)
def step_s(run, h):
    recs = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    ms = [(r["step"], r["ms"]) for r in recs if "ms" in r and r["step"] >= 2]
    if not ms: return None
    if h is None: return statistics.mean(m for _, m in ms) / 1000
    base = statistics.median(m for s, m in ms if s < h)
    exposed = sum(m for _, m in ms) - len(ms) * base
    return (base + max(exposed, 0) / h) / 1000
rates = sorted({os.path.basename(d).split("_")[1] for d in glob.glob(out + "/slow_*") if os.path.isdir(d)})
print(f"{'run':15s} {'schedule':>8s} {'steps':>6s}" + "".join(f" {r + ' s/step':>16s} {'to loss':>10s} {'vs dp':>7s}" for r in rates))
dp_time = {}
for name, (sched, at) in steps.items():
    row = f"{name:15s} {sched:>8s} {at:>6s}"
    h = int(re.search(r"_h(\d+)", name).group(1)) if name.startswith("isl") else None
    for rate in rates:
        runs = [d for d in glob.glob(f"{out}/slow_{rate}_{name}*") if os.path.isdir(d)
                and re.fullmatch(re.escape(name) + r"(_tau\d+)?", os.path.basename(d)[len(f"slow_{rate}_"):])]
        times = [t for t in (step_s(d, h) for d in runs) if t]
        if not times or at == "-":
            row += f" {'-':>16s} {'-':>10s} {'-':>7s}"
            continue
        t = min(times) * int(at)
        if name == "dp": dp_time[rate] = t
        ratio = f"{dp_time[rate] / t:.1f}x" if rate in dp_time else "-"
        row += f" {min(times):16.3f} {t / 3600:9.2f}h {ratio:>7s}"
    print(row)
PY
    exit 0
fi

printf '%-12s %5s %10s %9s %14s\n' row seed "val loss" "vs dp" "bytes/token"
IFS=';' read -r -a rows <<<"$ROWS"
WARM=${WARM:-0}
curves=()
for seed in $SEEDS; do
    dp=dp_s$seed
    warm=()
    if [ "$WARM" -gt 0 ]; then
        dp=dp_w${WARM}_s$seed
        warm=(--resume "$OUT/$dp/checkpoints/$(printf 'step_%08d' "$WARM")")
        run "$dp" --data-parallel 4 --zero 0 --seed "$seed" --save-every "$WARM"
    else
        run "$dp" --data-parallel 4 --zero 0 --seed "$seed"
    fi
    base=$(final_val "$OUT/$dp")
    printf '%-12s %5s %10.4f %9s %14.1f\n' dp "$seed" "$base" 1.000 \
        "$(bytes_per_token "$OUT/$dp" dp_bytes)"
    for r in "${rows[@]}"; do
        name=${r%%:*}
        [ "$WARM" -gt 0 ] && name=${name}_w$WARM
        read -r -a flags <<<"${r#*:}"
        run "${name}_s$seed" --islands 4 "${flags[@]}" --seed "$seed" "${warm[@]}"
        v=$(final_val "$OUT/${name}_s$seed")
        [ -n "$v" ] || continue
        printf '%-12s %5s %10.4f %9.4f %14.3f\n' "$name" "$seed" "$v" \
            "$(awk -v a="$v" -v b="$base" 'BEGIN { print a / b }')" \
            "$(bytes_per_token "$OUT/${name}_s$seed" outer_bytes)"
        curves+=("${name}_s$seed=$OUT/${name}_s$seed")
    done
    curves=("dp_s$seed=$OUT/$dp" "${curves[@]}")
done
# every run's validation curve in one picture
python3 bench/curves.py "$OUT/islands.svg" \
    "validation loss: small, 4 islands of 1 rank vs data parallel on 4 ranks, global batch 16" \
    "${curves[@]}"
