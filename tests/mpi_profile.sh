#!/usr/bin/env bash
# `loom profile` under mpirun, each check against something independent of the profiler:
#   - 2 ranks, --quick: the file exists and parses as JSON (python's json, not jansson); one
#     host, 2 devices; a positive peak; a non-empty GEMM table in ascending FLOPs with
#     efficiencies in (0, 1.5]; a positive memory size, memory bandwidth and link bandwidth;
#     fits of allreduce, allgather and reduce-scatter over 2 ranks; every compressor's rate;
#     the progress lines of every phase;
#   - both files pass loom/cluster.h's reader (loom plan --check-cluster), and one predicts a plan;
#   - its sgemm peak is within a factor 3 of `loom bench`'s for the same thread count (one
#     process alone, measured apart: on a noisy 2-core machine only a loose bound is robust);
#   - 4 ranks as 2 pretended hosts: 2 nodes of 2, both link classes measured, fits over the
#     world (inter_node, 4 ranks) and over each host (intra_node, 2 ranks);
#   - loom train --plan auto: profiles once (quick, cached under LOOM_CACHE_DIR), plans for 2
#     ranks, writes OUT/plan.json, reports predicted vs measured; the second run uses the cache
#     and plans the same; --cluster plans on a given description; layout flags and --cluster
#     without auto are refused by name;
#   - bad input ends with exit 2 and a message: no mpirun, --out a folder, --pretend-hosts
#     beyond the ranks, a negative --threads.
# usage: bash tests/mpi_profile.sh LOOM_BINARY TMPDIR
# LOOM_SANITIZED=1 or LOOM_TEST_REPRESENTATIVE=1 leave out the 4-rank profile, LOOM_TEST_QUICK=1 also
# some of the refusals under mpirun.
set -u
LOOM=$1
TMP=$2
CLUSTERS=$(cd "$(dirname "$0")/.." && pwd)/clusters
. "$(cd "$(dirname "$0")" && pwd)/mpi_harness.bash"
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1

# ---- 2 ranks, quick ----
start=$(date +%s)
if timeout 120 mpirun -np 2 "$LOOM" profile --quick --threads 1 --out sub/cluster.json \
    >quick.log 2>&1; then ok; else fail "profile --quick: exit $?: $(tail -5 quick.log)"; fi
echo "profile --quick, 2 ranks: $(($(date +%s) - start)) s (with MPI start-up)"
[ -f sub/cluster.json ] && ok || fail "no sub/cluster.json"
grep -q '^wrote sub/cluster.json$' quick.log && ok || fail "no 'wrote' line"
for phase in "hosts:" "sgemm peak:" "memory bandwidth:" "GEMM efficiency:" "links: intra_node" \
    "collectives: allreduce" "compressors:" "done in"; do
    grep -q "profile \[ *[0-9.]* s\] $phase" quick.log && ok || fail "no progress line '$phase'"
done
python3 - sub/cluster.json <<'PY' && ok || fail "sub/cluster.json: contents"
import json, sys
c = json.load(open(sys.argv[1]))
node, dev = c["node"], c["node"]["device"]
assert c["nodes"] == 1 and c["max_nodes"] == 1, (c["nodes"], c["max_nodes"])
assert node["devices"] == 2, node["devices"]
assert dev["peak_flops"]["fp32"] > 0, dev["peak_flops"]
assert dev["memory_bytes"] > 0 and dev["memory_bandwidth"] > 0
assert dev["optimizer_params_per_s"] > 0, dev
table = dev["gemm_efficiency"]
assert len(table) >= 1, table
flops = [p["flops"] for p in table]
assert all(a < b for a, b in zip(flops, flops[1:])), flops
assert all(0 < p["efficiency"] <= 1.5 for p in table), table
for link in ("intra_node", "inter_node"):
    assert node["links"][link]["bandwidth"] > 0 and node["links"][link]["latency_s"] >= 0
fits = {(f["op"], f["link"], f["ranks"]) for f in c["collectives"]}
log = open("quick.log").read()
def fitted(op, link, ranks):  # or left to the ring model, said in the log (noise on 2 cores)
    return (op, link, ranks) in fits or f"{op:14s} over {ranks} ranks ({link}): no fit" in log
for op in ("allreduce", "allgather", "reduce_scatter", "sendrecv"):
    assert fitted(op, "intra_node", 2), (op, fits)
assert all(f["alpha_s"] >= 0 and f["beta_s_per_byte"] > 0 for f in c["collectives"])
methods = {"powersgd", "lowrank", "topk", "sign", "int8", "bf16"}
assert set(c["compressors"]) == methods and all(v > 0 for v in c["compressors"].values())
assert "one host" in c["source"], c["source"]
print(f"peak {dev['peak_flops']['fp32'] / 1e9:.1f} GFLOP/s, {len(table)} GEMM points, "
      f"intra_node {node['links']['intra_node']['bandwidth'] / 1e9:.2f} GB/s")
PY

