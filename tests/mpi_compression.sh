#!/usr/bin/env bash
# Compression in real runs (issue 8), each check against something independent of the code
# under test:
#   - every DP method composes with DP, ZeRO-1, TP and PP: the run finishes and the replicas are
#     bit-identical (the run's own check, which fails the run otherwise);
#   - the bytes the metrics report: PowerSGD's DP traffic and low-rank pipeline gradients equal
#     the formulas (factor sizes), epilogue compresses exactly the cool-down sends of 1F1B, a
#     link list only its links; slack runs with both ends of every link agreeing; bf16/int8
#     forward activations keep the losses within 1 %;
#   - a resume from a checkpoint with compression on is bit-exact (losses and final weights of an
#     uninterrupted run); compressor state files that do not fit (format, signature, a NaN, an
#     extra tensor, a missing file, a metadata key given twice) are refused by name on every rank,
#     a state file with another setting's signature drops the state with one warning;
#   - convergence: tiny model, dp 2, 200 steps: PowerSGD rank 4 with error feedback ends within
#     5 % of the uncompressed loss, and without error feedback measurably worse than with it.
# usage: bash tests/mpi_compression.sh LOOM_BINARY TMPDIR
# LOOM_SANITIZED=1 runs a representative subset; LOOM_TEST_QUICK=1 the core only: PowerSGD with
# DP and ZeRO-1, its bytes, pipeline low-rank bytes, the exact resume, three refused state files.
set -u
LOOM=$1
TMP=$2
. "$(cd "$(dirname "$0")" && pwd)/mpi_harness.bash"
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1

prepare_corpus

common=(--model tiny --data 'data/train_*.bin' --steps 6 --seq-len 16 --micro-batch-size 2
    --global-batch-size 8 --lr 3e-3 --warmup-steps 2 --eval-every 0 --threads 1 --log-every 1
    --comm-timeout 60)

# run NAME RANKS FLAGS...: the harness's (mpi_harness.bash)

# ---- every DP method in every composition: the run's replica check passes ----
methods=(powersgd topk sign int8 bf16)
[ "$quick" = 1 ] && methods=(powersgd topk)
[ "$core_only" = 1 ] && methods=(powersgd)
for m in "${methods[@]}"; do
    extra=()
    [ "$m" = powersgd ] && extra=(--dp-compression-rank 2)
    [ "$m" = topk ] && extra=(--dp-topk-fraction 0.05)
    run "dp2_$m" 2 --dp-compression "$m" "${extra[@]}"
    run "dp2_zero1_$m" 2 --dp-compression "$m" --zero1
    if [ "$quick" != 1 ]; then
        run "dp2_tp2_$m" 4 --dp-compression "$m" --tensor-parallel 2
        run "dp2_pp2_$m" 4 --dp-compression "$m" --pipeline-parallel 2
    fi
done
if [ "$core_only" != 1 ]; then
    # many small buckets, so that first rounds complete out of order: the second rounds still
    # start in the same order on every rank
    run dp4_powersgd_buckets 4 --dp-compression powersgd --dp-compression-rank 2 --bucket-mb 0.0005
    run dp2_pp2_powersgd_buckets 4 --dp-compression powersgd --dp-compression-rank 2 --bucket-mb 0.0005 \
        --pipeline-parallel 2 --pp-compression lowrank --pp-compression-rank 2 --trace buckets_trace.json &&
        python3 - <<'PY' && ok || fail "trace: no encode/decode spans of both kinds"
import json
d = json.load(open("buckets_trace.json"))
events = d["traceEvents"] if isinstance(d, dict) else d
spans = {(e.get("name"), e.get("tid")) for e in events if e.get("cat") == "compress"}
names = {n for n, _ in spans}
tids = {t for _, t in spans}
assert {"encode", "decode"} <= names and len(tids) >= 2, spans  # DP and PP streams
PY
fi
for name in dp2_powersgd dp2_zero1_powersgd; do
    grep -q "replicas hold bit-identical parameters" "$name.log" && ok || fail "$name: no replica check"
