#!/usr/bin/env bash
# cli_bad_input.sh — every bad input of the `loom` command must end with exit status 2 and one
# clear message on stderr (one "error: " line naming the file or flag, the field and what was
# expected), and never with a crash (signal, sanitizer report). Also checks that --help works.
#
# Inputs are generated here: token shards, llm.c checkpoints and safetensors files are written
# byte by byte with printf (no python), and one valid safetensors file comes from a 1-step run
# of the tiny model, then has its header edited.
#
# usage: bash tests/cli_bad_input.sh LOOM_BINARY TMPDIR   (TMPDIR is emptied first)
source "$(dirname "$0")/cli_harness.bash" "$@"

# Little-endian integers as raw bytes.
le32() {
    local v=$1
    printf "\\$(printf %03o $((v & 255)))\\$(printf %03o $(((v >> 8) & 255)))"
    printf "\\$(printf %03o $(((v >> 16) & 255)))\\$(printf %03o $(((v >> 24) & 255)))"
}
le64() {
    le32 $(($1 & 0xffffffff))
    le32 $(($1 >> 32))
}

# shard FILE MAGIC VERSION COUNT BODY_BYTES: an llm.c token shard header + zero tokens.
shard() {
    { le32 "$2"; le32 "$3"; le32 "$4"; head -c 1012 /dev/zero; head -c "$5" /dev/zero; } >"$1"
}

# llmc FILE MAGIC VERSION FLOATS: an llm.c checkpoint of the tiny model's shape
# (maxT 16, V 257, L 2, NH 2, C 16, Vp 384: 12992 parameters), zero weights.
llmc() {
    {
        le32 "$2"
        le32 "$3"
        for v in 16 257 2 2 16 384; do le32 $v; done
        head -c $((1024 - 32)) /dev/zero
        head -c $((4 * $4)) /dev/zero
    } >"$1"
}

# st FILE HEADER BODY_BYTES [DECLARED_LENGTH]: a safetensors file with a zero body.
st() {
    { le64 "${4:-${#2}}"; printf '%s' "$2"; head -c "$3" /dev/zero; } >"$1"
}

# ---- inputs --------------------------------------------------------------------------------

mkdir -p data bad_data ckpt empty_run
# a small deterministic text (a linear congruential generator picks words)
words=(the quick brown fox jumps over a lazy dog and then runs far away into the deep forest)
text="" seed=7
for ((i = 0; i < 600; i++)); do
    seed=$(((seed * 1103515245 + 12345) % 2147483648))
    text+="${words[$(((seed >> 8) % ${#words[@]}))]} "
    ((i % 10 == 9)) && text+=$'\n'
done
printf '%s' "$text" >text.txt
: >empty.txt

shard data/train.bin 20240520 1 400 800 # 400 zero tokens: valid, 24 windows of 16
shard bad_data/magic.bin 12345 1 100 200
shard bad_data/version.bin 20240520 2 100 200
shard bad_data/truncated.bin 20240520 1 100 150
shard bad_data/trailing.bin 20240520 1 100 201
shard bad_data/small.bin 20240520 1 10 20
# token 300 (bytes 0x2c 0x01) at position 5: beyond the byte vocabulary of 257
{
    le32 20240520; le32 1; le32 100; head -c 1012 /dev/zero
    head -c 10 /dev/zero; printf '\054\001'; head -c 188 /dev/zero
} >bad_data/vocab.bin

llmc ckpt/ok.bin 20240326 3 12992
llmc ckpt/magic.bin 1234 3 12992
llmc ckpt/bf16.bin 20240326 5 12992
llmc ckpt/truncated.bin 20240326 3 12000
cp data/train.bin ckpt/shard.bin

st ckpt/past_end.safetensors '{}' 0 1000
st ckpt/huge_header.safetensors '{}' 0 200000000
st ckpt/zero_header.safetensors '' 0
printf 'abc' >ckpt/short.safetensors
st ckpt/bad_json.safetensors '{"a": }' 0
f32x2() { # NAME BEGIN END: a header entry of two float32 values
    printf '"%s":{"dtype":"F32","shape":[2],"data_offsets":[%d,%d]}' "$1" "$2" "$3"
}
st ckpt/overlap.safetensors "{$(f32x2 a 0 8),$(f32x2 b 4 12)}" 12
st ckpt/hole.safetensors "{$(f32x2 a 0 8),$(f32x2 b 12 20)}" 20

# a valid tiny model, then copies with one edit to the header
TINY=(--model tiny --threads 1 --seq-len 16 --micro-batch-size 2 --global-batch-size 2)
if ! "$LOOM" train "${TINY[@]}" --data data/train.bin --steps 1 --out run_ok >run_ok.log 2>&1; then
    echo "cannot train the tiny model for the checkpoint cases:" >&2
    cat run_ok.log >&2
    echo "0 passed, 1 failed"
    exit 1
