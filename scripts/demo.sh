#!/usr/bin/env bash
# The quick start's main job: install what is missing, build, turn the default corpus (the
# fortune cookie database from Debian's `fortunes` package, ~2.5 MB of English quotes) into
# byte-level token shards, train the `small` GPT on it, and print a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
./build/loom prepare --text $corpus --out data/fortunes --seq-len 128
./build/loom train --model small --data 'data/fortunes/train_*.bin' \
    --val-data 'data/fortunes/val_*.bin' --steps ${STEPS:-1000} --seq-len 128 \
    --micro-batch-size 8 --global-batch-size 16 --lr 3e-3 --warmup-steps 50 \
    --eval-every 100 --log-every 50 --out runs/fortunes "$@"
echo
echo "== sample from runs/fortunes"
./build/loom sample --checkpoint runs/fortunes --prompt "The " --tokens 300 --temperature 0.8
