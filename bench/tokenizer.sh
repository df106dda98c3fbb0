#!/usr/bin/env bash
# Throughput of GPT-2's tokenizer in `loom prepare`: the default corpus (the fortunes files, one
# document each, ~2.6 MB) tokenised with GPT-2's real vocabulary on 1 thread and on every core;
# best of 3 runs each, as prepare reports it (tokenising only: reading and writing excluded).
# usage: bash bench/tokenizer.sh [BUILD_DIR]   (a Release build; GPT-2's files from scripts/testdata.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
data=$(bash scripts/testdata.sh)
mapfile -t corpus < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for threads in 1 "$(nproc)"; do
    best=0
    for _ in 1 2 3; do
        mbs=$("$build/loom" prepare --text "${corpus[@]}" --out "$out" --tokenizer "$data/tok" \
            --threads "$threads" | sed -n 's/.*tokenised .* (\([0-9.]*\) MB\/s.*/\1/p')
        best=$(python3 -c "print(max($best, $mbs))")
    done
    echo "GPT-2 tokenizer, $threads thread(s): $best MB/s"
done
