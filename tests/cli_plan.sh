#!/usr/bin/env bash
# cli_plan.sh — `loom plan`: writing plans (even and explicit stage splits, the rank layout
# summary), checking them (--check, against --ranks), checking cluster descriptions
# (--check-cluster, the shipped ones in clusters/ and broken ones), and every bad flag or
# combination ending with exit status 2 and one "error: " line that names the field, never a
# crash.
#
# usage: bash tests/cli_plan.sh LOOM_BINARY TMPDIR   (TMPDIR is emptied first)
CLUSTERS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../clusters" && pwd)
source "$(dirname "$0")/cli_harness.bash" "$@"

# file_has NAME FILE REGEX: the file exists and matches
file_has() {
    if [ ! -f "$2" ]; then
        record "$1" "$2 was not written"
    elif ! grep -Eq -- "$3" "$2"; then
        record "$1" "$2 does not match /$3/"
    else
        record "$1" ""
    fi
}

# ---- writing and checking plans ----------------------------------------------------------

good "plan: gpt2 on 2x2x2" 'mesh +dp 2 x tp 2 x pp 2 = 8 ranks' '^ +0 +\[0, 6\) ' \
    '^ +1 +\[6, 12\) ' 'rank -> \(pp, dp, tp\)' '^ +2 -> \(0, 1, 0\)' '^ +7 -> \(1, 1, 1\)' \
    'wrote plan\.json' \
    -- "$LOOM" plan --model gpt2 --dp 2 --tp 2 --pp 2 --micro-batch-size 4 \
    --global-batch-size 64 --out plan.json
file_has "plan: file has the mesh" plan.json '"mesh": \{"dp": 2, "tp": 2, "pp": 2, "zero": 1\}'
file_has "plan: file has stage 1" plan.json '\{"layers": \[6, 12\], "head": true'
good "plan: --check accepts it" 'plan\.json: ok \(8 ranks\)' -- "$LOOM" plan --check plan.json
good "plan: --check --ranks 8" 'ok \(8 ranks\)' -- "$LOOM" plan --check plan.json --ranks 8
good "plan: --check=FILE --ranks=8" 'ok \(8 ranks\)' \
    -- "$LOOM" plan --check=plan.json --ranks=8

good "plan: 12 layers over 5 stages, earlier stages +1" '^ +0 +\[0, 3\) ' '^ +1 +\[3, 6\) ' \
    '^ +2 +\[6, 8\) ' '^ +4 +\[10, 12\) ' \
    -- "$LOOM" plan --model gpt2 --pp 5 --micro-batch-size 1 --out five.json
good "plan: --stage-layers 3,5" '^ +0 +\[0, 3\) ' '^ +1 +\[3, 8\) ' \
    -- "$LOOM" plan --model small --layers 8 --pp 2 --stage-layers 3,5 --out split.json
file_has "plan: explicit split written" split.json '\{"layers": \[3, 8\], "head": true'
good "plan: gpipe, Megatron flag names" 'schedule gpipe' 'dp 2 x tp 4 x pp 1' \
    -- "$LOOM" plan --model gpt2 --data-parallel 2 --tensor-parallel 4 --pipeline-parallel 1 \
    --schedule gpipe --out megatron.json
good "plan: --ranks matching" 'wrote ranks\.json' \
    -- "$LOOM" plan --model tiny --tp 2 --ranks 2 --out ranks.json
good "plan: folder of --out is made" 'wrote sub/dir/plan\.json' \
    -- "$LOOM" plan --model tiny --out sub/dir/plan.json
good "plan: --help" 'usage: loom plan' '--stage-layers' '--virtual-stages' \
    'interleaved, zb-h1 or zb-v' -- "$LOOM" plan --help
# loom train and loom plan share the model, layout and compression flags: one help line each
"$LOOM" plan --help >plan_help.txt 2>&1
"$LOOM" train --help >train_help.txt 2>&1
why=""
for flag in --model --vocab --data-parallel --micro-batch-size --schedule --stage-layers \
    --recompute-always --zero --no-zero1 --dp-compression --embedding-sync; do
    line=$(grep -E -- "^ +$flag( |$)" plan_help.txt)
    if [ -z "$line" ] || [ "$line" != "$(grep -E -- "^ +$flag( |$)" train_help.txt)" ]; then
        why="$flag: plan's help line '$line' differs from train's"
        break
    fi
done
check "plan and train: the shared flags have one help line" "$why"
good "plan: --zero 0 with replicas" 'wrote zero0\.json' \
    -- "$LOOM" plan --model tiny --dp 2 --zero 0 --out zero0.json
file_has "plan: --zero 0 is the file's mesh.zero" zero0.json '"dp": 2, "tp": 1, "pp": 1, "zero": 0\}'
bad "plan: --zero 0 --zero1" '^error: --zero1 and --zero 0 contradict each other' \
    -- "$LOOM" plan --model tiny --dp 2 --zero 0 --zero1 --out zero_both.json
good "plan: --recompute with --recompute-always (implied)" 'wrote recompute_both\.json' \
    -- "$LOOM" plan --model tiny --pp 2 --recompute --recompute-always --out recompute_both.json
file_has "plan: --recompute --recompute-always recomputes always" recompute_both.json \
    '"recompute": "always"'
bad "plan: --zero 5" '^error: --zero: expected a ZeRO stage 0, 1, 2 or 3, got 5' \
    -- "$LOOM" plan --model tiny --dp 2 --zero 5 --out zero5.json

# ---- virtual stages ------------------------------------------------------------------------

good "plan: interleaved, 2 virtual stages per rank" \
    'schedule interleaved with 2 virtual stages per rank' '^stage  rank  chunk  layers' \
    '^ +0 +0 +0 +\[0, 3\) ' '^ +1 +1 +0 +\[3, 6\) ' '^ +2 +0 +1 +\[6, 9\) ' \
    '^ +3 +1 +1 +\[9, 12\) .*yes +no$' 'wrote interleaved\.json' \
    -- "$LOOM" plan --model gpt2 --pipeline-parallel 2 --schedule interleaved --virtual-stages 2 \
    --micro-batch-size 4 --global-batch-size 64 --out interleaved.json
file_has "plan: interleaved batch written" interleaved.json \
    '"batch": \{"global": 64, "micro": 4, "schedule": "interleaved", "virtual_stages": 2\}'
file_has "plan: interleaved stage ranks written" interleaved.json \
    '\{"layers": \[6, 9\], "rank": 0, "recompute": "none"\}'
