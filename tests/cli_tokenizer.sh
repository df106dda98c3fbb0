#!/usr/bin/env bash
# GPT-2-style tokenizers end to end on a tiny byte-level BPE written here (GPT-2's alphabet, eight
# merges, <|endoftext|> = 264): `loom tokenize` both ways; `prepare --tokenizer` (EOT before each
# document); training records the tokenizer in the checkpoint, and `sample` / `eval --text`
# use it without being told; a tokenizer the model's vocabulary cannot hold, or another than the
# model records, is refused by name; bad tokenizer files end with exit 2 naming file and line; the
# same vocabulary as a tokenizer.json declaring Llama 3's pre-tokenizer, with special tokens past
# 16 bits, encodes and decodes, `prepare` writes llm.c's uint32 shards for it (read back here with
# Python's struct), a model with its 128002 ids trains on them, samples and evaluates text, and a
# Metaspace pre-tokenizer is refused naming the field.
# usage: cli_tokenizer.sh LOOM_BINARY TMPDIR
. "$(dirname "$0")/cli_harness.bash"


python3 - <<'PY'
import json, os
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
sym = {b: chr(c) for b, c in zip(bs, cs)}
enc = lambda s: "".join(sym[b] for b in s.encode())
merges = [("t", "h"), ("th", "e"), (" ", "the"), ("e", "r"), (" ", "a"), ("i", "n"), ("o", "n"), (" ", "s")]
vocab = {sym[b]: b for b in range(256)}
for i, (a, b) in enumerate(merges):
    vocab[enc(a + b)] = 256 + i
vocab["<|endoftext|>"] = 256 + len(merges)
os.makedirs("tok", exist_ok=True)
json.dump(vocab, open("tok/vocab.json", "w"))
open("tok/merges.txt", "w").write("#version: 0.2\n" + "".join(f"{enc(a)} {enc(b)}\n" for a, b in merges))
words = "the quick brown fox jumps over the lazy dog and then runs far away into the deep green forest".split()
import random
r = random.Random(3)
open("text.txt", "w").write(" ".join(r.choice(words) + ("\n" if r.random() < 0.1 else "") for _ in range(6000)))
PY

# ---- tokenize ------------------------------------------------------------------------------
good "tokenize: the and <|endoftext|>" '^257 258 32 261 264 97$' -- \
    sh -c "printf 'the the in<|endoftext|>a' | '$LOOM' tokenize --tokenizer tok"
good "tokenize --decode gives the bytes back" '^the the in<\|endoftext\|>a$' -- \
    sh -c "echo '257 258 32 261 264 97' | '$LOOM' tokenize --tokenizer tok --decode"
printf 'caf\xc3\xa9 \xff\xfe the\t\t end  \n' >odd.txt
"$LOOM" tokenize --tokenizer tok/vocab.json <odd.txt | "$LOOM" tokenize --tokenizer tok --decode >odd.back
check "round trip of invalid UTF-8, byte for byte" "$(cmp -s odd.txt odd.back || echo differs)"
bad "tokenize --decode refuses an unknown id" 'token 1: expected an id of the tokenizer \(0\.\.264\), got "9999"' -- \
    sh -c "echo '5 9999' | '$LOOM' tokenize --tokenizer tok --decode"
bad "tokenize --decode refuses a NUL byte, not stops at it" \
    'standard input: byte 7 is a NUL byte: expected token ids' -- \
    sh -c "printf '257 258\\0000 32 9999' | '$LOOM' tokenize --tokenizer tok --decode"
printf '257 258 32\0' | "$LOOM" tokenize --tokenizer tok --decode >nul.out 2>/dev/null
check "tokenize --decode writes nothing before refusing a NUL byte" \
    "$([ -s nul.out ] && echo "wrote $(wc -c <nul.out) bytes")"
bad "tokenize needs --tokenizer" '--tokenizer: expected' -- "$LOOM" tokenize
mkdir -p badtok && cp tok/vocab.json badtok/ && printf '#version: 0.2\nt h\nzz q\n' >badtok/merges.txt
bad "merges naming an unknown symbol" 'badtok/merges.txt:3: symbol "zz" is not in the vocabulary' -- \
    "$LOOM" tokenize --tokenizer badtok
