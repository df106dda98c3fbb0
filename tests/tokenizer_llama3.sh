#!/usr/bin/env bash
# Llama 3's tokenizer against two independent implementations: `loom tokenize` with a Llama 3
# tokenizer.json (written by scripts/testdata_llama3.sh from the vocabulary and merges that the npm
# package llama3-tokenizer-js bundles, with the pre_tokenizer, decoder, ignore_merges and special
# tokens Llama 3's file declares) gives, id for id,
#   - what @huggingface/tokenizers (Hugging Face's tokenizer.json reader in JavaScript, whose
#     pattern translation keeps the Rust engines' \s = White_Space) gives reading the same file,
#     on the ~300 KB of varied text tokenizer_compare.sh uses (tokenizer_text.py) plus Llama 3's
#     special tokens and words only ignore_merges encodes as one token, and
#   - what llama3-tokenizer-js gives with its own data and encoder on that text less U+0085 and
#     U+FEFF (it runs the pattern with JavaScript's \s, which differs in those two only);
# `loom tokenize --decode` gives back every byte (of the text, and of random bytes); and the
# tokenizer's folder works as the file does. Runs in a few seconds once the packages are fetched;
# skipped (exit 77, with the reason) when node, npm or the packages cannot be had.
# usage: tokenizer_llama3.sh LOOM TMPDIR
set -uo pipefail
loom=$1 tmp=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$tmp" && mkdir -p "$tmp"
if ! data=$(bash "$here/../scripts/testdata_llama3.sh" 2>"$tmp/testdata.err"); then
    echo "SKIPPED: Llama 3 tokenizer test data unavailable: $(cat "$tmp/testdata.err")"
    exit 77
fi
fail=0 pass=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
compare() { # NAME REF_IDS LOOM_IDS: id for id
    python3 - "$@" <<'PY'
import sys
name, a, b = sys.argv[1], open(sys.argv[2]).read().split(), open(sys.argv[3]).read().split()
first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
if first is None and len(a) != len(b): first = min(len(a), len(b))
print(f"{len(a)} {name} ids, loom {len(b)}; first mismatch at {first}")
if first is not None: print(f"  {name}:", a[first:first + 8], "\n  loom:", b[first:first + 8])
sys.exit(0 if a == b else 1)
PY
}
corpus=()
[ -d /usr/share/games/fortunes ] &&
    mapfile -t corpus < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
cat "${corpus[@]}" /dev/null >"$tmp/fortunes.txt"
python3 "$here/tokenizer_text.py" "$tmp/text.txt" "$tmp/fortunes.txt" /usr/share/common-licenses/GPL-3
# Llama 3's special tokens, alone, inside words, next to each other and half-written
printf '\n<|begin_of_text|>Hi<|eot_id|>\n<|start_header_id|>user<|end_header_id|>\n\nx<|end_of_text|><|reserved_special_token_247|>%s\n' \
    '<|reserved_special_token_248|> <|eot_id <|python_tag|>1234567' >>"$tmp/text.txt"
# words that are tokens the merges do not reach (ignore_merges makes them one token)
printf 'việc hợp nhiều Việt jeho lardan mektedir zdrav nhanh .:.:.:.:.:.:.:.: điều\n' >>"$tmp/text.txt"
python3 -c "
import sys; t = open(sys.argv[1], encoding='utf-8').read()
open(sys.argv[2], 'w', encoding='utf-8').write(t.replace('\u0085', '').replace('\ufeff', ''))" \
    "$tmp/text.txt" "$tmp/text_js.txt"
cat >"$data/ref_hf.mjs" <<'JS'
import { Tokenizer } from "@huggingface/tokenizers";
import { readFileSync } from "fs";
const tok = new Tokenizer(JSON.parse(readFileSync(process.argv[2], "utf8")), {});
const text = readFileSync(process.argv[3], "utf8");
console.log(tok.encode(text, { add_special_tokens: false }).ids.join(" "));
JS
cat >"$data/ref_l3.mjs" <<'JS'
import llama3Tokenizer from "llama3-tokenizer-js";
import { readFileSync } from "fs";
const text = readFileSync(process.argv[2], "utf8");
console.log(llama3Tokenizer.encode(text, { bos: false, eos: false }).join(" "));
JS
# the references run while loom does
node "$data/ref_hf.mjs" "$data/tok/tokenizer.json" "$tmp/text.txt" >"$tmp/hf.ids" 2>"$tmp/hf.err" &
hf_job=$!
node "$data/ref_l3.mjs" "$tmp/text_js.txt" >"$tmp/l3.ids" 2>"$tmp/l3.err" &
l3_job=$!

"$loom" tokenize --tokenizer "$data/tok/tokenizer.json" <"$tmp/text.txt" >"$tmp/loom.ids"
check "loom tokenize exits 0" '[ $? -eq 0 ]'
"$loom" tokenize --tokenizer "$data/tok" <"$tmp/text_js.txt" >"$tmp/loom_js.ids"
check "loom tokenize of the folder exits 0" '[ $? -eq 0 ]'
check "ids past 65535: the special tokens" 'grep -qw 128009 "$tmp/loom.ids" && grep -qw 128255 "$tmp/loom.ids"'
"$loom" tokenize --tokenizer "$data/tok/tokenizer.json" --decode <"$tmp/loom.ids" >"$tmp/back.txt"
check "decode(encode(text)) == text" 'cmp -s "$tmp/back.txt" "$tmp/text.txt"'
python3 -c "import random,sys; r=random.Random(5); sys.stdout.buffer.write(bytes(r.getrandbits(8) for _ in range(100000)))" >"$tmp/random.bin"
"$loom" tokenize --tokenizer "$data/tok/tokenizer.json" <"$tmp/random.bin" >"$tmp/random.ids"
"$loom" tokenize --tokenizer "$data/tok/tokenizer.json" --decode <"$tmp/random.ids" >"$tmp/random.back"
check "decode(encode(random bytes)) == random bytes" 'cmp -s "$tmp/random.back" "$tmp/random.bin"'

wait $hf_job || { echo "FAIL: @huggingface/tokenizers failed: $(head -c 500 "$tmp/hf.err")"; exit 1; }
compare @huggingface/tokenizers "$tmp/hf.ids" "$tmp/loom.ids"
check "every id equals @huggingface/tokenizers' (the same tokenizer.json)" '[ $? -eq 0 ]'
wait $l3_job || { echo "FAIL: llama3-tokenizer-js failed: $(head -c 500 "$tmp/l3.err")"; exit 1; }
compare llama3-tokenizer-js "$tmp/l3.ids" "$tmp/loom_js.ids"
check "every id equals llama3-tokenizer-js' (its own data and encoder)" '[ $? -eq 0 ]'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