good "plan: --check reads the interleaved plan" '^ +3 +1 +1 +\[9, 12\) ' \
    'interleaved\.json: ok \(2 ranks\)' -- "$LOOM" plan --check interleaved.json --ranks 2
good "plan: interleaved's default v, uneven stages" 'with 2 virtual stages per rank' \
    '^ +0 +0 +0 +\[0, 4\) ' '^ +3 +1 +1 +\[10, 12\) ' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule interleaved --stage-layers 4,3,3,2 \
    --out uneven.json
good "plan: zb-v places the V" 'schedule zb-v with 2 virtual stages per rank' \
    '^ +1 +1 +0 +\[3, 6\) ' '^ +2 +1 +1 +\[6, 9\) ' '^ +3 +0 +1 +\[9, 12\) ' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule zb-v --out zbv.json
good "plan: --check the zb-v plan" 'zbv\.json: ok \(2 ranks\)' -- "$LOOM" plan --check zbv.json
good "plan: zb-h1 keeps one stage per rank" 'schedule zb-h1$' '^stage  layers' \
    '^ +1 +\[6, 12\) ' -- "$LOOM" plan --model gpt2 --pp 2 --schedule zb-h1 --out zbh1.json
file_has "plan: zb-h1 written without virtual stages" zbh1.json \
    '"batch": \{"global": 16, "micro": 8, "schedule": "zb-h1"\},'
sed 's/"layers": \[6, 9\], "rank": 0/"layers": [6, 9], "rank": 1/' interleaved.json >wrong_rank.json
bad "plan: --check a stage on the wrong rank" \
    'wrong_rank\.json: stages\[2\]\.rank: expected 0 \(interleaved places virtual stage 2 of 4 on rank 0\), got 1' \
    -- "$LOOM" plan --check wrong_rank.json

# DESIGN.md's example, by hand (vocab is the real one; the rest of the example as printed)
cat >design.json <<'EOF'
{
  "model":   {"layers": 12, "heads": 12, "d_model": 768, "context": 1024, "vocab": 50257},
  "batch":   {"global": 64, "micro": 4, "schedule": "1f1b"},
  "mesh":    {"dp": 2, "tp": 2, "pp": 2},
  "stages":  [{"layers": [0, 5], "embedding": true, "recompute": false},
              {"layers": [5, 12], "head": true, "recompute": true}],
  "compression": {
    "dp":  {"method": "powersgd", "rank": 4, "stages": [0]},
    "pp":  {"method": "lowrank", "rank": 8, "lazy_error": true},
    "embedding_sync": "fused"},
  "predicted": {"step_s": 0.0, "tokens_per_s": 0.0, "peak_bytes_per_rank": [0]}
}
EOF
good "plan: --check DESIGN.md's example" \
    '^compress dp powersgd r4 ef stages 0, pp lowrank r8 lazy all, embedding sync fused$' \
    '^ +1 +\[5, 12\) .*needed$' 'design\.json: ok \(8 ranks\)' -- "$LOOM" plan --check design.json

# ---- compression flags -------------------------------------------------------------------

good "plan: every compression flag" \
    '^compress dp topk 5% no-ef warmup 3 stages 2,0, pp lowrank r6 no-lazy epilogue links 1 forward bf16, embedding sync fused$' \
    'wrote compressed\.json' \
    -- "$LOOM" plan --model gpt2 --dp 2 --pp 3 --micro-batch-size 4 --global-batch-size 64 \
    --dp-compression topk --dp-topk-fraction 0.05 --no-error-feedback \
    --dp-compression-warmup-steps 3 --dp-compression-stages 2,0 --pp-compression lowrank \
    --pp-compression-rank 6 --pp-compression-links 1 --pp-compression-policy epilogue \
    --pp-forward-compression bf16 --no-lazy-error --embedding-sync fused --out compressed.json
file_has "plan: dp compressor written" compressed.json \
    '"dp": \{"method": "topk", "fraction": 0\.05, "error_feedback": false, "warmup_steps": 3, "stages": \[2, 0\]\}'
file_has "plan: pp compressor written" compressed.json \
    '"pp": \{"method": "lowrank", "rank": 6, "lazy_error": false, "policy": "epilogue", "forward": "bf16", "links": \[1\]\}'
file_has "plan: embedding sync written" compressed.json '"embedding_sync": "fused"'
good "plan: --check reads the compression back" \
    '^compress dp topk 5% no-ef warmup 3 stages 2,0, pp lowrank r6 no-lazy epilogue links 1 forward bf16, embedding sync fused$' \
    'compressed\.json: ok \(6 ranks\)' -- "$LOOM" plan --check compressed.json
good "plan: powersgd with its default rank" '^compress dp powersgd r4 ef, pp none, ' \
    -- "$LOOM" plan --model tiny --dp 2 --dp-compression powersgd --out powersgd.json
file_has "plan: powersgd written with rank 4" powersgd.json \
    '"dp": \{"method": "powersgd", "rank": 4, "error_feedback": true, "warmup_steps": 0\}'
good "plan: lowrank with its default rank" '^compress dp none, pp lowrank r8 lazy all, ' \
    -- "$LOOM" plan --model tiny --pp 2 --pp-compression lowrank --out lowrank.json
good "plan: forward compression alone" '^compress dp none, pp none forward int8, ' \
    -- "$LOOM" plan --model tiny --pp 2 --pp-forward-compression int8 --out forward.json

# ---- bad flags and combinations ------------------------------------------------------------

bad "plan: tp not dividing heads" 'mesh\.tp: expected a divisor of model\.heads 12' 'got 5' \
    -- "$LOOM" plan --model gpt2 --tp 5 --out bad.json
if [ -e bad.json ]; then
    record "plan: bad input writes nothing" "bad.json was written"
else
    record "plan: bad input writes nothing" ""
fi
bad "plan: tp not dividing the padded vocab" 'mesh\.tp: expected a divisor of the padded vocabulary 128' \
    -- "$LOOM" plan --model small --heads 6 --d-model 96 --vocab 100 --tp 3 --out bad.json
bad "plan: dp*tp*pp != --ranks" '^error: plan: mesh: ' '4 ranks launched' '2\*2\*2 = 8' \
    -- "$LOOM" plan --model gpt2 --dp 2 --tp 2 --pp 2 --ranks 4 --out bad.json
bad "plan: --check against the wrong --ranks" 'plan\.json: mesh: ' '16 ranks launched' \
    '2\*2\*2 = 8' -- "$LOOM" plan --check plan.json --ranks 16
