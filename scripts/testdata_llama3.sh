#!/usr/bin/env bash
# Fetches the test data of Llama 3's tokenizer, once, into a cache outside git (LOOM_CACHE, else
# ~/.cache/loom): the npm packages llama3-tokenizer-js (Llama 3's vocabulary and merges, bundled,
# with an encoder of its own) and @huggingface/tokenizers (Hugging Face's tokenizer.json reader in
# JavaScript), both used by tests/tokenizer_llama3.sh as references, and tok/tokenizer.json written
# from the bundled vocabulary and merges as Llama 3's tokenizer.json declares them (its Split +
# ByteLevel pre-tokenizer, ByteLevel decoder, ignore_merges, the 256 special tokens from 128000 on,
# as the package lists them). Prints the folder; exits 1 with a reason when node, npm or the
# registry is unavailable. Nothing at run time depends on node.
set -euo pipefail
dir=${LOOM_CACHE:-$HOME/.cache/loom}/llama3-tokenizer
command -v node >/dev/null && command -v npm >/dev/null || { echo "node/npm not installed" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
npm_reason() { grep -m1 -i 'err' npm.err || echo "no message from npm"; }
pkgs="llama3-tokenizer-js@1.2.0 @huggingface/tokenizers@0.2.0"
stamp="installed: $pkgs"
if [ "$(cat installed 2>/dev/null)" != "$stamp" ] || [ ! -d node_modules/llama3-tokenizer-js ] ||
    [ ! -d node_modules/@huggingface/tokenizers ]; then
    rm -rf node_modules tok installed
    # a package.json here keeps npm from installing into a folder above that has one
    [ -f package.json ] || echo '{"private": true}' >package.json
    # shellcheck disable=SC2086 # two package names
    npm install --loglevel=error --no-save --no-audit --no-fund $pkgs >/dev/null 2>npm.err ||
        { echo "npm install $pkgs failed: $(npm_reason)" >&2; exit 1; }
    echo "$stamp" >installed
fi
if [ ! -s tok/tokenizer.json ]; then
    mkdir -p tok
    # the generator lives beside node_modules so that node finds the package
    cat >make_tokenizer_json.mjs <<'JS'
import { Llama3Tokenizer } from "llama3-tokenizer-js";
import { readFileSync, writeFileSync } from "fs";
import { createRequire } from "module";
const PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// the package's own copy of the pattern must be the one written here
const bundle = readFileSync(createRequire(import.meta.url).resolve("llama3-tokenizer-js"), "utf8");
if (!bundle.includes(JSON.stringify(PATTERN))) throw new Error("llama3-tokenizer-js: another pre-tokenizer pattern");
const t = new Llama3Tokenizer();
const FIRST_SPECIAL = 128000;
const vocab = Object.create(null); // "constructor" is a token too
for (let id = 0; id < FIRST_SPECIAL; id++) {
    if (t.vocabById[id] in vocab) throw new Error(`token ${id} twice in the vocabulary`);
    vocab[t.vocabById[id]] = id;
}
const added_tokens = t.vocabById.slice(FIRST_SPECIAL).map((content, i) => ({
    id: FIRST_SPECIAL + i, content, single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: true }));
if (added_tokens.length !== 256) throw new Error(`${added_tokens.length} special tokens, expected 256`);
const doc = {
    version: "1.0", truncation: null, padding: null, added_tokens, normalizer: null,
    pre_tokenizer: { type: "Sequence", pretokenizers: [
        { type: "Split", pattern: { Regex: PATTERN }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: "Sequence", processors: [
        { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
        { type: "TemplateProcessing",
          single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
          pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
                 { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
          special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [FIRST_SPECIAL], tokens: ["<|begin_of_text|>"] } } }] },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
             vocab, merges: [...t.merges.keys()] },
};
writeFileSync(process.argv[2], JSON.stringify(doc));
JS
    node make_tokenizer_json.mjs tok/tokenizer.json.tmp 2>node.err ||
        { echo "writing Llama 3's tokenizer.json failed: $(head -c 300 node.err)" >&2; exit 1; }
    mv tok/tokenizer.json.tmp tok/tokenizer.json
fi
echo "$dir"
