#!/usr/bin/env bash
# cli_fuzz.sh — a small deterministic slice of loom's file-format fuzzer (tests/fuzz.py): 240
# mutants (seed 1) of every format loom reads — token shards, llm.c checkpoints, model and state
# safetensors, JSON configs, plan files — each run through the command that reads it. Fails on a
# crash (signal, sanitizer report) or a hang; suspicious accepted mutants are listed, not failed.
# The full run is bench/fuzz.sh.
#
# usage: bash tests/cli_fuzz.sh LOOM_BINARY TMPDIR   (TMPDIR is emptied first)
set -u
if [ $# -ne 2 ]; then
    echo "usage: $0 LOOM_BINARY TMPDIR" >&2
    exit 2
fi
exec python3 "$(dirname "$0")/fuzz.py" "$1" "$2" --count 240 --seed 1 --timeout 20 --quiet