bad "plan: stage list not summing to the layers" \
    'stage_layers: expected layer counts summing to model\.layers 8' '"3,4"' \
    -- "$LOOM" plan --model small --layers 8 --pp 2 --stage-layers 3,4 --out bad.json
bad "plan: stage list of the wrong length" 'stage_layers: expected 2 comma-separated' \
    -- "$LOOM" plan --model small --layers 8 --pp 2 --stage-layers 2,2,4 --out bad.json
bad "plan: stage list with a zero" 'stage_layers: expected 2 comma-separated positive' \
    -- "$LOOM" plan --model small --layers 8 --pp 2 --stage-layers 0,8 --out bad.json
bad "plan: unknown schedule" \
    '^error: --schedule: batch\.schedule: expected one of "gpipe", "1f1b", "interleaved", "zb-h1" or "zb-v", got "zero-bubble"' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule zero-bubble --out bad.json
bad "plan: --virtual-stages with the default schedule" \
    '^error: --virtual-stages: expected 1 with --schedule 1f1b, the default' 'got 2' \
    -- "$LOOM" plan --model gpt2 --pp 2 --virtual-stages 2 --out bad.json
bad "plan: --virtual-stages 3 with zb-v" '^error: --virtual-stages: expected 2 with --schedule zb-v' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule zb-v --virtual-stages 3 --out bad.json
bad "plan: one virtual stage for interleaved" \
    '^error: --virtual-stages: expected at least 2 with --schedule interleaved' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule interleaved --virtual-stages 1 --out bad.json
bad "plan: more virtual stages than layers" \
    '^error: --virtual-stages: expected at most 6 with --pipeline-parallel 2' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule interleaved --virtual-stages 7 --out bad.json
bad "plan: --virtual-stages -1" '^error: --virtual-stages: expected a positive integer, got -1' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule interleaved --virtual-stages -1 --out bad.json
bad "plan: interleaved micro-batches not a multiple of pp" \
    '^error: --micro-batches: expected a multiple of --pipeline-parallel 2 with --schedule interleaved' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule interleaved --micro-batches 3 --out bad.json
good "plan: recompute with zb-h1" 'schedule zb-h1' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule zb-h1 --recompute --out zbh1_recompute.json
bad "plan: a stage list for pp, not pp x v" \
    'stage_layers: expected 4 comma-separated positive layer counts, one per virtual stage' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule interleaved --stage-layers 6,6 --out bad.json
bad "plan: a link past the virtual stages" \
    'compression\.pp\.links\[0\]: expected a link index in \[0, 3\) \(link s joins virtual stages' \
    -- "$LOOM" plan --model gpt2 --pp 2 --schedule interleaved --pp-compression int8 \
    --pp-compression-links 3 --out bad.json
bad "plan: global batch not a multiple of micro*dp" \
    'global-batch-size: expected a multiple of micro batch 4 x data parallel 2 = 8, got 12' \
    -- "$LOOM" plan --model gpt2 --dp 2 --micro-batch-size 4 --global-batch-size 12 --out bad.json
bad "plan: more stages than layers" 'mesh\.pp: expected at most model\.layers 2' \
    -- "$LOOM" plan --model tiny --pp 3 --out bad.json
bad "plan: --dp -1" 'data-parallel: expected a positive integer, got -1' \
    -- "$LOOM" plan --model tiny --dp -1 --out bad.json
bad "plan: --micro-batch-size -2" 'micro-batch-size: expected a positive integer, got -2' \
    -- "$LOOM" plan --model tiny --micro-batch-size -2 --out bad.json
bad "plan: --micro-batches and --global-batch-size disagree" 'global-batch-size 12 and --micro-batches 2 disagree' \
    -- "$LOOM" plan --model tiny --micro-batch-size 2 --micro-batches 2 --global-batch-size 12 --out bad.json
bad "plan: --ranks not divisible by tp x pp" 'expected a divisor of the 6 ranks launched' \
    -- "$LOOM" plan --model tiny --tp 2 --pp 2 --ranks 6 --out bad.json
bad "plan: heads not dividing d_model" 'heads: expected a divisor of d_model 16' \
    -- "$LOOM" plan --model tiny --heads 3 --out bad.json
bad "plan: --tp not a number" "--tp: expected an integer, got 'two'" \
    -- "$LOOM" plan --model tiny --tp two --out bad.json
bad "plan: unknown option" "unknown option '--tensor'" \
    -- "$LOOM" plan --model tiny --tensor 2 --out bad.json
bad "plan: unknown preset" "unknown preset 'gpt5'" -- "$LOOM" plan --model gpt5 --out bad.json
bad "plan: no --out" '--out: expected a plan file' -- "$LOOM" plan --model tiny
bad "plan: --out is a folder" '--out: sub is a directory' -- "$LOOM" plan --model tiny --out sub
bad "plan: --ranks -1" '--ranks: expected a positive world size' \
    -- "$LOOM" plan --model tiny --ranks -1 --out bad.json
bad "plan: a pipeline method for dp" \
    '--dp-compression: compression\.dp\.method: expected one of none, powersgd, topk, sign, int8, bf16, got "lowrank"' \
    -- "$LOOM" plan --model tiny --dp-compression lowrank --out bad.json
bad "plan: a data-parallel method for pp" \
    '--pp-compression: compression\.pp\.method: expected one of none, lowrank, topk, int8, bf16, got "powersgd"' \
    -- "$LOOM" plan --model tiny --pp 2 --pp-compression powersgd --out bad.json
bad "plan: a backward method forward" \
    '--pp-forward-compression: compression\.pp\.forward: expected one of none, int8, bf16, got "topk"' \
    -- "$LOOM" plan --model tiny --pp 2 --pp-forward-compression topk --out bad.json
bad "plan: unknown policy" \
    '--pp-compression-policy: compression.pp.policy: expected one of "all", "epilogue" or "slack", got "often"' \
    -- "$LOOM" plan --model tiny --pp 2 --pp-compression int8 --pp-compression-policy often --out bad.json
bad "plan: stage list with an empty item" \
    '--dp-compression-stages: expected comma-separated stage indices .*got "0,,1"' \
    -- "$LOOM" plan --model tiny --pp 2 --dp-compression int8 --dp-compression-stages 0,,1 --out bad.json
bad "plan: link list with a negative index" \
    '--pp-compression-links: expected comma-separated link indices .*got "-1"' \
    -- "$LOOM" plan --model tiny --pp 2 --pp-compression int8 --pp-compression-links=-1 --out bad.json
