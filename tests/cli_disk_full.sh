#!/usr/bin/env bash
# cli_disk_full.sh — a full disk ends a run with a clear message naming the file, never a crash
# or a silently cut file: metrics.jsonl writes are checked, and a checkpoint that cannot be
# written leaves "latest" on the last complete one. The disk is a small tmpfs mounted here; where
# mounting is not allowed (not root, a locked-down container) the test says so and skips (exit 77).
#
# usage: bash tests/cli_disk_full.sh LOOM_BINARY TMPDIR
set -u
LOOM=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
TMP=$2
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1
passed=0
failed=0
check() { # NAME WHY (empty WHY = pass)
    if [ -z "$2" ]; then passed=$((passed + 1)); echo "ok    $1"; else
        failed=$((failed + 1)); echo "FAIL  $1: $2"; fi
}
mkdir -p disk ckdisk
if ! mount -t tmpfs -o size=48k tmpfs disk 2>/dev/null; then
    echo "SKIPPED: cannot mount a tmpfs here (needs root)"
    exit 77 # ctest's SKIP_RETURN_CODE: shown as skipped, not passed
fi
trap 'umount "$TMP/disk" "$TMP/ckdisk" 2>/dev/null' EXIT
mount -t tmpfs -o size=400k tmpfs ckdisk # room for two checkpoints of the tiny model, not three
"$LOOM" prepare --text /usr/share/common-licenses/GPL-3 --out data --seq-len 16 >/dev/null 2>&1 ||
    check "prepare" "failed"
TINY=(--model tiny --data 'data/train_*.bin' --seq-len 16 --micro-batch-size 2
    --global-batch-size 2 --eval-every 0 --threads 1 --log-every 100000)

# metrics.jsonl fills the disk: exit 1 naming the file
timeout 120 "$LOOM" train "${TINY[@]}" --steps 3000 --no-save --out disk/metrics_run \
    >metrics.log 2>&1
rc=$?
check "a full disk under metrics.jsonl ends the run naming it" \
    "$([ $rc -eq 1 ] && grep -q 'metrics.jsonl: cannot write a metrics record' metrics.log ||
        echo "exit $rc: $(tail -1 metrics.log)")"
rm -rf disk/metrics_run

# checkpoints fill the disk: the failing save is named, "latest" keeps the last complete one
timeout 120 "$LOOM" train "${TINY[@]}" --steps 50 --save-every 1 --out ckdisk/ckpt_run \
    >ckpt.log 2>&1
rc=$?
latest=$(cat ckdisk/ckpt_run/checkpoints/latest 2>/dev/null)
check "a full disk under a checkpoint ends the run naming the file" \
    "$([ $rc -eq 1 ] && grep -qE 'error: .*safetensors' ckpt.log || echo "exit $rc: $(tail -1 ckpt.log)")"
check "latest still names a complete checkpoint" \
    "$([ -n "$latest" ] && [ -s "ckdisk/ckpt_run/checkpoints/$latest/model.safetensors" ] &&
        [ -s "ckdisk/ckpt_run/checkpoints/$latest/state.safetensors" ] || echo "latest '$latest'")"
if grep -qE 'Sanitizer|runtime error|Segmentation' metrics.log ckpt.log; then
    check "no crash" "a crash report"
else
    check "no crash" ""
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