done
grep -q "ZeRO-1 off" dp2_powersgd.log && ok || fail "dp2_powersgd: ZeRO-1 not turned off by name"
grep -q "with ZeRO-1" dp2_zero1_powersgd.log && ok || fail "--zero1 with compression: ZeRO-1 not on"

if [ "$core_only" != 1 ]; then
    # a non-finite step is skipped and leaves the compressors as they were: the steps after it train
    LOOM_DEBUG_NAN_STEPS=3 run dp2_pp2_nan 4 --dp-compression powersgd --dp-compression-rank 2 \
        --pp-compression lowrank --pp-compression-rank 2 --data-parallel 2 --pipeline-parallel 2 &&
        python3 - dp2_pp2_nan <<'PY' && ok || fail "dp2_pp2_nan: the skipped step polluted the compressors"
import json, math, sys
recs = {r["step"]: r for r in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "loss" in r}
ok = recs[3]["skipped"] and all(not recs[s]["skipped"] and math.isfinite(recs[s]["loss"]) for s in (4, 5, 6))
sys.exit(0 if ok else 1)
PY

    # warm-up steps go uncompressed: the first 3 steps (and the loss of the 4th, computed before its
    # update) equal plain data parallelism's bit for bit, the 5th no longer
    run dp2_plain 2 --no-zero1
    if run dp2_warmup 2 --dp-compression powersgd --dp-compression-rank 2 --dp-compression-warmup-steps 3; then
        for s in 1 2 3 4; do
            [ "$(metric dp2_plain $s loss)" = "$(metric dp2_warmup $s loss)" ] && ok || fail "warm-up step $s differs from plain DP"
        done
        [ "$(metric dp2_plain 5 loss)" != "$(metric dp2_warmup 5 loss)" ] && ok || fail "step 5 not compressed after the warm-up"
    fi
    # selective stage compression: only stage 0 compresses (the tied embedding then goes
    # uncompressed on both of its stages)
    run dp2_pp2_stage0 4 --dp-compression powersgd --dp-compression-rank 2 --dp-compression-stages 0 --pipeline-parallel 2
fi

# ---- bytes: PowerSGD's factors are what the metrics say was saved ----
python3 - dp2_powersgd <<'PY' && ok || fail "dp2_powersgd bytes do not match the formula"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
r = [x for x in recs if x.get("step") == 6][0]
raw, sent = r["dp_bytes_raw"], r["dp_bytes"]
if not (raw > 4 * sent > 0):
    print(f"raw {raw} sent {sent}: expected at least 4x fewer bytes", file=sys.stderr); sys.exit(1)
PY

# ---- pipeline: low-rank gradients, every send ('all') and epilogue-only ----
if run pp2_lowrank 2 --pipeline-parallel 2 --pp-compression lowrank --pp-compression-rank 4; then
    # tiny: micro-batches of 2 x 16 tokens, width 16: rank 4 sends P (32 x 4) and Q (16 x 4)
    # floats instead of 32 x 16
    sent=$(metric pp2_lowrank 6 pp_grad_bytes) raw=$(metric pp2_lowrank 6 pp_grad_bytes_raw)
    m=$((8 / 2)) # micro-batches per step
    [ "$sent" = $((m * 4 * 4 * (32 + 16))) ] && ok || fail "pp2 lowrank: sent $sent"
    [ "$raw" = $((m * 4 * 32 * 16)) ] && ok || fail "pp2 lowrank: raw $raw"