bad "plan: stage index past the stages" \
    '^error: plan: compression\.dp\.stages\[0\]: expected a stage index in \[0, 2\) \(mesh\.pp = 2\), got 2' \
    -- "$LOOM" plan --model tiny --pp 2 --dp-compression int8 --dp-compression-stages 2 --out bad.json
bad "plan: link index past the links" \
    '^error: plan: compression\.pp\.links\[1\]: expected a link index in \[0, 1\)' \
    -- "$LOOM" plan --model tiny --pp 2 --pp-compression int8 --pp-compression-links 0,1 --out bad.json
bad "plan: sign without error feedback" \
    'compression\.dp\.error_feedback: sign compression needs error feedback \(it does not converge without it\)' \
    -- "$LOOM" plan --model tiny --dp 2 --dp-compression sign --no-error-feedback --out bad.json
bad "plan: topk fraction out of range" 'compression\.dp\.fraction: expected .*\(0, 1\], got 1\.5' \
    -- "$LOOM" plan --model tiny --dp-compression topk --dp-topk-fraction 1.5 --out bad.json
bad "plan: powersgd rank 0" 'compression\.dp\.rank: expected a positive rank for method "powersgd", got 0' \
    -- "$LOOM" plan --model tiny --dp-compression powersgd --dp-compression-rank 0 --out bad.json
bad "plan: a rank for a method without one" \
    '--dp-compression-rank 8: not used with --dp-compression topk \(only powersgd has a rank\)' \
    -- "$LOOM" plan --model tiny --dp-compression topk --dp-compression-rank 8 --out bad.json
bad "plan: --no-error-feedback without dp compression" \
    '--no-error-feedback: not used with --dp-compression none' \
    -- "$LOOM" plan --model tiny --no-error-feedback --out bad.json
bad "plan: pipeline compression with one stage" \
    'compression\.pp\.method: expected "none" with one pipeline stage, got "lowrank"' \
    -- "$LOOM" plan --model tiny --pp-compression lowrank --out bad.json
bad "plan: fused embedding sync with one stage" \
    'compression\.embedding_sync: "fused" needs pipeline parallelism \(pp > 1\)' \
    -- "$LOOM" plan --model tiny --embedding-sync fused --out bad.json
bad "plan: unknown embedding sync" '--embedding-sync: compression.embedding_sync: expected "separate" or "fused", got "both"' \
    -- "$LOOM" plan --model tiny --pp 2 --embedding-sync both --out bad.json
bad "plan: --check with a compression flag" '--check: expected only --ranks with it, got --dp-compression' \
    -- "$LOOM" plan --check plan.json --dp-compression powersgd
if [ -e bad.json ]; then
    record "plan: no bad case wrote a file" "bad.json was written"
else
    record "plan: no bad case wrote a file" ""
fi

# ---- bad plan files ------------------------------------------------------------------------

printf '{"model": {"layers": 2,}' >broken.json
bad "plan: --check malformed JSON" 'broken\.json:1:[0-9]+: invalid JSON' \
    -- "$LOOM" plan --check broken.json
sed 's/"recompute": false}/"recompute": false, "gpu": 0}/' design.json >unknown.json
bad "plan: --check unknown key" 'unknown\.json: stages\[0\]\.gpu: unknown key' \
    -- "$LOOM" plan --check unknown.json
sed 's/"mesh":/"overlap_grad_reduce": 1, "mesh":/' design.json >overlap_word.json
bad "plan: --check overlap_grad_reduce not a boolean" \
    'overlap_word\.json: overlap_grad_reduce: expected true or false' \
    -- "$LOOM" plan --check overlap_word.json
good "plan: --no-overlap-grad-reduce written and shown" 'gradient sync after the backward' \
    -- bash -c "\"$LOOM\" plan --model gpt2 --dp 2 --no-overlap-grad-reduce --out no_overlap.json >/dev/null && grep -q '\"overlap_grad_reduce\": false' no_overlap.json && \"$LOOM\" plan --check no_overlap.json"
sed 's/"recompute": true}/"recompute": "sometimes"}/' design.json >recompute_word.json
bad "plan: --check recompute neither a boolean nor always" \
    'recompute_word\.json: stages\[1\]\.recompute: expected "none", "needed", "always" or "selective"' \
    -- "$LOOM" plan --check recompute_word.json
good "plan: --recompute-always written as \"always\"" '"recompute": "always"' \
    -- bash -c "\"$LOOM\" plan --model gpt2 --pp 2 --recompute-always --out always.json >/dev/null && cat always.json"
sed 's/"recompute": true}/"recompute": "always"}/' design.json >always_design.json
good "plan: --check reads recompute \"always\"" 'ok' -- "$LOOM" plan --check always_design.json
sed 's/\[5, 12\]/[7, 5]/' design.json >range.json
bad "plan: --check bad layer range" \
    'range\.json: stages\[1\]\.layers: expected \[start, end\) with start < end, got \[7, 5\]' \
    -- "$LOOM" plan --check range.json
sed 's/"tp": 2/"tp": 5/' design.json >tp5.json
bad "plan: --check tp not dividing heads" 'tp5\.json: mesh\.tp: expected a divisor' \
    -- "$LOOM" plan --check tp5.json
sed 's/"lazy_error": true/"error_feedback": true/' design.json >pp_ef.json
bad "plan: --check a dp key under pp" \
    'pp_ef\.json: compression\.pp\.error_feedback: unknown key \(expected one of: method, rank, fraction, lazy_error, policy, forward, links\)' \
    -- "$LOOM" plan --check pp_ef.json
sed 's/"stages": \[0\]/"links": [0]/' design.json >dp_links.json
bad "plan: --check a pp key under dp" 'dp_links\.json: compression\.dp\.links: unknown key' \
    -- "$LOOM" plan --check dp_links.json
sed 's/"method": "lowrank"/"method": "sign"/' design.json >pp_sign.json
bad "plan: --check a dp method under pp" \
    'pp_sign\.json: compression\.pp\.method: expected one of none, lowrank, topk, int8, bf16, got "sign"' \
    -- "$LOOM" plan --check pp_sign.json
bad "plan: --check missing file" 'nosuch\.json: cannot open' -- "$LOOM" plan --check nosuch.json
bad "plan: --check a folder" 'sub: not a regular file' -- "$LOOM" plan --check sub
bad "plan: --check with layout flags" '--check: expected only --ranks with it, got --tp' \
    -- "$LOOM" plan --check plan.json --tp 2
