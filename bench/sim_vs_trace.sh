#!/usr/bin/env bash
# The pipeline simulator against a measured step. Trains a tiny model on 2 pipeline stages
# (1F1B, 4 micro-batches) with a trace, takes from the Chrome trace each stage's median forward
# and backward time and the links' transfer times, asks the simulator (pipe_sim) for the step's
# length, and compares it with the measured span of the pipeline part of each step (first
# pipeline action on any rank to the last, median over steps 2.., step 1 being warm-up).
#
# Two predictions: with free links, and with the links' measured latency (per direction, the
# median of receive end - send start over the messages whose receive was already waiting, so
# that the wait is the transfer; the two directions averaged, which also cancels any offset
# between the ranks' trace clocks). The simulator gives sends no time on the sender; the trace's send
# events are small and are not fed in.
#
# usage: bash bench/sim_vs_trace.sh [LOOM_BINARY PIPE_SIM TMPDIR]
#        (defaults: build/loom build/tests/pipe_sim and a temporary folder)
# env:   SIM_TRACE_MODEL  model flags (default: --model tiny --context 32)
#        MAX_REL_ERROR    when set, exit 1 if |predicted - measured| / measured (with measured
#                         links) exceeds it; otherwise only report (timings on a busy machine
#                         are noisy)
# A benchmark, not a test: the figure depends on the machine's load.
set -u
cd "$(dirname "$0")/.."
LOOM=$(realpath "${1:-build/loom}")
PIPE_SIM=$(realpath "${2:-build/tests/pipe_sim}")
TMP=${3:-$(mktemp -d)}
MODEL=${SIM_TRACE_MODEL:---model tiny --context 32}
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1

"$LOOM" prepare --text /usr/share/common-licenses/GPL-3 --out data >prepare.log 2>&1 || {
    echo "FAIL: prepare: $(tail -3 prepare.log)" >&2
    exit 1
}
# shellcheck disable=SC2086 # MODEL is a list of flags
timeout 300 mpirun -np 2 --oversubscribe "$LOOM" train $MODEL --pipeline-parallel 2 \
    --micro-batch-size 2 --global-batch-size 8 --seq-len 32 --steps 6 --threads 1 \
    --eval-every 0 --no-save --trace T.json --data 'data/train_*.bin' --out RUN \
    >train.log 2>&1 || {
    echo "FAIL: train: $(tail -5 train.log)" >&2
    exit 1
}

python3 - "$PIPE_SIM" T.json "${MAX_REL_ERROR:-}" <<'EOF'
import json, statistics, subprocess, sys

pipe_sim, trace_path, max_error = sys.argv[1], sys.argv[2], sys.argv[3]
PIPELINE_OPS = {"recv_act", "forward", "send_act", "recv_grad", "backward", "send_grad"}
STAGES, MICRO_BATCHES = 2, 4  # pipeline-parallel 2; 8 sequences / micro-batch 2, dp 1

with open(trace_path) as f:
    trace = json.load(f)
events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] in PIPELINE_OPS]
steps = sorted({e["args"]["step"] for e in events})
measured_steps = [s for s in steps if s > 1] or steps  # step 1 warms up


def stage_of(e):
    return e["pid"] - 1  # one rank per stage


def median_duration_s(name, stage):
    durations = [e["dur"] for e in events
                 if e["name"] == name and stage_of(e) == stage and e["args"]["step"] in measured_steps]
    return statistics.median(durations) * 1e-6


forward = [median_duration_s("forward", s) for s in range(STAGES)]
backward = [median_duration_s("backward", s) for s in range(STAGES)]

# measured span of each step's pipeline part, over both ranks
spans = []
for step in measured_steps:
    mine = [e for e in events if e["args"]["step"] == step]
    spans.append((max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)) * 1e-6)
measured = statistics.median(spans)

# link latency per direction: receive end - send start, over messages whose receive started
# first (the receiver was waiting, so its end is the arrival)
def latency_s(send_name, recv_name):
    index = {}
    for e in events:
        if e["name"] in (send_name, recv_name):
            index[(e["name"], e["args"]["step"], e["args"]["micro_batch"])] = e
    waits = []
    for (name, step, mb), send in index.items():
        recv = index.get((recv_name, step, mb))
        if name == send_name and recv and step in measured_steps and recv["ts"] <= send["ts"]:
            waits.append((recv["ts"] + recv["dur"] - send["ts"]) * 1e-6)
    return (statistics.median(waits) if waits else 0.0), len(waits)


act_raw, act_n = latency_s("send_act", "recv_act")
grad_raw, grad_n = latency_s("send_grad", "recv_grad")
# The ranks' trace clocks agree only up to the start-up barrier's skew, which adds to one
# direction what it takes from the other: their mean is free of it. Take it for both.
act_link = grad_link = max(0.0, (act_raw + grad_raw) / 2)


def predict(links):
    args = [pipe_sim, "1f1b", str(MICRO_BATCHES), ",".join(map(repr, forward)),
            ",".join(map(repr, backward))] + links
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return float(out.split()[0])


free = predict([])
linked = predict([repr(act_link), repr(grad_link)])

us = lambda seconds: f"{seconds * 1e6:8.1f} us"
for s in range(STAGES):
    print(f"stage {s}: forward {us(forward[s])}, backward {us(backward[s])} (median, steps {measured_steps[0]}..{measured_steps[-1]})")
print(f"link latency: {us(act_link)} each way (as measured, skewed by the ranks' clock offset: "
      f"activation {us(act_raw)} over {act_n} waiting receives, gradient {us(grad_raw)} over {grad_n})")
print(f"measured step (pipeline part, median of {len(spans)}): {us(measured)}; per step: "
      + ", ".join(f"{x * 1e6:.1f}" for x in spans))
for label, predicted in (("free links", free), ("measured links", linked)):
    print(f"predicted, {label:14s}: {us(predicted)}, error {100 * (predicted - measured) / measured:+.1f}%")
if max_error:
    error = abs(linked - measured) / measured
    if error > float(max_error):
        print(f"FAIL: error {error:.3f} above {max_error}", file=sys.stderr)
        sys.exit(1)
EOF