# ---- the description reads back through loom/cluster.h's reader, and predicts a plan ----
"$LOOM" plan --check-cluster sub/cluster.json >check.log 2>&1 && ok ||
    fail "loom plan --check-cluster: $(tail -3 check.log)"
"$LOOM" plan --model small --pp 2 --out small_pp2.json >/dev/null 2>&1 &&
    "$LOOM" plan --predict small_pp2.json --cluster sub/cluster.json --seq-len 128 >predict.log 2>&1 &&
    grep -q "tokens/s" predict.log && ok || fail "loom plan --predict with the profile: $(tail -3 predict.log)"

# ---- the peak against loom bench's (one process, same thread count) ----
bench=$("$LOOM" bench --threads 1 --cases= 2>&1 | sed -n 's/.*peak \([0-9.]*\) GFLOP\/s.*/\1/p')
python3 - sub/cluster.json "$bench" <<'PY' && ok || fail "peak against loom bench's ($bench)"
import json, sys
peak = json.load(open(sys.argv[1]))["node"]["device"]["peak_flops"]["fp32"] / 1e9
bench = float(sys.argv[2])
print(f"sgemm peak: profile {peak:.1f} GFLOP/s per rank (2 at once), bench {bench:.1f} (alone)")
sys.exit(0 if bench / 3 <= peak <= 3 * bench else 1)
PY

# ---- 4 ranks as 2 hosts (~15 s under the sanitizers, ~10 s on release: the full matrix's,
# scripts/test.sh --full) ----
if [ "$quick" != 1 ]; then
    if timeout 120 mpirun -np 4 "$LOOM" profile --quick --threads 1 --pretend-hosts 2 \
        --out hosts.json >hosts.log 2>&1; then ok; else fail "--pretend-hosts 2: exit $?: $(tail -5 hosts.log)"; fi
    "$LOOM" plan --check-cluster hosts.json >check.log 2>&1 && ok ||
        fail "loom plan --check-cluster hosts.json: $(tail -3 check.log)"
    python3 - hosts.json <<'PY' && ok || fail "hosts.json: contents"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["nodes"] == 2 and c["node"]["devices"] == 2, (c["nodes"], c["node"]["devices"])
assert "copy" not in c["source"], c["source"]
fits = {(f["op"], f["link"], f["ranks"]) for f in c["collectives"]}
log = open("hosts.log").read()
def fitted(op, link, ranks):  # or left to the ring model, said in the log (noise on 2 cores)
    return (op, link, ranks) in fits or f"{op:14s} over {ranks} ranks ({link}): no fit" in log
for op in ("allreduce", "allgather", "reduce_scatter"):
    assert fitted(op, "inter_node", 4) and fitted(op, "intra_node", 2), (op, fits)
assert fitted("sendrecv", "inter_node", 2) and fitted("sendrecv", "intra_node", 2), fits
PY
    # more ranks than cores: a core's worth of ranks measure the device alone and the figures
    # are scaled by cores / ranks; against the 2-rank profile above (one rank a core here)
    python3 - hosts.json sub/cluster.json <<'PY' && ok || fail "4 ranks: the device's figures by the cores' share"
import json, os, re, sys
four, two = (json.load(open(p))["node"]["device"] for p in sys.argv[1:3])
cores = len(os.sched_getaffinity(0))
share = min(1.0, cores / 4)
source = json.load(open(sys.argv[1]))["source"]
said = re.search(r"scaled by ([0-9.]+)", source)
if share < 1:
    assert said and abs(float(said.group(1)) - share) < 1e-3, source
    assert "scaled by" in open("hosts.log").read()
else:
    assert not said, source
ratios = {key: four[key] / two[key] for key in ("memory_bandwidth", "optimizer_params_per_s")}
ratios["sgemm peak"] = four["peak_flops"]["fp32"] / two["peak_flops"]["fp32"]
for key, ratio in ratios.items():
    print(f"{key}: 4 ranks / 2 ranks = {ratio:.2f} (cores' share {share:.2f})")
    assert 0.6 * share <= ratio <= 1.5 * share, (key, ratio)
PY
fi

# ---- loom train --plan auto: profiles once (cached), plans, trains, reports the prediction ----
prepare_corpus
auto=(--model tiny --global-batch-size 8 --data 'data/train_*.bin' --steps 3 --seq-len 16
    --threads 1 --log-every 100 --no-save --comm-timeout 60)
export LOOM_CACHE_DIR=$TMP/cache LOOM_PROFILE_QUICK=1
if timeout 180 mpirun -np 2 -x LOOM_CACHE_DIR -x LOOM_PROFILE_QUICK "$LOOM" train --plan auto \
    "${auto[@]}" --out auto1 >auto1.log 2>&1; then ok; else fail "--plan auto: exit $?: $(tail -3 auto1.log)"; fi
