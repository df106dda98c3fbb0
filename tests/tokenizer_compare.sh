#!/usr/bin/env bash
# GPT-2's tokenizer against an independent implementation: `loom tokenize` with GPT-2's real
# vocabulary and merges gives, id for id, what js-tiktoken's gpt2 encoding gives (run by node,
# all special tokens allowed) on ~300 KB of varied text (tokenizer_text.py: the default corpus,
# licenses, non-ASCII scripts, whitespace runs, contractions, digits, <|endoftext|>), and
# `loom tokenize --decode` gives back every byte, also of random bytes (invalid UTF-8).
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
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