bad "plan: --check empty" '--check: expected a value, got ""' -- "$LOOM" plan --check=

# ---- cluster descriptions ------------------------------------------------------------------

good "plan: --check-cluster dgx-a100" \
    'dgx-a100\.json: ok \(dgx-a100, 8 devices per node, max 384 nodes\)' \
    -- "$LOOM" plan --check-cluster "$CLUSTERS/dgx-a100.json"
good "plan: --check-cluster=p3-v100" 'p3-v100\.json: ok \(p3-v100, 8 devices per node, max 8 nodes\)' \
    -- "$LOOM" plan --check-cluster="$CLUSTERS/p3-v100.json"
good "plan: --help names --check-cluster" '--check-cluster' -- "$LOOM" plan --help
sed 's/"devices": 8/"devices": 0/' "$CLUSTERS/dgx-a100.json" >nodevices.json
bad "plan: --check-cluster no devices" \
    'nodevices\.json: node\.devices: expected an integer >= 1, got 0' \
    -- "$LOOM" plan --check-cluster nodevices.json
sed 's/"bf16": 312e12/"fp64": 312e12/' "$CLUSTERS/dgx-a100.json" >fp64.json
bad "plan: --check-cluster unknown precision" \
    'fp64\.json: node\.device\.peak_flops\.fp64: expected one of "fp32", "bf16" or "fp16", got "fp64"' \
    -- "$LOOM" plan --check-cluster fp64.json
# implausible figures and device counts past int are refused by name (then nothing downstream,
# the search included, counts them)
sed 's/"devices": 8/"devices": 1073741824/; s/"max_nodes": 384/"max_nodes": 1073741824/' \
    "$CLUSTERS/dgx-a100.json" >hugecluster.json
bad "plan: --check-cluster 2^30 nodes of 2^30 devices" \
    'hugecluster\.json: max_nodes: expected max_nodes x node\.devices at most 1048576 devices, got 1073741824 x 1073741824 = 1152921504606846976' \
    -- "$LOOM" plan --check-cluster hugecluster.json
bad "plan: search on 2^30 x 2^30 devices, huge --devices" 'hugecluster\.json: max_nodes: expected' \
    -- timeout 20 "$LOOM" plan --model gpt2 --cluster hugecluster.json --devices 2147483647 --global-batch-size 8 --out huge.json
sed 's/"bandwidth": 2.4e10/"bandwidth": 1e-300/' "$CLUSTERS/dgx-a100.json" >slowlink.json
bad "plan: --check-cluster a bandwidth of 1e-300" \
    'slowlink\.json: node\.links\.inter_node\.bandwidth: expected 1000 to 1e\+15 bytes/s \(the plausible range\), got 1e-300' \
    -- "$LOOM" plan --check-cluster slowlink.json
sed 's/"latency_s": 9.6e-6/"latency_s": 1e308/' "$CLUSTERS/dgx-a100.json" >slowlatency.json
bad "plan: --check-cluster a latency of 1e308" \
    'slowlatency\.json: node\.links\.inter_node\.latency_s: expected 0 to 10 seconds \(the plausible range\), got 1e\+308' \
    -- "$LOOM" plan --check-cluster slowlatency.json
bad "plan: search with more --devices than the cluster has" \
    'devices \(--devices\): expected 1 to 3072 \(the cluster.s 384 x 8, at most 1048576\), got 2147483647' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --devices 2147483647 --global-batch-size 8 --out huge.json
printf '{"name": "x",\n  "nodes": }' >malformed_cluster.json
bad "plan: --check-cluster malformed JSON" 'malformed_cluster\.json:2:12: invalid JSON' \
    -- "$LOOM" plan --check-cluster malformed_cluster.json
bad "plan: --check-cluster a plan file" 'plan\.json: model: unknown key' \
    -- "$LOOM" plan --check-cluster plan.json
bad "plan: --check-cluster missing file" 'nosuch\.json: cannot open' \
    -- "$LOOM" plan --check-cluster nosuch.json
bad "plan: --check-cluster with other flags" \
    '--check-cluster: expected no other option with it, got --ranks' \
    -- "$LOOM" plan --check-cluster "$CLUSTERS/dgx-a100.json" --ranks 8
bad "plan: --check-cluster and --check" '--check-cluster: expected no other option with it, got --check' \
    -- "$LOOM" plan --check-cluster "$CLUSTERS/dgx-a100.json" --check plan.json
bad "plan: --check-cluster empty" '--check-cluster: expected a value, got ""' \
    -- "$LOOM" plan --check-cluster=

# ---- predictions ----------------------------------------------------------------------------

"$LOOM" plan --model gpt2 --pp 2 --micro-batch-size 2 --global-batch-size 16 --out gpt2_pp2.json >/dev/null
good "plan: --predict on the DGX description" \
    'prediction on dgx-a100' '^ +step [0-9.]+ s = pipeline' 'tokens/s' '^ +1 +1 +\[6, 12\)' \
    -- "$LOOM" plan --predict gpt2_pp2.json --cluster "$CLUSTERS/dgx-a100.json" --seq-len 1024
good "plan: --predict --out writes the prediction" 'wrote predicted\.json' \
    -- "$LOOM" plan --predict gpt2_pp2.json --cluster "$CLUSTERS/dgx-a100.json" --out predicted.json
file_has "plan: predicted step in the file" predicted.json '"step_s": [0-9]'
good "plan: the predicted plan checks" 'predicted\.json: ok' -- "$LOOM" plan --check predicted.json
bad "plan: --predict without --cluster" '--predict: expected --cluster FILE' \
    -- "$LOOM" plan --predict gpt2_pp2.json
bad "plan: --predict with a layout flag" '--predict: expected only --cluster, --precision, --seq-len, --zero, --zero1, --no-zero1, --out or --trace with it, got --tp' \
    -- "$LOOM" plan --predict gpt2_pp2.json --cluster "$CLUSTERS/dgx-a100.json" --tp 2
bad "plan: --predict bf16 on V100" 'has no bf16 peak' \
    -- "$LOOM" plan --predict gpt2_pp2.json --cluster "$CLUSTERS/p3-v100.json" --precision bf16
bad "plan: --predict unknown precision" '--precision: expected' \
    -- "$LOOM" plan --predict gpt2_pp2.json --cluster "$CLUSTERS/dgx-a100.json" --precision fp8

