#!/usr/bin/env bash
# cli_fuzz.sh — a small deterministic slice of loom's file-format fuzzer (tests/fuzz.py): 360
# turns (seed 1) over every format loom reads — token shards, llm.c checkpoints, model and state
# safetensors, JSON configs, plan files, compressor state, cluster descriptions, GPT-2 tokenizer
# files — each mutant run through the command that reads it: 40 mutants of each format (a
# tokenizer mutant takes a few milliseconds, so the slice takes about as long as with eight
# formats), but only the first 4 of compressor state (a 2-rank resume under mpirun costs about 10
# times a single-process run; skipped without mpirun). Fails on a crash (signal, sanitizer
# report), a hang, or a suspicious mutant (--strict, fuzz.py's classification from what each
# operator expects): a broken file accepted; an edit that should not matter changing the training
# (losses, weights) or the output without a warning; a file refused, or accepted without its
# warning, that should be taken with one; ranks ending differently. Accepted mutants whose outcome
# may legitimately change are listed for review, not failed. The full run is bench/fuzz.sh.
#
# usage: bash tests/cli_fuzz.sh LOOM_BINARY TMPDIR   (TMPDIR is emptied first)
set -u
if [ $# -ne 2 ]; then
    echo "usage: $0 LOOM_BINARY TMPDIR" >&2
    exit 2
fi
# the default release run (LOOM_TEST_REPRESENTATIVE=1) runs the first third of the same cases,
# LOOM_TEST_QUICK=1 the first half, otherwise (scripts/test.sh --full) all of them
count=360
[ "${LOOM_TEST_REPRESENTATIVE:-0}" = 1 ] && count=120
[ "${LOOM_TEST_QUICK:-0}" = 1 ] && count=180
exec python3 "$(dirname "$0")/fuzz.py" "$1" "$2" --count "$count" --seed 1 --timeout 20 --quiet \
    --limit compress=4 --strict
