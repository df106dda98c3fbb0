# cli_harness.bash — sourced by the tests/cli_*.sh scripts: argument handling (LOOM_BINARY
# TMPDIR; TMPDIR is emptied and entered), pass/fail counters, and the `bad` and `good` checks
# (exit status, one "error: " line, no crash, output patterns). The caller prints the totals.
set -u
if [ $# -ne 2 ]; then
    echo "usage: $0 LOOM_BINARY TMPDIR" >&2
    exit 2
fi
LOOM=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
TMP=$2
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1
[ -x "$LOOM" ] || { echo "not an executable: $LOOM" >&2; exit 1; }

passed=0
failed=0

# ---- helpers -------------------------------------------------------------------------------

crashed() { # RC STDERR_FILE: a signal, or a sanitizer/abort report
    [ "$1" -ge 128 ] || grep -Eq 'Sanitizer|runtime error|Segmentation|Aborted|core dumped' "$2"
}

check() { # NAME WHY (empty WHY = pass): a check that ran no command of its own
    if [ -z "$2" ]; then
        passed=$((passed + 1))
        echo "ok    $1"
    else
        failed=$((failed + 1))
        echo "FAIL  $1: $2"
    fi
}

record() { # NAME WHY (empty WHY = pass) COMMAND...
    local name=$1 why=$2
    shift 2
    check "$name" "$why"
    if [ -n "$why" ]; then
        echo "      command: $*"
        sed 's/^/      stderr: /' err.txt | head -n 8
    fi
}

# bad [-u] NAME REGEX... -- COMMAND...
# The command must exit 2, print exactly one "error: " line on stderr (-u: a usage text instead,
# for the top-level command), and stderr must match every extended REGEX.
bad() {
    local usage_style=0
    if [ "$1" = "-u" ]; then
        usage_style=1
        shift
    fi
    local name=$1
    shift
    local patterns=()
    while [ "$1" != "--" ]; do
        patterns+=("$1")
        shift
    done
    shift
    "$@" >out.txt 2>err.txt </dev/null
    local rc=$? why="" p
    if crashed "$rc" err.txt; then
        why="crashed (exit $rc)"
    elif [ "$rc" -ne 2 ]; then
        why="exit status $rc, expected 2"
    elif [ "$usage_style" -eq 0 ] && [ "$(grep -c '^error: ' err.txt)" -ne 1 ]; then
        why="expected exactly one 'error: ' line on stderr, got $(grep -c '^error: ' err.txt)"
    elif [ "$usage_style" -eq 1 ] && [ ! -s err.txt ]; then
        why="nothing on stderr"
    else
        for p in "${patterns[@]}"; do
            if ! grep -Eq -- "$p" err.txt; then
                why="stderr does not match /$p/"
                break
            fi
        done
    fi
    record "$name" "$why" "$@"
}

# good NAME REGEX... -- COMMAND...: exit 0, no crash, stdout matches every REGEX.
good() {
    local name=$1
    shift
    local patterns=()
    while [ "$1" != "--" ]; do
        patterns+=("$1")
        shift
    done
    shift
    "$@" >out.txt 2>err.txt </dev/null
    local rc=$? why="" p
    if crashed "$rc" err.txt; then
        why="crashed (exit $rc)"
    elif [ "$rc" -ne 0 ]; then
        why="exit status $rc, expected 0"
    else
        for p in "${patterns[@]}"; do
            if ! grep -Eq -- "$p" out.txt; then
                why="stdout does not match /$p/"
                break
            fi
        done
    fi
    record "$name" "$why" "$@"
}

