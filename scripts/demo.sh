#!/usr/bin/env bash
# The quick start's main job: install what is missing, build, turn the default corpus (the
# fortune cookie database from Debian's `fortunes` package, ~2.5 MB of English quotes) into
# byte-level token shards, train the `small` GPT on it with 2 data-parallel MPI ranks (one
# thread each), and print a sample. RANKS=1 trains in one process instead; STEPS sets the
# number of steps; extra arguments go to `loom train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
# shellcheck disable=SC2086
./build/loom prepare --text $corpus --out data/fortunes --seq-len 256
ranks=${RANKS:-2}
launch=()
if [ "$ranks" -gt 1 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
    export OMPI_MCA_mpi_yield_when_idle=1
    launch=(mpirun -np "$ranks" --oversubscribe)
    threads=1
else
    threads=0
fi
"${launch[@]}" ./build/loom train --model small --data 'data/fortunes/train_*.bin' \
    --val-data 'data/fortunes/val_*.bin' --steps "${STEPS:-1000}" --seq-len 256 \
    --micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --warmup-steps 50 \
    --eval-every 100 --log-every 50 --threads "$threads" --out runs/fortunes "$@"
echo
echo "== sample from runs/fortunes"
./build/loom sample --checkpoint runs/fortunes --prompt "The " --tokens 300 --temperature 0.8