fi
if [ "$core_only" != 1 ]; then
    # 1F1B with p stages and m micro-batches: stage s's sends after its last forward are its
    # min(p - s, m) last ones (the steady state's last backward, then the drain)
    if run pp4_epilogue 4 --pipeline-parallel 4 --layers 4 --pp-compression lowrank --pp-compression-rank 2 --pp-compression-policy epilogue; then
        n=$(metric pp4_epilogue 6 pp_grad_sends_compressed) all=$(metric pp4_epilogue 6 pp_grad_sends)
        expect=$(((4 - 1) + (4 - 2) + (4 - 3))) # stages 1..3, m = 4
        [ "$n" = "$expect" ] && ok || fail "pp4 epilogue: $n compressed sends, expected $expect"
        [ "$all" = $((3 * 4)) ] && ok || fail "pp4 epilogue: $all sends, expected 12"
    fi
    # only link 1 (stage 2 -> stage 1): stage 2's 4 sends of each step
    run pp4_link1 4 --pipeline-parallel 4 --layers 4 --pp-compression lowrank --pp-compression-rank 2 \
        --pp-compression-links 1 &&
        { [ "$(metric pp4_link1 6 pp_grad_sends_compressed)" = 4 ] && ok || fail "pp4 link 1: $(metric pp4_link1 6 pp_grad_sends_compressed) sends compressed, expected 4"; }

    # slack: timing-driven, so only what is certain: the first step (nothing measured yet)
    # compresses every send, both ends of every link agree on every later step (a disagreement
    # would end the run on a message of the wrong length), and the counts stay in range
    if run pp4_slack 4 --pipeline-parallel 4 --layers 4 --pp-compression lowrank --pp-compression-rank 2 \
        --pp-compression-policy slack; then
        [ "$(metric pp4_slack 1 pp_grad_sends_compressed)" = 12 ] && ok || fail "pp4 slack: step 1 not all compressed"
        for s in 2 3 4 5 6; do
            n=$(metric pp4_slack $s pp_grad_sends_compressed)
            [ -n "$n" ] && [ "$n" -ge 0 ] && [ "$n" -le 12 ] && ok || fail "pp4 slack step $s: $n"
        done
    fi

    # forward activations in bf16 or int8 (no error feedback): the losses stay within 1 % of the
    # uncompressed pipeline's
    run pp2_plain 2 --pipeline-parallel 2
    for m in bf16 int8; do
        run "pp2_fwd_$m" 2 --pipeline-parallel 2 --pp-forward-compression "$m" || continue
        python3 - pp2_plain "pp2_fwd_$m" <<'PY' && ok || fail "pp2 forward $m: losses drift"
import json, sys
def losses(d): return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
bad = [s for s in a if abs(b[s] - a[s]) > 0.01 * abs(a[s])]
if bad: print(f"steps {bad}: {[(a[s], b[s]) for s in bad]}", file=sys.stderr)
sys.exit(1 if bad or not a else 0)
PY
    done
fi

# ---- exact resume with DP PowerSGD and pipeline low-rank compression ----
comp=(--data-parallel 2 --pipeline-parallel 2 --dp-compression powersgd --dp-compression-rank 2
    --pp-compression lowrank --pp-compression-rank 4 --steps 8)
if run full 4 "${comp[@]}" --save-every 4 &&
    run resumed 4 "${comp[@]}" --resume full/checkpoints/step_00000004; then
    for s in 5 6 7 8; do
        a=$(metric full $s loss) b=$(metric resumed $s loss)
        [ -n "$a" ] && [ "$a" = "$b" ] && ok || fail "resume step $s: loss $b vs uninterrupted $a"
    done
    cmp -s full/checkpoints/step_00000008/model.safetensors resumed/checkpoints/step_00000008/model.safetensors &&
        ok || fail "resumed final weights differ from the uninterrupted run's"
    ls full/checkpoints/step_00000004/compress_rank*.safetensors >/dev/null 2>&1 && ok ||
        fail "no compressor state files beside the checkpoint"
fi
if [ "$core_only" != 1 ]; then
    # another layout drops the state with one warning and trains on
    if run relayout 2 --pipeline-parallel 2 --pp-compression lowrank --steps 8 --resume full/checkpoints/step_00000004; then
        [ "$(grep -c "compressors start fresh" relayout.log)" = 1 ] && ok || fail "relayout: expected one warning"
    fi