good "plan: search 16 DGX devices" 'searched [0-9]+ layouts of 16 devices on dgx-a100' '^ +1 +[0-9]+ +[0-9]+ +[0-9]+ ' 'wrote best\.json' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --devices 16 --global-batch-size 64 --seq-len 1024 --precision bf16 --out best.json
good "plan: the searched plan checks" 'best\.json: ok \(16 ranks\)' -- "$LOOM" plan --check best.json
bad "plan: search without a global batch" '--global-batch-size: expected the sequences per step' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --out best.json
bad "plan: search gpt3-175b on one V100 node" 'none of the [0-9]+ layouts of 8 devices fits' \
    -- "$LOOM" plan --model gpt3-175b --cluster "$CLUSTERS/p3-v100.json" --devices 8 --global-batch-size 8 --seq-len 2048 --precision fp16 --out best.json

# the search's work is bounded by the layouts, not the batch: sizes it cannot count are refused
# by name, the largest it takes finishes in seconds, never a signal (timeout: a hang fails)
bad "plan: search, a global batch past the search's bound" \
    'global batch \(--global-batch-size\): expected 1 to 1048576 sequences \(the most the search counts\), got 2147483647' \
    -- timeout 20 "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --devices 8 --global-batch-size 2147483647 --out huge.json
good "plan: search, the largest global batch finishes" 'searched [0-9]+ layouts of 8 devices .* global batch 1048576\) in [0-9.]+ s' \
    -- timeout 20 "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --devices 8 --global-batch-size 1048576 --out huge.json
bad "plan: search, an odd batch needs too many micro-batches" \
    'no layout of 1 devices for global batch 1048575: every one runs more than 16384 micro-batches per step' \
    -- timeout 20 "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --devices 1 --global-batch-size 1048575 --out huge.json
# no layout at all says why, never "none of the 0 layouts ... 0.00 GiB short"
bad "plan: search, --devices 0 (all 3072) and a batch of 8" \
    'no layout of 3072 devices: a split dp x tp x pp = 3072 needs tp dividing the model.s 12 heads .* pp at most its 12 layers, and dp dividing the global batch 8; none does' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --devices 0 --global-batch-size 8 --out none.json
bad "plan: search, 3 devices for 2 heads and 2 layers" \
    'no layout of 3 devices: .*tp dividing the model.s 2 heads .* pp at most its 2 layers, and dp dividing the global batch 8' \
    -- "$LOOM" plan --model tiny --cluster "$CLUSTERS/dgx-a100.json" --devices 3 --global-batch-size 8 --out none.json
bad "plan: search, bf16 on a cluster without a bf16 peak" \
    'precision \(--precision\) bf16: the cluster p3-v100 has no bf16 peak \(node\.device\.peak_flops\.bf16 is 0: not offered\); it offers fp32, fp16' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/p3-v100.json" --devices 8 --global-batch-size 8 --precision bf16 --out none.json

# --trace: the simulated step as a Chrome trace; every (virtual stage, micro-batch) forward once
# per schedule, and the last event ends at the predicted step
"$LOOM" plan --model tiny --layers 4 --pp 2 --micro-batch-size 1 --global-batch-size 4 --schedule zb-v --out trace_zbv.json >/dev/null
good "plan: --predict --trace" 'wrote zbv-trace\.json' \
    -- "$LOOM" plan --predict trace_zbv.json --cluster "$CLUSTERS/dgx-a100.json" --trace zbv-trace.json --out trace_zbv-predicted.json
if python3 - zbv-trace.json trace_zbv-predicted.json <<'PY'; then record "plan: the trace is the simulated step" ""; else record "plan: the trace is the simulated step" "see above"; fi
import json, sys
t = json.load(open(sys.argv[1]))
step = json.load(open(sys.argv[2]))["predicted"]["step_s"] * 1e6
x = [e for e in t["traceEvents"] if e["ph"] == "X"]
fwd = sorted((e["args"]["stage"], e["args"]["micro_batch"]) for e in x if e["name"] == "forward")
assert fwd == [(s, m) for s in range(4) for m in range(4)], fwd
assert {e["pid"] for e in x} == {1, 2} and t["otherData"]["ranks"] == 2
end = max(e["ts"] + e["dur"] for e in x)
assert abs(end - step) <= 1e-6 * step + 0.002, (end, step)  # the file keeps ns
PY
good "plan: search --trace" 'wrote best-trace\.json \(its simulated step\)' \
    -- "$LOOM" plan --model tiny --cluster "$CLUSTERS/dgx-a100.json" --devices 4 --global-batch-size 8 --out best-tiny.json --trace best-trace.json

good "plan: search --search-space full reports the ILP" 'intra-op ILP on the chosen mesh \(dp [0-9]+, tp [0-9]+\), whole model: .* % less \(simulation only' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --devices 16 --global-batch-size 64 --seq-len 1024 --precision bf16 --search-space full --out full.json

# compression as a decision: on V100s with 25 Gb/s between nodes PowerSGD pays for gpt2's DP
good "plan: search with --allow-compression all" 'dp powersgd4' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/p3-v100.json" --devices 16 --global-batch-size 64 --seq-len 1024 --precision fp16 --allow-compression all --out compressed.json
file_has "plan: the compressed plan says so" compressed.json '"method": "powersgd"'
good "plan: the compressed plan predicts" 'prediction on p3-v100' \
    -- "$LOOM" plan --predict compressed.json --cluster "$CLUSTERS/p3-v100.json"
bad "plan: --allow-compression unknown" '--allow-compression: expected none, dp, pp or all, got "some"' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/p3-v100.json" --devices 16 --global-batch-size 64 --allow-compression some --out x.json

# the plan's precision: written for a bf16 search, checked, refused by train
file_has "plan: the search writes its precision" best.json '"precision": "bf16",'

# without --precision, loom plan plans in the cluster description's training precision and says
# so: bf16 on the DGX A100 description, fp16 on the V100 one (no bf16), fp32 when the description
# leaves the field out; --precision overrides it and no such line is printed
good "plan: search in the cluster's training precision (A100: bf16)" \
    '^precision bf16 \(the cluster description.s training precision\)$' \
    'searched [0-9]+ layouts of 8 devices on dgx-a100 \(bf16, ' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --devices 8 --global-batch-size 16 --seq-len 1024 --out default_a100.json
file_has "plan: the default precision is written" default_a100.json '"precision": "bf16",'
good "plan: search in the cluster's training precision (V100: fp16)" \
    '^precision fp16 \(the cluster description.s training precision\)$' \
    'searched [0-9]+ layouts of 8 devices on p3-v100 \(fp16, ' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/p3-v100.json" --devices 8 --global-batch-size 16 --seq-len 1024 --out default_v100.json
