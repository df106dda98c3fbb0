#!/usr/bin/env bash
# GPT-2's tokenizer against an independent implementation: `loom tokenize` with GPT-2's real
# vocabulary and merges gives, id for id, what js-tiktoken's gpt2 encoding gives (run by node,
# all special tokens allowed) on ~300 KB of varied text (tokenizer_text.py: the default corpus,
# licenses, non-ASCII scripts, whitespace runs, contractions, digits, <|endoftext|>), and
# `loom tokenize --decode` gives back every byte, also of random bytes (invalid UTF-8); the same
# files as tokenizer.json and as llm.c's gpt2_tokenizer.bin give the same ids and bytes.
# Skipped (exit 77, with the reason) when node, npm or the packages cannot be had.
# usage: tokenizer_compare.sh LOOM TMPDIR
set -uo pipefail
loom=$1 tmp=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$tmp" && mkdir -p "$tmp"
if ! data=$(bash "$here/../scripts/testdata.sh" 2>"$tmp/testdata.err"); then
    echo "SKIPPED: GPT-2 tokenizer test data unavailable: $(cat "$tmp/testdata.err")"
    exit 77
fi
fail=0 pass=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
corpus=()
[ -d /usr/share/games/fortunes ] &&
    mapfile -t corpus < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
cat "${corpus[@]}" /dev/null >"$tmp/fortunes.txt"
python3 "$here/tokenizer_text.py" "$tmp/text.txt" "$tmp/fortunes.txt" /usr/share/common-licenses/GPL-3
cat >"$tmp/ref.mjs" <<'JS'
import { getEncoding } from "js-tiktoken";
import { readFileSync } from "fs";
const enc = getEncoding("gpt2");
console.log(enc.encode(readFileSync(process.argv[2], "utf8"), "all").join(" "));
JS
cp "$tmp/ref.mjs" "$data/ref.mjs"
node "$data/ref.mjs" "$tmp/text.txt" >"$tmp/ref.ids" || { echo "FAIL: js-tiktoken failed"; exit 1; }
"$loom" tokenize --tokenizer "$data/tok" <"$tmp/text.txt" >"$tmp/loom.ids"
check "loom tokenize exits 0" '[ $? -eq 0 ]'
python3 - "$tmp/ref.ids" "$tmp/loom.ids" <<'PY'
import sys
a = open(sys.argv[1]).read().split(); b = open(sys.argv[2]).read().split()
first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
print(f"{len(a)} js-tiktoken ids, loom {len(b)}; first mismatch at {first}")
if first is not None: print("  js-tiktoken:", a[first:first + 8], "\n  loom:       ", b[first:first + 8])
sys.exit(0 if a == b else 1)
PY
check "every id equals js-tiktoken's" '[ $? -eq 0 ]'
"$loom" tokenize --tokenizer "$data/tok" --decode <"$tmp/loom.ids" >"$tmp/back.txt"
check "decode(encode(text)) == text" 'cmp -s "$tmp/back.txt" "$tmp/text.txt"'
python3 -c "import random,sys; r=random.Random(5); sys.stdout.buffer.write(bytes(r.getrandbits(8) for _ in range(100000)))" >"$tmp/random.bin"
"$loom" tokenize --tokenizer "$data/tok" <"$tmp/random.bin" >"$tmp/random.ids"
"$loom" tokenize --tokenizer "$data/tok" --decode <"$tmp/random.ids" >"$tmp/random.back"
check "decode(encode(random bytes)) == random bytes" 'cmp -s "$tmp/random.back" "$tmp/random.bin"'
# the same vocabulary in the two other formats: tokenizer.json (merges as "a b" strings, as
# Hugging Face writes GPT-2's) encodes the same ids; llm.c's gpt2_tokenizer.bin (version 2)
# decodes them to the same bytes
python3 - "$data/tok" "$tmp" <<'PY'
import json, struct, sys
src, out = sys.argv[1], sys.argv[2]
vocab = json.load(open(f"{src}/vocab.json", encoding="utf-8"))
merges = [l for l in open(f"{src}/merges.txt", encoding="utf-8").read().split("\n")[1:] if l]
doc = {"version": "1.0", "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True}],
       "model": {"type": "BPE", "dropout": None, "vocab": vocab, "merges": merges}}
import os
os.makedirs(f"{out}/hf", exist_ok=True); os.makedirs(f"{out}/llmc", exist_ok=True)
json.dump(doc, open(f"{out}/hf/tokenizer.json", "w", encoding="utf-8"), ensure_ascii=False)
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
byte_of = {chr(c): b for b, c in zip(bs, cs)}
pieces = [None] * len(vocab)
for token, i in vocab.items():
    pieces[i] = b"<|endoftext|>" if token == "<|endoftext|>" else bytes(byte_of[ch] for ch in token)
header = [20240328, 2, len(pieces), 50256] + [0] * 252
with open(f"{out}/llmc/gpt2_tokenizer.bin", "wb") as f:
    f.write(struct.pack("<256i", *header) + b"".join(bytes([len(p)]) + p for p in pieces))
PY
"$loom" tokenize --tokenizer "$tmp/hf" <"$tmp/text.txt" >"$tmp/hf.ids"
check "tokenizer.json gives the same ids" 'cmp -s "$tmp/hf.ids" "$tmp/loom.ids"'
"$loom" tokenize --tokenizer "$tmp/llmc/gpt2_tokenizer.bin" --decode <"$tmp/loom.ids" >"$tmp/llmc.txt"
check "gpt2_tokenizer.bin decodes to the same bytes" 'cmp -s "$tmp/llmc.txt" "$tmp/text.txt"'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