fi

# ---- compressor state that does not fit: refused by name (exit 2 on every rank) ----
# bad_checkpoint NAME WHAT: NAME/step_00000006, dp2_powersgd's last checkpoint with one file
# edited (WHAT)
bad_checkpoint() {
    rm -rf "$1" && mkdir -p "$1" && cp -r dp2_powersgd/checkpoints/step_00000006 "$1/" &&
        python3 - "$1/step_00000006" "$2" <<'PY'
import json, os, shutil, struct, sys
folder, what = sys.argv[1], sys.argv[2]
def load(name):
    blob = open(f"{folder}/{name}", "rb").read()
    n = struct.unpack_from("<Q", blob)[0]
    return json.loads(blob[8:8 + n]), bytearray(blob[8 + n:])
def save(name, header, body, text=None):
    raw = (text or json.dumps(header, separators=(",", ":"))).encode()
    raw += b" " * (-len(raw) % 8)
    open(f"{folder}/{name}", "wb").write(struct.pack("<Q", len(raw)) + raw + bytes(body))
rank0, rank1 = "compress_rank00000.safetensors", "compress_rank00001.safetensors"
if what == "format":  # an older build's file, without its step and rank
    h, b = load(rank0); h["__metadata__"]["format"] = "loom.compress.v1"; save(rank0, h, b)
elif what == "stepcopy":  # both files copied from step 3 of the same run and layout
    for name in (rank0, rank1):
        shutil.copy(f"dp2_every3/checkpoints/step_00000003/{name}", f"{folder}/{name}")
elif what == "swapped":  # the two replicas' files exchanged
    os.rename(f"{folder}/{rank0}", f"{folder}/swap")
    os.rename(f"{folder}/{rank1}", f"{folder}/{rank0}")
    os.rename(f"{folder}/swap", f"{folder}/{rank1}")
elif what == "signature":
    h, b = load(rank1); h["__metadata__"]["loom.compress"] = ""; save(rank1, h, b)
elif what == "nan":  # in a warm-start factor
    h, b = load(rank0)
    q = next(k for k in h if k.endswith(".q"))
    struct.pack_into("<f", b, h[q]["data_offsets"][0], float("nan"))
    save(rank0, h, b)
elif what == "extra":
    h, b = load(rank0)
    h["dp.99.residual"] = {"dtype": "F32", "shape": [1], "data_offsets": [len(b), len(b) + 4]}
    save(rank0, h, b + struct.pack("<f", 1.0))
elif what == "missing":
    os.remove(f"{folder}/{rank1}")
elif what == "duplicate":  # a metadata key twice in state.safetensors
    h, b = load("state.safetensors")
    text = json.dumps(h, separators=(",", ":"))
    save("state.safetensors", h, b, text.replace('"format":', '"loom.compress":"x","format":', 1))
elif what == "other":  # another setting's signature
    h, b = load("state.safetensors")
    meta = h["__metadata__"]
    meta["loom.compress"] = meta["loom.compress"].replace("/r2/", "/r4/")
    save("state.safetensors", h, b)
PY
}
resume_flags=(--steps 7 --dp-compression powersgd --dp-compression-rank 2)
# refused WHAT PATTERN: the resume from bad_WHAT exits 2, a message matches PATTERN, and each
# rank says why it stops (its own message, or "another rank failed while setting up")
refused() {
    local name=bad_$1
    bad_checkpoint "$name" "$1" || { fail "$name: could not make the checkpoint"; return; }
    timeout 120 mpirun -np 2 "$LOOM" train "${common[@]}" "${resume_flags[@]}" \
        --resume "$name/step_00000006" --out "${name}_run" >"$name.log" 2>&1
    local rc=$?
    [ $rc = 2 ] && grep -qE "$name/step_00000006/$2" "$name.log" &&
        grep -q '^\[rank 0\] error: ' "$name.log" && grep -q '^\[rank 1\] error: ' "$name.log" &&
        ok || fail "$name: expected exit 2, '$2' and a message from each rank; got exit $rc:" \
        "$(grep error: "$name.log" | head -3)"
}
if [ -d dp2_powersgd/checkpoints/step_00000006 ]; then
    c0='compress_rank00000\.safetensors' c1='compress_rank00001\.safetensors'
    refused format "$c0: metadata 'format': expected \"loom\.compress\.v2\" \(this build's compressor files\), got \"loom\.compress\.v1\""
    # files tied to their rank (and, below, their step): exchanged between replicas
    refused swapped "$c0: metadata 'rank': expected \"0\" \(this rank's world rank\), got \"1\""
    refused missing "$c1: cannot open"
    if [ "$core_only" != 1 ]; then
        refused signature "$c1: metadata 'loom\.compress': expected \"files=.*\" \(the checkpoint's layout and compression\), got \"\"$"
        # copied from another step
        if run dp2_every3 2 --dp-compression powersgd --dp-compression-rank 2 --save-every 3; then
            refused stepcopy "$c0: metadata 'step': expected \"6\" \(the checkpoint's step\), got \"3\""
        fi
        refused nan "$c0: tensor 'dp\.[0-9]+\.q': expected finite values, got nan at index 0"
        refused extra "$c0: tensor 'dp\.99\.residual' is none of this rank's compressor state \(expected"
        refused duplicate 'state\.safetensors: header: duplicate key "loom\.compress" in __metadata__ '
        # another setting's signature in state.safetensors: one warning, and the run goes on
        bad_checkpoint bad_other other && run bad_other_run 2 "${resume_flags[@]}" \
            --resume bad_other/step_00000006 &&
            [ "$(grep -c "compressors start fresh" bad_other_run.log)" = 1 ] && ok ||
            fail "bad_other: expected one warning and the run to go on"
    fi