file_has "plan: the V100 default is written" default_v100.json '"precision": "fp16",'
good "plan: --precision overrides the cluster's" 'searched [0-9]+ layouts of 8 devices on dgx-a100 \(fp32, ' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --devices 8 --global-batch-size 16 --seq-len 1024 --precision fp32 --out given_fp32.json
check "plan: --precision given, no default said" \
    "$(grep -q 'training precision' out.txt && echo "stdout says the default: $(grep 'training precision' out.txt)")"
# --predict too, whatever the plan was made for: the bf16 plan on the V100 description in fp16,
# and the plan written with --out says the precision its prediction is for
good "plan: --predict in the cluster's training precision" \
    '^precision fp16 \(the cluster description.s training precision\)$' 'prediction on p3-v100 .*, fp16, ' \
    -- "$LOOM" plan --predict best.json --cluster "$CLUSTERS/p3-v100.json" --out best_v100.json
file_has "plan: --predict --out writes the precision used" best_v100.json '"precision": "fp16",'
good "plan: --predict --precision overrides" 'prediction on dgx-a100 .*, fp32, ' \
    -- "$LOOM" plan --predict best.json --cluster "$CLUSTERS/dgx-a100.json" --precision fp32
grep -v '"training_precision": "bf16",' "$CLUSTERS/dgx-a100.json" >no_training.json
good "plan: a description without training_precision plans fp32" \
    '^precision fp32 \(the cluster description.s training precision\)$' 'prediction on dgx-a100 .*, fp32, ' \
    -- "$LOOM" plan --predict best.json --cluster no_training.json
sed 's/"training_precision": "fp16",/"training_precision": "bf16",/' "$CLUSTERS/p3-v100.json" >v100_bf16.json
bad "plan: --check-cluster a training precision without a peak" \
    'v100_bf16\.json: node\.device\.training_precision: expected a precision node\.device\.peak_flops offers \(fp32, fp16\), got "bf16" \(peak_flops\.bf16 is 0: not offered\)' \
    -- "$LOOM" plan --check-cluster v100_bf16.json
good "plan: --intraop in the cluster's training precision" \
    '^precision bf16 \(the cluster description.s training precision\)$' 'mesh \(dp 2, tp 2\), .*, bf16, ' \
    -- "$LOOM" plan --intraop --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --dp 2 --tp 2
"$LOOM" plan --model tiny --out tiny1.json >/dev/null
sed 's/^{$/{\n  "precision": "fp8",/' tiny1.json >fp8.json
bad "plan: --check an unknown precision" 'fp8\.json: precision: expected one of "fp32", "bf16" or "fp16", got "fp8"' \
    -- "$LOOM" plan --check fp8.json
sed 's/^{$/{\n  "zero1": "yes",/; s/, "zero": [0-9]}/}/' tiny1.json >zero1.json
bad "plan: --check a zero1 that is not a boolean" 'zero1\.json: zero1: expected true or false' \
    -- "$LOOM" plan --check zero1.json
file_has "plan: the search writes ZeRO-1" best.json '"zero": [01]\}'
sed 's/^{$/{\n  "precision": "bf16",/' tiny1.json >bf16.json
bad "train: a bf16 plan refused by name" 'bf16\.json: precision: "bf16" is not supported by this build' \
    -- "$LOOM" train --plan bf16.json --data nosuch.bin --steps 1

# ---- train --plan auto: the planner chooses the micro batch -------------------------------

seq 400 | sed 's/.*/line &: the quick brown fox./' >corpus.txt
"$LOOM" prepare --text corpus.txt --out autodata --seq-len 16 >/dev/null 2>&1
AUTO=("$LOOM" train --model tiny --threads 1 --seq-len 16 --data 'autodata/train_*.bin' --steps 1
    --eval-every 0 --no-save --plan auto)
both() { "$@" 2>&1; } # the configuration table is logged on stderr; good() reads stdout
# a global batch below the default micro batch (8) is the planner's to split, not refused for it
good "train --plan auto --global-batch-size 4 on a cluster file" 'chose #1' \
    'micro-batch-size +[124]$' 'global-batch-size +4$' 'step +1/1' \
    -- both "${AUTO[@]}" --global-batch-size 4 --cluster "$CLUSTERS/dgx-a100.json" --out run_auto
good "train --plan auto, one rank, no cluster: the micro batch divides the global batch" \
    'micro-batch-size +6$' 'global-batch-size +12$' 'step +1/1' \
    -- both "${AUTO[@]}" --global-batch-size 12 --out run_auto
bad "train --plan auto: a missing --cluster file is named" \
    '^error: --cluster nosuch\.json: cannot open' \
    -- "${AUTO[@]}" --global-batch-size 4 --cluster nosuch.json --out run_auto
bad "train --plan auto: a negative global batch" \
    '^error: --global-batch-size: expected a positive integer, got -4' \
    -- "${AUTO[@]}" --global-batch-size -4 --out run_auto

# ---- the intra-op ILP -------------------------------------------------------------------------

good "plan: --intraop, runtime space on (2, 4)" 'intra-op ILP on dgx-a100: mesh \(dp 2, tp 4\)' \
    '^ +c_attn +12 +column \(n over tp\), tokens over dp ' \
    '^ +mlp_c_proj +12 +row \(k over tp \[allreduce\]\), tokens over dp ' \
    '^ +ILP: [0-9]+ variables, [0-9]+ constraints, [0-9]+ nonzeros; solved in [0-9.]+ s' \
    'the runtime space: loom executes this layout' \
    -- "$LOOM" plan --intraop --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --dp 2 --tp 4 \
    --precision bf16
good "plan: --intraop, full space, the gain" 'full space' '^ +attention +12 +heads over tp' \
    'runtime space: step [0-9.]+ ms, state [0-9.]+ GiB per device, ZeRO-[0-3] with(out)? sequence parallelism; the full space gains [0-9.]+ %' \
    -- "$LOOM" plan --intraop --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --dp 2 --tp 4 \
    --micro-batch-size 2 --seq-len 512 --precision bf16 --search-space full
good "plan: --intraop, full space where the runtime cannot run" \
    'runtime space: none \(intra-op: tp: expected a divisor of heads 12' \
    -- "$LOOM" plan --intraop --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --tp 8 \
    --search-space full