fi
model=run_ok/checkpoints/step_00000001/model.safetensors
header_len=$(($(od -An -tu8 -N8 "$model")))
header=$(tail -c +9 "$model" | head -c "$header_len")
tail -c +$((9 + header_len)) "$model" >model.body
with_header() { # FILE HEADER: the valid body behind a new header
    { le64 ${#2}; printf '%s' "$2"; cat model.body; } >"$1"
}
old='"ln_f.bias":{"dtype":"F32","shape":[16]'
with_header ckpt/same.safetensors "$header"
with_header ckpt/missing.safetensors "${header/\"ln_f.bias\":/\"ln_f.biaz\":}"
with_header ckpt/dtype.safetensors "${header/"$old"/'"ln_f.bias":{"dtype":"F16","shape":[32]'}"
with_header ckpt/shape.safetensors "${header/"$old"/'"ln_f.bias":{"dtype":"F32","shape":[4,4]'}"
if ! cmp -s ckpt/same.safetensors "$model" || cmp -s ckpt/missing.safetensors "$model" ||
    cmp -s ckpt/dtype.safetensors "$model" || cmp -s ckpt/shape.safetensors "$model"; then
    echo "FAIL  crafting safetensors: header edits did not apply" >&2
    failed=$((failed + 1))
fi

# run folders with a damaged checkpoint
mkdir -p no_latest/checkpoints
cp -r run_ok latest_dangling && echo step_00000099 >latest_dangling/checkpoints/latest
cp -r run_ok latest_escapes && echo ../../etc >latest_escapes/checkpoints/latest
cp -r run_ok state_truncated &&
    truncate -s -4 state_truncated/checkpoints/step_00000001/state.safetensors

# training state whose metadata says something impossible (python rewrites the header)
edit_state() { # RUN_FOLDER KEY VALUE ("-" deletes the key)
    cp -r run_ok "$1"
    python3 - "$1/checkpoints/step_00000001/state.safetensors" "$2" "$3" <<'PY'
import json, struct, sys
path, key, value = sys.argv[1:]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
meta = header["__metadata__"]
if value == "-":
    meta.pop(key, None)
else:
    meta[key] = value
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
}
# (found by tests/fuzz.py too: a step of 2^63 started the run at -2^63 and overran a buffer)
edit_state state_step_huge step 9223372036854775808
edit_state state_skipped_huge skipped_total 18446744073709551615
edit_state state_no_format format -
edit_state state_other_format format loom.train_state.v9
edit_state state_step_mismatch step 7
edit_state state_bad_steps bad_steps 1

# a checkpoint whose config promises a model far larger than its tensors (and this machine), and
# one whose config says fewer layers than its tensors hold
edit_config() { # RUN_FOLDER KEY VALUE: the model's loom.config metadata says KEY = VALUE
cp -r run_ok "$1"
python3 - "$1/checkpoints/step_00000001/model.safetensors" "$2" "$3" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
config = json.loads(header["__metadata__"]["loom.config"])
config[sys.argv[2]] = int(sys.argv[3])
header["__metadata__"]["loom.config"] = json.dumps(config)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
}
edit_config huge_context context 2147483647
edit_config one_layer layers 1

TRAIN=("$LOOM" train "${TINY[@]}" --data data/train.bin --steps 1 --out run_x)

# ---- help ----------------------------------------------------------------------------------

good "loom --help" 'usage: loom' 'by group' -- "$LOOM" --help
for cmd in train prepare sample eval bench; do
    good "loom $cmd --help" "usage: loom $cmd" '^run:$' -- "$LOOM" $cmd --help
done
good "loom train --help: grouped" '^model:$' '^layout:$' '^compression:$' '^run:$' '^output:$' \
    '^  --steps N +optimizer steps \(default 200\)$' -- "$LOOM" train --help
# every option that takes a value says its default (in words, or the value itself)
for cmd in train prepare sample eval bench plan tokenize profile; do
    "$LOOM" $cmd --help >help.txt 2>&1
    missing=$(grep -E '^  --[a-z0-9-]+ (N|X|VALUE) ' help.txt | grep -Ev 'default|same as --' | head -n 1)
    check "loom $cmd --help: every option with a value shows its default" \
        "${missing:+no default: $missing}"
done

# ---- commands and flags --------------------------------------------------------------------

bad "no command" "expected a command" -- "$LOOM"
bad "unknown command" "unknown command 'frobnicate'" -- "$LOOM" frobnicate
bad "unknown flag" "unknown option '--no-such-flag'" -- "$LOOM" train --no-such-flag
bad "flag without its value" '--steps: expected a value' -- "$LOOM" train --steps
bad "non-numeric value" "--steps: expected an integer, got 'abc'" -- "$LOOM" train --steps abc
bad "non-numeric value (--flag=value)" "--steps: expected an integer, got 'abc'" \
    -- "$LOOM" train --steps=abc
bad "not-a-number lr" "--lr: expected a number, got 'nan'" -- "${TRAIN[@]}" --lr nan
bad "negative seed" "--seed: expected a non-negative integer, got '-1'" -- "${TRAIN[@]}" --seed -1
bad "positional argument" "unexpected argument 'extra'" -- "${TRAIN[@]}" extra
bad "steps 0" '--steps: expected a positive integer, got 0' -- "${TRAIN[@]}" --steps 0
bad "micro batch -1" '--micro-batch-size: expected a positive integer, got -1' \
    -- "${TRAIN[@]}" --micro-batch-size -1
bad "global batch not a multiple" \
    '--global-batch-size: expected a multiple of micro batch 2 x data parallel 1 = 2, got 3' \
    -- "${TRAIN[@]}" --global-batch-size 3
bad "unknown lr schedule" '--lr-schedule: expected "constant" or "cosine", got "foo"' \
    -- "${TRAIN[@]}" --lr-schedule foo
bad "heads not dividing the width" 'heads: expected a divisor of d_model 128, got 3' \
    -- "$LOOM" train --model small --heads 3 --data data/train.bin --steps 1 --out run_x
bad "seq-len beyond the context" "seq_len: expected at most the model's context 16, got 17" \
    -- "${TRAIN[@]}" --seq-len 17
bad "unknown model preset" "unknown preset 'nosuch'" -- "${TRAIN[@]}" --model nosuch
bad "value too long" '--model: expected at most 31 characters, got 40' \
    -- "${TRAIN[@]}" --model "$(printf 'x%.0s' {1..40})"
bad "negative threads" 'threads: expected >= 0' -- "${TRAIN[@]}" --threads -2
bad "empty --out" '^error: --out: expected a value, got "" \(leave the option out for its default\)' \
    -- "${TRAIN[@]}" --out ''
bad "empty --schedule" '^error: --schedule: expected a value, got ""' -- "${TRAIN[@]}" --schedule ''
bad "empty --schedule=" '^error: --schedule: expected a value, got ""' -- "${TRAIN[@]}" --schedule=
bad "plan: empty --stage-layers" '^error: --stage-layers: expected a value, got ""' \
    -- "$LOOM" plan --model tiny --stage-layers '' --out empty.json
bad "--out is a file" '--out: text\.txt exists and is not a directory' \
    -- "${TRAIN[@]}" --out text.txt
bad "bench: unknown flag" "unknown option '--no-such-flag'" -- "$LOOM" bench --no-such-flag
bad "bench: non-numeric --warmup" "--warmup: expected an integer, got '2x'" \
    -- "$LOOM" bench --warmup 2x
bad "bench: negative --warmup" '--warmup: expected >= 0, got -1' -- "$LOOM" bench --warmup -1
bad "bench --train: bad --warmup" "--warmup: expected an integer, got 'x'" \
    -- "$LOOM" bench --train --warmup x
bad "bench --train: bad --warmup=" "--warmup: expected an integer, got '2x'" \
    -- "$LOOM" bench --train --warmup=2x
bad "bench --train: negative --warmup" '--warmup: expected >= 0, got -1' \
    -- "$LOOM" bench --train --warmup -1
bad "bench --train: --warmup without a value" '--warmup: expected a value after it' \
    -- "$LOOM" bench --train --warmup
bad "bench --train: an --out too long for its synthetic tokens is refused, not cut" \
    '^error: --out: path too long: d+/synthetic\.bin \(1029 bytes, at most 1023\)' \
    -- "$LOOM" bench --train --model tiny --out "$(printf 'd%.0s' {1..1015})"
good "bench --train --help" 'usage: \[mpirun -np N\] loom bench --train \[--warmup N\]' \
    '^  --steps N +optimizer steps \(default 12\)$' -- "$LOOM" bench --train --help
bad "bench: non-numeric --threads entry" "--threads: expected an integer, got '2x'" \
    -- "$LOOM" bench --threads 1,2x
bad "bench: --threads entry 0" '--threads: expected counts >= 1, got 0' \
    -- "$LOOM" bench --threads 0
bad "bench: empty --threads" "--threads: expected thread counts such as 1,2, got ','" \
    -- "$LOOM" bench --threads ,

# ---- --config ------------------------------------------------------------------------------

printf '{\n  "steps": 3,\n  "lr": ,\n}\n' >malformed.json
echo '[1, 2]' >array.json
echo '{"stepz": 3}' >unknown_key.json
echo '{"steps": "ten"}' >string_for_number.json
echo '{"lr_schedule": 5}' >number_for_string.json
echo '{"steps": 1.5}' >real_for_integer.json
echo '{"steps": 0}' >zero_steps.json
printf '{"model": "tiny", "steps": 5, "seed": 7, "seq_len": 16, "micro_batch_size": 2,
  "global_batch_size": 2, "threads": 1,
  "data": "data/train.bin", "out": "run_config"}\n' >valid.json
bad "config: missing file" 'nosuch\.json: cannot open the config file' \
    -- "$LOOM" train --config nosuch.json
bad "config: flag without its file" '--config: expected' -- "$LOOM" train --config
bad "config: a folder" 'data: cannot read the config file' -- "$LOOM" train --config data
bad "config: malformed JSON (line:column)" 'malformed\.json:3:[0-9]+: invalid JSON' \
    -- "$LOOM" train --config malformed.json
bad "config: array instead of object" 'array\.json: expected a JSON object' \
    -- "$LOOM" train --config array.json
bad "config: unknown key" 'unknown_key\.json: unknown key "stepz"' \
    -- "$LOOM" train --config unknown_key.json
bad "config: string for a number" 'string_for_number\.json: key "steps": expected a number' \
    -- "$LOOM" train --config string_for_number.json
bad "config: number for a string" 'number_for_string\.json: key "lr_schedule": expected a string' \
    -- "$LOOM" train --config number_for_string.json
bad "config: real for an integer" \
    "real_for_integer\.json: key \"steps\": expected an integer, got '1\.5'" \
    -- "$LOOM" train --config real_for_integer.json
bad "config: value out of range" 'zero_steps\.json: key "steps": expected a positive integer, got 0' \
    -- "$LOOM" train --config zero_steps.json
bad "config: --config=FILE is read" 'string_for_number\.json: key "steps"' \
    -- "$LOOM" train --config=string_for_number.json
bad "config: given twice" '--config: expected one file' \
    -- "$LOOM" train --config valid.json --config=valid.json
good "config: a flag overrides the file" '^steps +1$' '^seed +7$' '^model +tiny$' \
    -- "$LOOM" train --config valid.json --steps 1
if [ "$(jq -s 'map(select(has("loss"))) | length' run_config/metrics.jsonl 2>/dev/null)" = 1 ]; then
    record "config: the override ran 1 step" ""
else
    record "config: the override ran 1 step" "run_config/metrics.jsonl lacks exactly 1 step"
fi

# ---- data ----------------------------------------------------------------------------------

TRAIN_NODATA=("$LOOM" train "${TINY[@]}" --steps 1 --out run_x)
bad "data: missing file" 'nosuch\.bin: no file matches' -- "${TRAIN_NODATA[@]}" --data nosuch.bin
bad "data: glob matching nothing" 'nosuch/\*\.bin: no file matches' \
    -- "${TRAIN_NODATA[@]}" --data 'nosuch/*.bin'
bad "data: one of two globs matching nothing" 'nothing_\*: no file matches' \
    -- "${TRAIN_NODATA[@]}" --data 'data/train.bin,nothing_*'
bad "val-data: glob matching nothing" 'val_\*\.bin: no file matches' \
    -- "${TRAIN_NODATA[@]}" --data data/train.bin --val-data 'val_*.bin'
bad "data: wrong magic" 'magic\.bin: .*magic.*expected 20240520.*got 12345' \
    -- "${TRAIN_NODATA[@]}" --data bad_data/magic.bin
bad "data: wrong version" 'version\.bin: .*version.*expected 1, got 2' \
    -- "${TRAIN_NODATA[@]}" --data bad_data/version.bin
bad "data: truncated body" 'truncated\.bin: .*1174 bytes.*1224.*truncated' \
    -- "${TRAIN_NODATA[@]}" --data bad_data/truncated.bin
bad "data: trailing bytes" 'trailing\.bin: .*1225 bytes.*1224.*trailing' \
    -- "${TRAIN_NODATA[@]}" --data bad_data/trailing.bin
bad "data: token beyond the vocab" \
    'vocab\.bin: token at position 5 is 300: expected < vocab size 257' \
    -- "${TRAIN_NODATA[@]}" --data bad_data/vocab.bin
bad "data: fewer tokens than one window" 'small\.bin: .*too few.*17' \
    -- "${TRAIN_NODATA[@]}" --data bad_data/small.bin
bad "data: empty --data" 'data: expected' -- "${TRAIN_NODATA[@]}" --data ''
bad "eval: token beyond the vocab" 'vocab\.bin: token at position 5 is 300' \
    -- "$LOOM" eval --checkpoint run_ok --data bad_data/vocab.bin --threads 1

# ---- model files: --init-from, sample --checkpoint, eval --checkpoint ----------------------

# model_bad NAME FILE REGEX: the same bad file through all three entry points
model_bad() {
    bad "init-from: $1" "$3" -- "${TRAIN[@]}" --init-from "$2"
    bad "sample: $1" "$3" -- "$LOOM" sample --checkpoint "$2" --tokens 4 --threads 1
    bad "eval: $1" "$3" -- "$LOOM" eval --checkpoint "$2" --data data/train.bin --threads 1
}
model_bad "missing .bin" nosuch.bin 'nosuch\.bin: cannot open'
model_bad "missing .safetensors" nosuch.safetensors 'nosuch\.safetensors: cannot open'
model_bad "missing folder" nosuch_run 'nosuch_run: no such checkpoint'
model_bad "folder without a checkpoint" empty_run 'empty_run: expected a run folder'
model_bad "llm.c wrong magic" ckpt/magic.bin 'magic\.bin: header slot 0 \(magic\): expected 20240326 .*, got 1234'
model_bad "llm.c token shard as a model" ckpt/shard.bin \
    "shard\.bin: .*expected 20240326 \(an llm\.c model checkpoint\), got 20240520 \(an llm\.c token shard\)"
model_bad "llm.c version 5 (bf16)" ckpt/bf16.bin 'bf16\.bin: version 5: bf16 .*expected version 3'
model_bad "llm.c truncated" ckpt/truncated.bin \
    'truncated\.bin: file is truncated: it has 49024 bytes, expected 52992'
model_bad "safetensors header length past the end" ckpt/past_end.safetensors \
    'past_end\.safetensors: header length 1000 exceeds the 2 bytes'
model_bad "safetensors header length > 100,000,000" ckpt/huge_header.safetensors \
    'huge_header\.safetensors: header length 200000000 exceeds the limit of 100000000'
model_bad "safetensors header length 0" ckpt/zero_header.safetensors \
    'zero_header\.safetensors: header length is 0'
model_bad "safetensors shorter than 8 bytes" ckpt/short.safetensors \
    'short\.safetensors: file is 3 bytes'
model_bad "safetensors invalid JSON header" ckpt/bad_json.safetensors \
    'bad_json\.safetensors: header is not valid JSON.*line 1, column'
model_bad "safetensors overlapping offsets" ckpt/overlap.safetensors \
    "overlap\.safetensors: tensor 'b': data_offsets \[4, 12\] overlap tensor 'a'"
model_bad "safetensors hole" ckpt/hole.safetensors \
    "hole\.safetensors: tensor 'b': .*leave a hole: bytes \[8, 12\)"
model_bad "safetensors missing tensor" ckpt/missing.safetensors \
    "missing\.safetensors: tensor 'ln_f\.bias' is missing"
model_bad "safetensors wrong dtype" ckpt/dtype.safetensors \
    "dtype\.safetensors: tensor 'ln_f\.bias': dtype F16, expected F32"
model_bad "safetensors wrong shape" ckpt/shape.safetensors \
    "shape\.safetensors: tensor 'ln_f\.bias': expected shape \[16\], found \[4, 4\]"
# the untouched copy loads: the cases above fail for their edit, not for the crafting
good "sample: the re-assembled valid safetensors loads" -- \
    "$LOOM" sample --checkpoint ckpt/same.safetensors --tokens 4 --threads 1
good "sample: a valid zero llm.c checkpoint loads" -- \
    "$LOOM" sample --checkpoint ckpt/ok.bin --tokens 4 --threads 1

# ---- --resume ------------------------------------------------------------------------------

bad "resume: folder with no checkpoint" 'empty_run: expected a run folder' \
    -- "${TRAIN[@]}" --resume empty_run
bad "resume: missing folder" 'nosuch_run: no such checkpoint' -- "${TRAIN[@]}" --resume nosuch_run
bad "resume: checkpoints/ without 'latest'" \
    "no_latest/checkpoints: no checkpoint pointer 'latest'" \
    -- "${TRAIN[@]}" --resume no_latest
bad "resume: 'latest' names a missing step" \
    'latest_dangling/checkpoints/step_00000099/model\.safetensors: cannot open' \
    -- "${TRAIN[@]}" --resume latest_dangling
bad "resume: 'latest' is a path" 'latest_escapes/checkpoints/latest: expected a step folder name' \
    -- "${TRAIN[@]}" --resume latest_escapes
bad "resume: truncated state.safetensors" \
    'state_truncated/.*state\.safetensors: .*(truncated|beyond)' \
    -- "${TRAIN[@]}" --steps 2 --resume state_truncated

bad "boolean flag with a bad value" "--no-save: expected true, false, 1 or 0, got 'maybe'" \
    -- "${TRAIN[@]}" --no-save=maybe
echo '{"no_save": "sometimes"}' >bool_bad.json
bad "boolean config key with a bad value" \
    'bool_bad\.json: key "no_save": expected true, false, 1 or 0, got .sometimes.' \
    -- "${TRAIN[@]}" --config bool_bad.json
echo '{"recompute": "sometimes"}' >recompute_bad.json
bad "recompute config key with a bad word" \
    'recompute_bad\.json: key "recompute": expected none, needed, always or selective, got .sometimes.' \
    -- "${TRAIN[@]}" --config recompute_bad.json
bad "ZeRO-2/3 refuse the fused embedding sync by name" \
    'compression\.embedding_sync: expected "separate" with mesh\.zero 3' \
    -- "${TRAIN[@]}" --zero 3 --embedding-sync fused
bad "ZeRO-3's knobs only with --zero 3" \
    '--zero3-prefetch: expected only with --zero 3' \
    -- "${TRAIN[@]}" --zero 2 --zero3-prefetch 2
echo '{"lr": true}' >bool_lr.json
bad "a boolean for a number" 'bool_lr\.json: key "lr": expected a number, got a boolean' \
    -- "${TRAIN[@]}" --config bool_lr.json
bad "--progress unknown" 'progress: expected "auto", "on" or "off", got "sometimes"' \
    -- "${TRAIN[@]}" --progress sometimes

echo '{"schedule": ""}' >empty_schedule.json
bad "config: an empty value" 'empty_schedule\.json: key "schedule": expected a value, got ""' \
    -- "${TRAIN[@]}" --config empty_schedule.json
echo '{"heads": 3, "d_model": 64}' >heads3.json
bad "config file: the model's rule names the file and the key" \
    'heads3\.json: key "heads": expected a divisor of d_model 64, got 3' \
    -- "$LOOM" train --config heads3.json --data data/train.bin --out run_x
echo '{"global_batch_size": 12, "micro_batch_size": 8}' >batch12.json
bad "config file: the batch rule names the file and the key" \
    'batch12\.json: key "global_batch_size": expected a multiple of micro batch 8' \
    -- "$LOOM" train --config batch12.json --data data/train.bin --out run_x
bad "a flag over the config file is named as the flag" '^error: --lr: expected a number in' \
    -- "$LOOM" train --config batch12.json --lr 20 --data data/train.bin --out run_x
# sizes beyond this machine are refused by name before anything is allocated
bad "--layers 1e9" '--layers: expected at most 178956970 in this build, got 1000000000' \
    -- "${TRAIN[@]}" --layers 1000000000
bad "--layers 1e7" 'layers \[0, 10000000\) of 10000000.* needs [0-9.]+ GiB of memory, and this machine has' \
    -- "${TRAIN[@]}" --layers 10000000
bad "--context 1e9" 'context 1000000000.* needs [0-9.]+ GiB of memory' \
    -- "${TRAIN[@]}" --context 1000000000
bad "--micro-batch-size 1e9" '--micro-batch-size 1000000000 x --seq-len 16 .* needs [0-9.]+ GiB' \
    -- "${TRAIN[@]}" --micro-batch-size 1000000000 --global-batch-size 1000000000
bad "eval --batch 1e9" '--batch 1000000000 x --seq-len 16 needs [0-9.]+ GiB of memory' \
    -- "$LOOM" eval --checkpoint run_ok --data data/train.bin --batch 1000000000
bad "sample: a checkpoint whose config says context 2^31-1" \
    'huge_context/.*model\.safetensors: its model \(2 layers, d_model 16, context 2147483647.* needs' \
    -- "$LOOM" sample --checkpoint huge_context
bad "sample: a config of 1 layer over 2 layers' tensors" \
    "one_layer/.*model\\.safetensors: tensor 'h\\.1\\..*' is not part of the model its config describes \\(1 layers" \
    -- "$LOOM" sample --checkpoint one_layer
bad "--lr 1e308" 'lr: expected a number in \[0, 10\], got 1e\+308' -- "${TRAIN[@]}" --lr 1e308
bad "--eps 5" 'eps: expected a number in \(0, 1\], got 5' -- "${TRAIN[@]}" --eps 5
bad "comm-timeout below a second" '--comm-timeout: expected 0 \(disabled\) or at least 1 second, got 1e-09' \
    -- "${TRAIN[@]}" --comm-timeout 1e-9
mkdir -p trace_dir
bad "--trace is a folder" '--trace: trace_dir is a directory' -- "${TRAIN[@]}" --trace trace_dir
touch not_a_folder
bad "--trace in a folder that is a file" '--trace: not_a_folder/t\.json: expected a file in a writable folder, and not_a_folder is not one' \
    -- "${TRAIN[@]}" --trace not_a_folder/t.json
both() { "$@" 2>&1; } # warnings go to stderr; good() reads stdout
good "--eval-every without --val-data warns" 'no --val-data, so no validation runs' \
    -- both "${TRAIN[@]}" --eval-every 5 --no-save
good "--resume at or past --steps says there is nothing to do" 'nothing to train' \
    -- both "${TRAIN[@]}" --resume run_ok --no-save

# ---- conflicting settings and the plan contract ---------------------------------------------

bad "resume with init-from" '--resume and --init-from: expected one of them' \
    -- "${TRAIN[@]}" --resume run_ok --init-from run_ok
bad "init-from a file whose model differs from the flags" \
    '--init-from run_ok: the file.s model \(2 layers.*differs from the configured one \(3 layers' \
    -- "${TRAIN[@]}" --layers 3 --init-from run_ok
bad "resume a checkpoint whose model differs from the flags" \
    '--resume run_ok: the file.s model \(2 layers, 2 heads, d_model 16.*d_model 32' \
    -- "${TRAIN[@]}" --d-model 32 --resume run_ok
"$LOOM" plan --model tiny --out tiny_plan.json >/dev/null 2>&1
bad "plan with a flag that sets what the plan sets" \
    '--plan tiny_plan\.json: --tensor-parallel sets what the plan file sets' \
    -- "$LOOM" train --plan tiny_plan.json --data data/train.bin --tensor-parallel 1 --out run_p
echo '{"micro_batch_size": 2}' >plan_conflict.json
bad "plan with a config key that sets what the plan sets" \
    '--plan tiny_plan\.json: --micro-batch-size sets what the plan file sets' \
    -- "$LOOM" train --config plan_conflict.json --plan tiny_plan.json --data data/train.bin --out run_p
sed 's/"pp": {"method": "none"}/"pp": {"method": "lowrank", "rank": 4}/' tiny_plan.json \
    >tiny_plan_pp.json
bad "plan asking for pipeline compression with one stage" \
    'tiny_plan_pp\.json: compression\.pp\.method: expected "none" with one pipeline stage, got "lowrank"' \
    -- "$LOOM" train --plan tiny_plan_pp.json --data data/train.bin --seq-len 16 --out run_p
sed 's/"embedding_sync": "separate"/"embedding_sync": "fused"/' tiny_plan.json \
    >tiny_plan_fused.json
bad "plan asking for fused embedding sync with one stage" \
    'tiny_plan_fused\.json: compression\.embedding_sync: "fused" needs pipeline parallelism \(pp > 1\)' \
    -- "$LOOM" train --plan tiny_plan_fused.json --data data/train.bin --seq-len 16 --out run_p
bad "plan with a compression flag" \
    '--plan tiny_plan\.json: --dp-compression sets what the plan file sets' \
    -- "$LOOM" train --plan tiny_plan.json --data data/train.bin --dp-compression powersgd --out run_p
bad "plan with --embedding-sync" '--plan tiny_plan\.json: --embedding-sync sets what the plan file sets' \
    -- "$LOOM" train --plan tiny_plan.json --data data/train.bin --embedding-sync separate --out run_p
bad "plan with --virtual-stages" '--plan tiny_plan\.json: --virtual-stages sets what the plan file sets' \
    -- "$LOOM" train --plan tiny_plan.json --data data/train.bin --virtual-stages 2 --out run_p
bad "--virtual-stages without a schedule that takes it" \
    '^error: --virtual-stages: expected 1 with --schedule 1f1b, the default' \
    -- "${TRAIN[@]}" --virtual-stages 2
echo '{"schedule": "interleaved", "virtual_stages": 1}' >virtual_one.json
bad "config key virtual_stages named" \
    'virtual_one\.json: key "virtual_stages": expected at least 2 with --schedule interleaved' \
    -- "${TRAIN[@]}" --config virtual_one.json
echo '{"no_lazy_error": true}' >plan_conflict_pp.json
bad "plan with a compression config key" \
    '--plan tiny_plan\.json: --no-lazy-error sets what the plan file sets' \
    -- "$LOOM" train --config plan_conflict_pp.json --plan tiny_plan.json --data data/train.bin --out run_p

# flags that contradict each other are refused by name; --recompute-always implies --recompute,
# so the two together say the same thing (cli_plan.sh checks the plan they make)
bad "--zero1 with --no-zero1" '^error: --zero1 and --no-zero1 contradict each other' \
    -- "${TRAIN[@]}" --zero1 --no-zero1
bad "--zero 0 with --zero1" '^error: --zero1 and --zero 0 contradict each other' \
    -- "${TRAIN[@]}" --zero 0 --zero1
bad "--zero 1 with --no-zero1" '^error: --no-zero1 and --zero 1 contradict each other' \
    -- "${TRAIN[@]}" --zero 1 --no-zero1
bad "a plan file with --zero1 --no-zero1" '^error: --zero1 and --no-zero1 contradict each other' \
    -- "$LOOM" train --plan tiny_plan.json --data data/train.bin --zero1 --no-zero1 --out run_p
echo '{"zero": 0, "zero1": true}' >zero_both.json
bad "config keys zero 0 and zero1" 'zero_both\.json: key "zero1" and --zero 0 contradict each other' \
    -- "${TRAIN[@]}" --config zero_both.json

good "bench --train --plan FILE runs the file's layout (micro 8), not bench's (micro 4)" \
    'layout dp 1 tp 1 pp 1 .*micro 8 seq 16 global 8' \
    -- "$LOOM" bench --train --plan tiny_plan.json --seq-len 16 --steps 3 --warmup 1 --threads 1 \
    --out run_bench

# ---- compression flags ---------------------------------------------------------------------

bad "train: a pipeline method for dp" \
    '--dp-compression: compression\.dp\.method: expected one of none, powersgd, topk, sign, int8, bf16, got "lowrank"' \
    -- "${TRAIN[@]}" --dp-compression lowrank
bad "train: a data-parallel method for pp" \
    '--pp-compression: compression\.pp\.method: expected one of none, lowrank, topk, int8, bf16, got "sign"' \
    -- "${TRAIN[@]}" --pp-compression sign
bad "train: a backward method forward" \
    '--pp-forward-compression: compression\.pp\.forward: expected one of none, int8, bf16, got "lowrank"' \
    -- "${TRAIN[@]}" --pp-forward-compression lowrank
echo '{"dp_compression": "lowrank"}' >dp_lowrank.json
bad "train: a pipeline method for dp in a config" \
    'dp_lowrank\.json: key "dp_compression": compression\.dp\.method: expected one of none, powersgd' \
    -- "${TRAIN[@]}" --config dp_lowrank.json
bad "train: bad stage list" \
    '--dp-compression-stages: expected comma-separated stage indices .*got "0,a"' \
    -- "${TRAIN[@]}" --dp-compression int8 --dp-compression-stages 0,a
bad "train: bad link list" '--pp-compression-links: expected comma-separated link indices .*got "1,"' \
    -- "${TRAIN[@]}" --pp-compression int8 --pp-compression-links 1,
bad "train: sign without error feedback" \
    'compression\.dp\.error_feedback: sign compression needs error feedback \(it does not converge without it\)' \
    -- "${TRAIN[@]}" --dp-compression sign --no-error-feedback
bad "train: a fraction for a method without one" \
    '--dp-topk-fraction 0\.1: not used with --dp-compression powersgd \(only topk keeps a fraction\)' \
    -- "${TRAIN[@]}" --dp-compression powersgd --dp-topk-fraction 0.1
# ZeRO-1 gives way to data-parallel compression unless --zero1 is given (the configuration table
# shows the choice; the run itself may be refused by this build, which is not checked here)
both "${TRAIN[@]}" --no-save --dp-compression powersgd >zero1_off.txt </dev/null
if grep -Eq '^zero +0$' zero1_off.txt; then
    record "train: dp compression turns ZeRO-1 off" ""
else
    record "train: dp compression turns ZeRO-1 off" "no 'zero 0' in the table"
fi
both "${TRAIN[@]}" --no-save --dp-compression powersgd --zero1 >zero1_on.txt </dev/null
if grep -Eq '^zero +1$' zero1_on.txt; then
    record "train: --zero1 keeps ZeRO-1 with dp compression" ""
else
    record "train: --zero1 keeps ZeRO-1 with dp compression" "no 'zero 1' in the table"
fi
python3 - <<'PY'
import json
p = json.load(open("tiny_plan.json"))
p["predicted"] = {"step_s": 0.25, "tokens_per_s": 512.0, "peak_bytes_per_rank": [104857600]}
json.dump(p, open("tiny_plan_predicted.json", "w"))
PY
good "a plan's predictions are printed beside the measurements" \
    'step time: predicted 0\.25 s, measured [0-9.e-]+ s' 'tokens/s: predicted 512, measured' \
    'peak memory per rank: predicted 100\.0 MiB, measured [0-9.]+ MiB' \
    -- "$LOOM" train --plan tiny_plan_predicted.json --data data/train.bin --seq-len 16 --steps 3 \
    --eval-every 0 --no-save --out run_p
good "plan file with the flags it does not hold" 'step +1/1' \
    -- "$LOOM" train --plan tiny_plan.json --data data/train.bin --seq-len 16 --steps 1 \
    --eval-every 0 --no-save --out run_p

# ---- training state that cannot be right ----------------------------------------------------

bad "resume: step beyond int64" \
    "state_step_huge/.*state\\.safetensors: metadata 'step': expected at most 9223372036854775807" \
    -- "${TRAIN[@]}" --steps 2 --resume state_step_huge
bad "resume: skipped_total beyond int64" "metadata 'skipped_total': expected at most" \
    -- "${TRAIN[@]}" --steps 2 --resume state_skipped_huge
bad "resume: no format tag" "metadata 'format': expected \"loom\.train_state\.v1\", got none" \
    -- "${TRAIN[@]}" --steps 2 --resume state_no_format
bad "resume: another format" "metadata 'format': expected \"loom\.train_state\.v1\", got \"loom\.train_state\.v9\"" \
    -- "${TRAIN[@]}" --steps 2 --resume state_other_format
bad "resume: step differs from the folder's name" \
    "metadata 'step': expected 1 \\(the folder's name\\), got 7" \
    -- "${TRAIN[@]}" --steps 9 --resume state_step_mismatch
bad "resume: more bad steps than skipped ones" \
    'expected bad_steps <= skipped_total <= step, got bad_steps 1, skipped_total 0, step 1' \
    -- "${TRAIN[@]}" --steps 2 --resume state_bad_steps

# ---- sample and eval flags -----------------------------------------------------------------

bad "sample: no --checkpoint" '--checkpoint: expected a path' -- "$LOOM" sample
bad "sample: negative --tokens" '--tokens: expected >= 0, got -1' \
    -- "$LOOM" sample --checkpoint run_ok --tokens -1
bad "sample: negative --top-k" '--top-k: expected >= 0' \
    -- "$LOOM" sample --checkpoint run_ok --top-k -3
bad "sample: negative --temperature" '--temperature: expected a number >= 0, got -1' \
    -- "$LOOM" sample --checkpoint run_ok --temperature -1
bad "eval: no --data" '--data: expected' -- "$LOOM" eval --checkpoint run_ok
bad "eval: no --checkpoint" '--checkpoint: expected' -- "$LOOM" eval --data data/train.bin
bad "eval: --seq-len beyond the context" \
    "--seq-len: expected 1\.\.16 \(the model's context\), got 999" \
    -- "$LOOM" eval --checkpoint run_ok --data data/train.bin --seq-len 999
bad "eval: negative --seq-len" '--seq-len: expected >= 0.*got -4' \
    -- "$LOOM" eval --checkpoint run_ok --data data/train.bin --seq-len -4
bad "eval: --batch 0" '--batch: expected a positive integer' \
    -- "$LOOM" eval --checkpoint run_ok --data data/train.bin --batch 0
bad "eval: negative --max-windows" '--max-windows: expected >= 0.*got -1' \
    -- "$LOOM" eval --checkpoint run_ok --data data/train.bin --max-windows -1

# ---- prepare -------------------------------------------------------------------------------

bad "prepare: missing text file" 'nosuch\.txt: cannot open input text' \
    -- "$LOOM" prepare --text nosuch.txt --out prepared
bad "prepare: empty text file" 'empty\.txt: input text is empty' \
    -- "$LOOM" prepare --text empty.txt --out prepared
bad "prepare: text is a folder" 'data: input text is not a regular file' \
    -- "$LOOM" prepare --text data --out prepared
bad "prepare: --val-fraction 1.5" 'val-fraction: expected a number in \[0, 1\), got 1\.5' \
    -- "$LOOM" prepare --text text.txt --out prepared --val-fraction 1.5
bad "prepare: no --text" '--text: expected at least one text file' -- "$LOOM" prepare --out prepared
bad "prepare: no --out" '--out: expected a folder' -- "$LOOM" prepare --text text.txt
bad "prepare: --seq-len 0" '--seq-len: expected a positive integer, got 0' \
    -- "$LOOM" prepare --text text.txt --out prepared --seq-len 0
bad "prepare: --shard-tokens 0" '--shard-tokens: expected a positive integer, got 0' \
    -- "$LOOM" prepare --text text.txt --out prepared --shard-tokens 0
bad "prepare: --out is a file" 'text\.txt: output directory: exists and is not a directory' \
    -- "$LOOM" prepare --text text.txt --out text.txt
if [ -e prepared ]; then
    record "prepare: bad input writes nothing" "the folder 'prepared' was created"
else
    record "prepare: bad input writes nothing" ""
fi
good "prepare: --text=FILE" 'wrote prepared/train_000000\.bin' \
    -- "$LOOM" prepare --text=text.txt --out prepared --seq-len 16

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