grep -q "measuring these 2 ranks with loom profile" auto1.log && ok || fail "--plan auto did not profile"
ls cache/cluster-*-2ranks-1threads.json >/dev/null 2>&1 && ok || fail "no cached description: $(ls cache)"
grep -q "searched [0-9]* layouts of 2 ranks" auto1.log && ok || fail "no search table"
grep -q "step time: predicted .* s, measured .* s (median)" auto1.log && ok || fail "no predicted vs measured"
python3 - auto1/plan.json <<'PY' && ok || fail "auto1/plan.json: contents"
import json, sys
p = json.load(open(sys.argv[1]))
m = p["mesh"]
assert m["dp"] * m["tp"] * m["pp"] == 2, m
assert p["predicted"]["step_s"] > 0 and len(p["predicted"]["peak_bytes_per_rank"]) == 2, p["predicted"]
PY
if timeout 120 mpirun -np 2 -x LOOM_CACHE_DIR "$LOOM" train --plan auto "${auto[@]}" --out auto2 \
    >auto2.log 2>&1; then ok; else fail "--plan auto, cached: exit $?: $(tail -3 auto2.log)"; fi
grep -q "cluster description .*(cached" auto2.log && ! grep -q "measuring these" auto2.log && ok ||
    fail "the second run did not use the cache"
cmp -s <(grep -v '"predicted"' auto1/plan.json) <(grep -v '"predicted"' auto2/plan.json) && ok ||
    fail "the cached description planned differently"
if timeout 120 mpirun -np 2 "$LOOM" train --plan auto --cluster "$CLUSTERS/dgx-a100.json" \
    "${auto[@]}" --out auto3 >auto3.log 2>&1; then ok; else fail "--plan auto --cluster: exit $?: $(tail -3 auto3.log)"; fi
grep -q "layouts of 2 ranks on dgx-a100" auto3.log && ok || fail "--cluster not used"
# --allow-compression: two one-device nodes joined by a 1 MB/s link; the planner compresses
# where that shortens the step, and the job trains with what it chose
python3 - "$CLUSTERS/p3-v100.json" slow2.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["name"], c["max_nodes"] = "slow2", 2
c["node"]["devices"] = 1
c["node"]["links"]["inter_node"]["bandwidth"] = 1e6
json.dump(c, open(sys.argv[2], "w"))
PY
if timeout 120 mpirun -np 2 "$LOOM" train --plan auto --cluster slow2.json --allow-compression all \
    "${auto[@]}" --out auto_comp >auto_comp.log 2>&1; then ok; else fail "--plan auto --allow-compression: exit $?: $(tail -3 auto_comp.log)"; fi
python3 - auto_comp/plan.json <<'PY' && ok || fail "auto_comp/plan.json: no compression chosen on a 1 MB/s link"
import json, sys
c = json.load(open(sys.argv[1]))["compression"]
assert c["dp"]["method"] != "none" or c["pp"]["method"] != "none", c
PY
unset LOOM_CACHE_DIR LOOM_PROFILE_QUICK
expect_refused() { # NAME REGEX ARGS...
    local name=$1 regex=$2
    shift 2
    timeout 60 "$@" >"$name.log" 2>&1
    local code=$?
    [ "$code" -eq 2 ] && grep -Eq -- "$regex" "$name.log" && ok ||
        fail "$name: exit $code, $(grep -m1 error "$name.log")"
}
expect_refused auto_layout_flag '--plan auto: --micro-batch-size sets what the planner chooses' \
    mpirun -np 2 "$LOOM" train --plan auto --micro-batch-size 2 "${auto[@]}" --out auto4
expect_refused cluster_without_auto '--cluster .*: only with --plan auto' \
    "$LOOM" train --cluster "$CLUSTERS/dgx-a100.json" "${auto[@]}" --out auto5
expect_refused allow_without_auto '--allow-compression all: only with --plan auto' \
    "$LOOM" train --allow-compression all "${auto[@]}" --out auto6
[ "$core_only" = 1 ] ||
    expect_refused allow_bad_word '--allow-compression: expected none, dp, pp or all, got "some"' \
        mpirun -np 2 "$LOOM" train --plan auto --cluster slow2.json --allow-compression some "${auto[@]}" --out auto7

# ---- bad input ----
# name expected-message command...: exit 2 and the message on stderr
bad() {
    local name=$1 expect=$2
    shift 2
    "$@" >bad.log 2>&1
    local rc=$?
    if [ "$rc" -eq 2 ] && grep -q -- "$expect" bad.log; then ok; else
        fail "$name: exit $rc, expected 2 and '$expect': $(tail -3 bad.log)"
    fi
}
bad "no mpirun" "run it under mpirun" "$LOOM" profile --quick --out x.json
mkdir -p folder
bad "--out a folder" "--out: folder is a directory" \
    timeout 60 mpirun -np 2 "$LOOM" profile --quick --out folder
if [ "$core_only" != 1 ]; then
    bad "--pretend-hosts 3 of 2" "--pretend-hosts: expected 0" \
        timeout 60 mpirun -np 2 "$LOOM" profile --quick --pretend-hosts 3 --out x.json
    bad "--threads -1" "--threads: expected >= 0" \
        timeout 60 mpirun -np 2 "$LOOM" profile --quick --threads -1 --out x.json
fi
[ ! -e x.json ] && ok || fail "a refused profile wrote x.json"

finish