good "plan: --intraop, a GPT-3 175B stage on (2, 4): the runtime space shards over dp and fits" \
    '^ +c_fc +12 +column \(n over tp\), tokens over dp, ZeRO-[1-3] ' \
    'the runtime space: loom executes this layout, ZeRO-[1-3] with' \
    -- "$LOOM" plan --intraop --model gpt3-175b --layers 12 --cluster "$CLUSTERS/dgx-a100.json" \
    --dp 2 --tp 4 --seq-len 2048 --precision bf16
good "plan: --intraop, the 175B stage in the full space: where the runtime cannot follow" \
    'runtime space: step [0-9.]+ ms, state [0-9.]+ GiB per device, ZeRO-[1-3] ' \
    'where the runtime cannot follow the full space.s answer:' \
    '^    .*c_fc.*: its weight split over both axes at once' \
    -- "$LOOM" plan --intraop --model gpt3-175b --layers 12 --cluster "$CLUSTERS/dgx-a100.json" \
    --dp 2 --tp 4 --seq-len 2048 --precision bf16 --search-space full
bad "plan: --intraop, runtime space, tp not dividing the heads" 'tp: expected a divisor of heads' \
    -- "$LOOM" plan --intraop --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --tp 8
bad "plan: --intraop without --cluster" '--intraop: expected --cluster FILE' \
    -- "$LOOM" plan --intraop --model gpt2 --tp 2
bad "plan: --intraop, bad --search-space" '--search-space: expected "runtime" or "full", got "fast"' \
    -- "$LOOM" plan --intraop --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --search-space fast
bad "plan: --intraop, negative --dp" '--dp: expected a positive number, got -1' \
    -- "$LOOM" plan --intraop --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --dp -1
bad "plan: --intraop, more devices than the cluster" '--dp x --tp: expected at most the 3072 devices' \
    -- "$LOOM" plan --intraop --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --dp 64 --tp 64
bad "plan: --intraop with --pp" '--intraop: expected only .* got --pp' \
    -- "$LOOM" plan --intraop --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --pp 2
bad "plan: --intraop, state over the device's memory" \
    'no strategy fits the memory budget of 80.000 GiB per device \(the least state any choice needs is [0-9.]+ GiB\)' \
    -- "$LOOM" plan --intraop --model gpt3-175b --cluster "$CLUSTERS/dgx-a100.json" --dp 8 \
    --seq-len 2048 --precision bf16

# ---- --islands auto: the islands of a cluster with an island level ----------------------
# dgx-a100 with islands of 2 nodes joined by 12.5 MB/s a device: 4 islands of 16 devices, the
# inner layout searched for 16 devices and 128 sequences, H and overlap chosen to hide the sync
jq '. + {islands: {nodes: 2, link: {bandwidth: 1.25e7, latency_s: 0.05, source: "test"}}}' \
    "$CLUSTERS/dgx-a100.json" >a100_islands.json
good "plan: --islands auto" '^4 islands of 16 devices \(2 nodes of 8\)' \
    'H = [0-9]+ inner steps, [0-9]+ fragments?, each sync applied [0-9]+ steps? after it leaves' \
    ': hidden; a step' \
    'K = 1 \(one job over the slow link\): [0-9.]+ s a step, [0-9.]+x the islands.; islands' \
    'wrote islands\.json' \
    -- "$LOOM" plan --model gpt2 --cluster a100_islands.json --devices 64 --islands auto \
    --global-batch-size 512 --outer-compression int8 --out islands.json
# the choice of K: islands joined as fast as the nodes inside them slow one job down by nothing,
# so one job (K = 1, exact training) is planned instead
jq '. + {islands: {nodes: 2, link: {bandwidth: 2.4e10, latency_s: 9.6e-6}}}' \
    "$CLUSTERS/dgx-a100.json" >a100_fast_islands.json
good "plan: --islands auto over a fast link plans one job" \
    'K = 1 \(one job over the slow link\): [0-9.]+ s a step, no longer than the islands' \
    -- "$LOOM" plan --model gpt2 --cluster a100_fast_islands.json --devices 64 --islands auto \
    --global-batch-size 512 --out one_job.json
file_has "plan: one job's plan is 64 ranks' data parallelism" one_job.json '"mesh": \{"dp": 32, "tp": 2'
record "plan: one job's plan has no islands" "$(grep -o '"islands"' one_job.json 2>/dev/null)"
file_has "plan: --islands auto writes the section" islands.json \
    '"islands": \{"count": 4, "inner_steps": [0-9]+, .*"compression": "int8"'
good "plan: --islands auto's plan checks" 'islands\.json: ok \(64 ranks\)' \
    -- "$LOOM" plan --check islands.json
good "plan: --islands auto within a small bound" 'NOT hidden within --max-inner-steps' \
    's a step exposed at H = 4' \
    -- "$LOOM" plan --model gpt2 --cluster a100_islands.json --devices 64 --islands=auto \
    --global-batch-size 512 --max-inner-steps 4 --out islands4.json
bad "plan: --islands auto without an island level" 'dgx-a100.json has no island level' \
    -- "$LOOM" plan --model gpt2 --cluster "$CLUSTERS/dgx-a100.json" --islands auto \
    --global-batch-size 512 --out x.json
bad "plan: --islands auto chooses H" '--islands auto: --inner-steps is what it chooses' \
    -- "$LOOM" plan --model gpt2 --cluster a100_islands.json --islands auto --inner-steps 10 \
    --global-batch-size 512 --out x.json
bad "plan: --islands auto needs whole islands" 'expected --devices a multiple of an island' \
    -- "$LOOM" plan --model gpt2 --cluster a100_islands.json --devices 24 --islands auto \
    --global-batch-size 512 --out x.json
bad "plan: --max-inner-steps alone" '--max-inner-steps: expected only with --islands auto' \
    -- "$LOOM" plan --model gpt2 --dp 2 --max-inner-steps 10 --out x.json
# an island layout the runtime cannot run is refused by the layout rules, named as anywhere
bad "plan: islands of tp 5" 'mesh.tp: expected a divisor of model.heads 12' \
    -- "$LOOM" plan --model gpt2 --islands 2 --tp 5 --out x.json
bad "plan: islands of pp 13" 'mesh.pp: expected at most model.layers 12 stages' \
    -- "$LOOM" plan --model gpt2 --islands 2 --pp 13 --out x.json
bad "plan: islands, --inner-steps 0" 'islands.inner_steps: expected at least 1 inner step a round, got 0' \
    -- "$LOOM" plan --model gpt2 --islands 2 --inner-steps 0 --out x.json

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