fi

# ---- convergence: 400 steps, dp 2, English text (the fortunes' "computers") ----
# Measured (seeds 1-3, validation loss after 400 steps): uncompressed 2.549-2.576 (the
# seed-to-seed spread is about 1 %), PowerSGD rank 4 with error feedback +1.4 % to +2.4 %,
# without error feedback +7.3 % to +8.5 %.
text=/usr/share/games/fortunes/computers
if [ "$quick" != 1 ] && [ -f "$text" ]; then
    "$LOOM" prepare --text "$text" --out fdata --seq-len 32 >/dev/null || fail "prepare fortunes"
    conv=(--d-model 64 --heads 4 --context 32 --seq-len 32 --micro-batch-size 4
        --global-batch-size 16 --data 'fdata/train_*.bin' --val-data 'fdata/val_*.bin'
        --steps 400 --lr 2e-3 --warmup-steps 40 --eval-every 400 --eval-batches 16
        --log-every 100 --data-parallel 2 --no-save)
    run conv_none 2 "${conv[@]}"
    run conv_ef 2 "${conv[@]}" --dp-compression powersgd --dp-compression-rank 4
    run conv_noef 2 "${conv[@]}" --dp-compression powersgd --dp-compression-rank 4 --no-error-feedback
    python3 - <<'PY' && ok || fail "convergence"
import json, sys
def val(name):
    v = [json.loads(l) for l in open(name + "/metrics.jsonl")]
    return [r["val_loss"] for r in v if "val_loss" in r][-1]
none, ef, noef = val("conv_none"), val("conv_ef"), val("conv_noef")
print(f"convergence, validation loss after 400 steps: uncompressed {none:.4f}, PowerSGD r4 with "
      f"error feedback {ef:.4f} ({100 * (ef / none - 1):+.1f}%), without {noef:.4f} "
      f"({100 * (noef / none - 1):+.1f}%)")
sys.exit(1 if ef > 1.05 * none or noef < 1.02 * ef else 0)
PY
elif [ "$quick" != 1 ]; then
    echo "skipped the convergence check: $text is missing (scripts/setup.sh installs fortunes)"
fi

finish