printf '{"a": 1,\n"b" 2}\n' >badtok/vocab.json
bad "malformed vocab.json" 'badtok/vocab.json:2:[0-9]+: malformed JSON' -- "$LOOM" tokenize --tokenizer badtok
python3 -c "import json; v=json.load(open('tok/vocab.json')); del v['q']; json.dump(v, open('badtok/vocab.json','w'))"
bad "a vocabulary without a byte" 'vocab.json: the vocabulary does not cover the 256 bytes: byte 0x71' -- \
    "$LOOM" tokenize --tokenizer badtok
bad "a missing tokenizer" 'nowhere: cannot open tokenizer' -- "$LOOM" tokenize --tokenizer nowhere

# ---- a tokenizer.json declaring Llama 3's pre-tokenizer ------------------------------------
# the tiny vocabulary above with Llama 3's pre_tokenizer, ignore_merges and two special tokens
# past 16 bits; the same file with SentencePiece's Metaspace instead
python3 - <<'PY'
import json, os
vocab = json.load(open("tok/vocab.json")); del vocab["<|endoftext|>"]
merges = [l for l in open("tok/merges.txt", encoding="utf-8").read().split("\n")[1:] if l]
pattern = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
           " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
doc = {"added_tokens": [{"id": 128000, "content": "<|begin_of_text|>", "special": True},
                        {"id": 128001, "content": "<|end_of_text|>", "special": True}],
       "normalizer": None,
       "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
           {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
           {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
       "model": {"type": "BPE", "ignore_merges": True, "vocab": vocab, "merges": merges}}
os.makedirs("l3", exist_ok=True); json.dump(doc, open("l3/tokenizer.json", "w"))
doc["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"}
os.makedirs("l3bad", exist_ok=True); json.dump(doc, open("l3bad/tokenizer.json", "w"))
PY
good "tokenize with Llama 3's pre-tokenizer: special ids past 65535" \
    '^128000 257 258 32 49 50 51 52 32 32 10 10 128001$' -- \
    sh -c "printf '<|begin_of_text|>the the 1234  \\n\\n<|end_of_text|>' | '$LOOM' tokenize --tokenizer l3"
good "tokenize --decode of ids past 65535" '^<\|begin_of_text\|>the$' -- \
    sh -c "echo '128000 257' | '$LOOM' tokenize --tokenizer l3/tokenizer.json --decode"
bad "a Metaspace pre-tokenizer is refused naming the file and the field" \
    'l3bad/tokenizer.json: pre_tokenizer: a "Metaspace" pre-tokenizer is not supported' \
    "Llama 3's Sequence" -- "$LOOM" tokenize --tokenizer l3bad
good "prepare with 128002 ids writes uint32 shards" 'vocab 128002 \(gpt2\), uint32 tokens' -- \
    "$LOOM" prepare --text text.txt --out l3data --tokenizer l3 --seq-len 16 --threads 2
# llm.c's Llama 3 shard, parsed here: header magic 20240801, version 7, count; 4 bytes a token;
# <|begin_of_text|> = 128000 before each part (Llama 3's documents start with it, as llm.c's
# Llama 3 shards do); train and val parts less it are the text's ids as `loom tokenize` prints
# them
"$LOOM" tokenize --tokenizer l3 <text.txt >l3.ids
why=$(python3 - <<'PY'
import struct
def shard(path):
    raw = open(path, "rb").read()
    magic, version, count = struct.unpack("<3i", raw[:12])
    if (magic, version) != (20240801, 7) or len(raw) != 1024 + 4 * count:
        raise SystemExit(f"{path}: header {magic} {version} {count}, {len(raw)} bytes")
    return list(struct.unpack(f"<{count}I", raw[1024:]))
train, val = shard("l3data/train_000000.bin"), shard("l3data/val_000000.bin")
ids = [int(t) for t in open("l3.ids").read().split()]
if train[0] != 128000 or val[0] != 128000:
    print(f"first tokens {train[0]} and {val[0]}, expected <|begin_of_text|> 128000")
elif train[1:] + val[1:] != ids:
    print(f"{len(train) - 1} + {len(val) - 1} ids differ from tokenize's {len(ids)}")
elif max(ids) < 256 or max(ids) >= 128002:
    print(f"ids up to {max(ids)}")
PY
)
check "the shards hold <|begin_of_text|> + the text's ids as little-endian uint32" "$why"

# ---- prepare, train, sample, eval ----------------------------------------------------------
good "prepare --tokenizer" 'vocab 265 \(gpt2\)' -- \
    "$LOOM" prepare --text text.txt --out data --tokenizer tok --seq-len 16 --threads 2
first=$(python3 -c "import struct; print(struct.unpack('<H', open('data/train_000000.bin','rb').read()[1024:1026])[0])")
check "a GPT-2 shard starts with EOT" "$([ "$first" = 264 ] || echo "first token $first")"
FLAGS=(--model tiny --data 'data/train_*.bin' --threads 1 --seq-len 16 --micro-batch-size 2
    --global-batch-size 2 --steps 2 --eval-every 0)
bad "train refuses a model vocabulary that cannot hold the tokenizer" \
    'the model.s vocabulary has 257 ids, the gpt2 tokenizer \(tok\) has 265' -- \
    "$LOOM" train "${FLAGS[@]}" --tokenizer tok --out run_bad
good "train --tokenizer" '' -- "$LOOM" train "${FLAGS[@]}" --vocab 265 --tokenizer tok --out run
meta=$(python3 -c "
import json, struct, glob
f = open(sorted(glob.glob('run/checkpoints/step_*/model.safetensors'))[-1], 'rb')
n = struct.unpack('<Q', f.read(8))[0]; m = json.loads(f.read(n))['__metadata__']
print(m.get('loom.tokenizer'), m.get('loom.tokenizer_source'))")
check "the checkpoint records the tokenizer" "$([ "$meta" = "gpt2 $PWD/tok" ] || echo "got '$meta'")"
good "sample uses the recorded tokenizer" '^the' -- "$LOOM" sample --checkpoint run --prompt the --tokens 5
last=$(ls -d run/checkpoints/step_* | sort | tail -n1)
check "the checkpoint folder carries the tokenizer's files" \
    "$(cmp tok/vocab.json "$last/vocab.json" && cmp tok/merges.txt "$last/merges.txt" || echo "not copied")"
bad "sample refuses another tokenizer than the recorded one" \
    'bytes is the bytes tokenizer, but the model run was trained with the gpt2 tokenizer' -- \
    "$LOOM" sample --checkpoint run --tokenizer bytes --tokens 5
good "eval --text with the recorded tokenizer" '^loss [0-9.]+ ' -- \
    "$LOOM" eval --checkpoint run --text text.txt --seq-len 16 --max-windows 4
mv tok tok_moved
good "eval --data needs no tokenizer (the recorded files moved away)" '^loss [0-9.]+ ' -- \
    "$LOOM" eval --checkpoint run --data 'data/val_*.bin' --seq-len 16 --max-windows 4
good "sample falls back on the checkpoint's copy when the recorded files moved away" '^the' -- \
    "$LOOM" sample --checkpoint run --prompt the --tokens 5
mkdir -p run_nocopy && cp "$last/model.safetensors" "$last/config.json" run_nocopy/
bad "sample names the recorded tokenizer it cannot open" "records the gpt2 tokenizer from $PWD/tok, which cannot be opened" -- \
    "$LOOM" sample --checkpoint run_nocopy --tokens 5
mv tok_moved tok
good "resume keeps the recorded tokenizer" '' -- \
    "$LOOM" train "${FLAGS[@]}" --vocab 265 --steps 3 --resume run --out run
meta=$(python3 -c "
import json, struct
f = open('run/checkpoints/step_00000003/model.safetensors', 'rb')
n = struct.unpack('<Q', f.read(8))[0]; print(json.loads(f.read(n))['__metadata__'].get('loom.tokenizer'))")
check "the resumed checkpoint records it too" "$([ "$meta" = gpt2 ] || echo "got '$meta'")"
bad "resume refuses another tokenizer than the checkpoint's" \
    '--tokenizer bytes is the bytes tokenizer, but --resume run.* records the gpt2 tokenizer' -- \
    "$LOOM" train "${FLAGS[@]}" --vocab 265 --steps 4 --resume run --out run --tokenizer bytes
# the recorded tokenizer moved away: a resume in the same folder takes the checkpoint's copy,
# and pruning the step it came from loses nothing (each save copies from the newest step)
cp -r run run_away && mv tok tok_gone
good "resume while the recorded tokenizer is away, pruning old steps" '' -- \
    "$LOOM" train "${FLAGS[@]}" --vocab 265 --steps 6 --save-every 1 --keep-last 1 --resume run_away --out run_away
last=$(ls -d run_away/checkpoints/step_* | sort | tail -n1)
check "the newest checkpoint still carries the tokenizer's files" \
    "$(cmp tok_gone/vocab.json "$last/vocab.json" 2>&1 && cmp tok_gone/merges.txt "$last/merges.txt" 2>&1)"
mv tok_gone tok
"$LOOM" prepare --text text.txt --out bytes_data --seq-len 16 >/dev/null
good "a byte model trained with --tokenizer bytes" '' -- \
    "$LOOM" train "${FLAGS[@]}" --data 'bytes_data/train_*.bin' --tokenizer bytes --out run_bytes
bad "sample refuses GPT-2's tokenizer for a byte model" 'run_bytes.*vocabulary has 257 ids, the gpt2 tokenizer' -- \
    "$LOOM" sample --checkpoint run_bytes --tokenizer tok --tokens 5

# ---- a vocabulary past 16 bits: train, sample and eval on the uint32 shards ----------------
good "train a 128002-id model on uint32 shards" '' -- \
    "$LOOM" train "${FLAGS[@]}" --data 'l3data/train_*.bin' --vocab 128002 --tokenizer l3 --out run_l3
good "sample from it with the recorded tokenizer" '^the' -- \
    "$LOOM" sample --checkpoint run_l3 --prompt the --tokens 3
good "eval --text tokenises into uint32 shards" '^loss [0-9.]+ .*tokens 64 ' -- \
    "$LOOM" eval --checkpoint run_l3 --text text.txt --seq-len 16 --max-windows 4
bad "a 50000-id model refuses the 128002-id data by file and position" \
    'l3data/train_000000\.bin: token at position 0 is 128000: expected < vocab size 50000' -- \
    "$LOOM" train "${FLAGS[@]}" --data 'l3data/train_*.bin' --vocab 50000 --out run_l3_small

# ---- --init-from a Hugging Face GPT-2 folder -----------------------------------------------
# config.json + model.safetensors (loom's checkpoint with its metadata stripped to "format",
# as Hugging Face writes it) + the tokenizer files: one flag gives the model and the tokenizer.
mkdir -p hf && cp tok/vocab.json tok/merges.txt hf/
python3 - <<'PY'
import glob, json, struct
src = open(sorted(glob.glob('run/checkpoints/step_*/model.safetensors'))[-1], 'rb').read()
n = struct.unpack('<Q', src[:8])[0]
header = json.loads(src[8:8 + n]); header['__metadata__'] = {'format': 'pt'}
text = json.dumps(header).encode(); text += b' ' * (-len(text) % 8)
open('hf/model.safetensors', 'wb').write(struct.pack('<Q', len(text)) + text + src[8 + n:])
json.dump({"model_type": "gpt2", "activation_function": "gelu_new", "n_layer": 2, "n_head": 2,
           "n_embd": 16, "n_positions": 16, "vocab_size": 265}, open('hf/config.json', 'w'))
PY
good "sample from a Hugging Face folder uses its tokenizer" '^the' -- \
    "$LOOM" sample --checkpoint hf --prompt the --tokens 5
good "train --init-from a Hugging Face folder" 'initialised from hf' -- \
    "$LOOM" train "${FLAGS[@]:2}" --init-from hf --out run_hf
meta=$(python3 -c "
import json, struct, glob
f = open(sorted(glob.glob('run_hf/checkpoints/step_*/model.safetensors'))[-1], 'rb')
n = struct.unpack('<Q', f.read(8))[0]; m = json.loads(f.read(n))['__metadata__']
print(m.get('loom.tokenizer'), m.get('loom.tokenizer_source'))")
check "the fine-tuned checkpoint records the folder's tokenizer" \
    "$([ "$meta" = "gpt2 $PWD/hf" ] || echo "got '$meta'")"
good "sample the fine-tuned model" '^the' -- "$LOOM" sample --checkpoint run_hf --prompt the --tokens 5
sed -i 's/"n_head": 2/"n_head": 0/' hf/config.json
bad "a bad config.json is refused naming the key" 'hf/config.json: n_head: expected a positive integer' -- \
    "$LOOM" train "${FLAGS[@]:2}" --init-from hf --out run_hf2

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
