#!/usr/bin/env bash
# docs_runnable.sh — the documentation's commands still run. Every command block opened with
# ```sh runnable in README.md and docs/*.md runs under `set -e` in a fresh, empty folder of its
# own, with `loom` (LOOM_BINARY) on PATH, clusters/ linked in (the blocks are written as if run
# from a folder beside the repository's clusters/) and the repository root in $LOOM_ROOT. A
# block fails when any of its commands fails; the failure names the file and the line where the
# block starts, and shows the end of its output. Blocks must be quick (a few steps of the tiny
# model) and need no network, download or root. A block opened with ```sh runnable slow (seconds
# of search or profiling that other tests also run) is left out under LOOM_TEST_REPRESENTATIVE=1
# or LOOM_TEST_QUICK=1 (the default test command) and runs under scripts/test.sh --full.
#
# usage: bash tests/docs_runnable.sh LOOM_BINARY TMPDIR   (TMPDIR is emptied first)
set -u
if [ $# -ne 2 ]; then
    echo "usage: $0 LOOM_BINARY TMPDIR" >&2
    exit 2
fi
LOOM=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
TMP=$2
[ -x "$LOOM" ] || { echo "not an executable: $LOOM" >&2; exit 2; }
LOOM_ROOT=$(cd "$(dirname "$0")/.." && pwd)
export LOOM_ROOT
rm -rf "$TMP" && mkdir -p "$TMP/bin" || exit 1
ln -s "$LOOM" "$TMP/bin/loom"
export PATH="$TMP/bin:$PATH"

passed=0
failed=0
blocks=0
skipped=0
skip_slow=0
[ "${LOOM_TEST_REPRESENTATIVE:-0}" = 1 ] || [ "${LOOM_TEST_QUICK:-0}" = 1 ] && skip_slow=1

# run_block FILE LINE SCRIPT: runs SCRIPT (a file holding one block) in a new folder
run_block() {
    local file=$1 line=$2 script=$3 dir
    blocks=$((blocks + 1))
    dir=$TMP/block_$blocks
    mkdir -p "$dir" && ln -s "$LOOM_ROOT/clusters" "$dir/clusters"
    local start=$SECONDS
    (cd "$dir" && timeout 300 bash -e "$script") >"$dir.log" 2>&1 </dev/null
    local rc=$?
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok    $file:$line ($((SECONDS - start)) s)"
    else
        failed=$((failed + 1))
        echo "FAIL  $file:$line: the block starting here exited with status $rc"
        tail -n 20 "$dir.log" | sed 's/^/      /'
    fi
}

cd "$LOOM_ROOT" || exit 1
for file in README.md docs/*.md; do
    [ -f "$file" ] || continue
    n=0 in_block=0 start=0 script=""
    while IFS= read -r text || [ -n "$text" ]; do
        n=$((n + 1))
        if [ "$in_block" -eq 1 ]; then
            if [[ "$text" =~ ^\`\`\`[[:space:]]*$ ]]; then
                in_block=0
                [ "$script" = /dev/null ] || run_block "$file" "$start" "$script"
            else
                printf '%s\n' "$text" >>"$script"
            fi
        elif [[ "$text" =~ ^\`\`\`sh[[:space:]]+runnable([[:space:]]+slow)?[[:space:]]*$ ]]; then
            in_block=1 start=$n
            script=$TMP/block_$((blocks + 1)).sh
            : >"$script"
            if [ -n "${BASH_REMATCH[1]}" ] && [ "$skip_slow" = 1 ]; then
                script=/dev/null
                skipped=$((skipped + 1))
                echo "skip  $file:$n (slow: runs under scripts/test.sh --full)"
            fi
        fi
    done <"$file"
    if [ "$in_block" -eq 1 ]; then
        failed=$((failed + 1))
        echo "FAIL  $file:$start: a runnable block is never closed"
    fi
done

if [ "$blocks" -eq 0 ]; then
    failed=$((failed + 1))
    echo "FAIL  no \`\`\`sh runnable blocks found in README.md or docs/*.md"
fi
echo "$passed passed, $failed failed, $skipped slow blocks left out"
[ "$failed" -eq 0 ]
