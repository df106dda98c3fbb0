#!/usr/bin/env bash
# cli_hf.sh — Hugging Face model folders, both ways, checked against folders this script writes
# itself (with Python's standard library: no weights can be downloaded here):
# - a LlamaForCausalLM folder as the published configurations have it (config.json; bf16 weights
#   in two shards with model.safetensors.index.json; q/k/v and gate/up as separate tensors, each
#   filled with its own pattern) is read by `loom train --init-from`, and the checkpoint loom
#   then writes (lr 0: the weights unchanged) holds exactly the same values, widened to fp32,
#   under the same names and shapes; its config.json has LlamaForCausalLM's fields;
# - a GPT-2 run's checkpoint folder has GPT2LMHeadModel's config.json;
# - Llama 3.1's rope scaling read (loss vs the reference with scaled frequencies) and written back;
# - what loom cannot run is refused by name: other rope scalings, biases, a sliding window,
#   another model_type.
#
# usage: bash tests/cli_hf.sh LOOM_BINARY TMPDIR   (TMPDIR is emptied first)
source "$(dirname "$0")/cli_harness.bash" "$@"

seq 600 | sed 's/.*/line &: the quick brown fox jumps over the lazy dog./' >corpus.txt
"$LOOM" prepare --text corpus.txt --out data --seq-len 16 >/dev/null 2>&1 ||
    check "prepare" "loom prepare failed"

# write_llama DIR [KEY=JSON...]: a 2-layer Llama (hidden 32, 4 heads over 2 kv heads, SwiGLU 48,
# vocabulary 257, untied) in bf16, two shards and an index; extra config keys as given
write_llama() {
    python3 - "$@" <<'PY'
import json, os, struct, sys
out, extra = sys.argv[1], sys.argv[2:]
os.makedirs(out, exist_ok=True)
L, C, NH, KV, F, V = 2, 32, 4, 2, 48, 257
hd = C // NH
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
          "intermediate_size": F, "num_attention_heads": NH, "num_hidden_layers": L,
          "num_key_value_heads": KV, "max_position_embeddings": 64, "rms_norm_eps": 1e-05,
          "rope_theta": 10000.0, "rope_scaling": None, "vocab_size": V,
          "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
          "mlp_bias": False, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 256}
for kv in extra:
    k, v = kv.split("=", 1)
    config[k] = json.loads(v)
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C)}
for l in range(L):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                   p + "self_attn.q_proj.weight": (NH * hd, C), p + "self_attn.k_proj.weight": (KV * hd, C),
                   p + "self_attn.v_proj.weight": (KV * hd, C), p + "self_attn.o_proj.weight": (C, C),
                   p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                   p + "mlp.down_proj.weight": (C, F)})
def values(name, n):
    # a pattern of its own per tensor, every value exact in bf16 (k / 32, |k| <= 56)
    seed = sum(ord(ch) * (i + 1) for i, ch in enumerate(name)) % 97
    return [((i * 31 + seed * 7) % 113 - 56) / 32.0 for i in range(n)]
def bf16(x):
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16
names = sorted(shapes)
shards = [names[: len(names) // 2], names[len(names) // 2:]]
weight_map = {}
for s, part in enumerate(shards):
    fname = f"model-{s + 1:05d}-of-00002.safetensors"
    header, blobs, at = {}, [], 0
    for name in part:
        n = 1
        for d in shapes[name]:
            n *= d
        data = b"".join(struct.pack("<H", bf16(v)) for v in values(name, n))
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
        weight_map[name] = fname
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(out, fname), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map},
          open(os.path.join(out, "model.safetensors.index.json"), "w"))
json.dump({n: values(n, 1)[0] for n in names}, open(os.path.join(out, "first_values.json"), "w"))
PY
}

# same_values HF_DIR LOOM_FILE: every tensor of the folder equals the loom file's, bit for bit
# once widened, under the same name and shape; loom's file holds nothing else
same_values() {
    python3 - "$1" "$2" <<'PY'
import json, os, struct, sys
hf, mine = sys.argv[1], sys.argv[2]
def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        blob = raw[8 + n + a: 8 + n + b]
        if e["dtype"] == "BF16":
            vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0]
                    for (h,) in struct.iter_unpack("<H", blob)]
        else:
            vals = [v for (v,) in struct.iter_unpack("<f", blob)]
        out[name] = (e["shape"], vals)
    return out
index = json.load(open(os.path.join(hf, "model.safetensors.index.json")))
theirs = {}
for f in sorted(set(index["weight_map"].values())):
    theirs.update(read(os.path.join(hf, f)))
ours = read(mine)
bad = [n for n in theirs if n not in ours or ours[n] != theirs[n]]
extra = [n for n in ours if n not in theirs]
if bad or extra:
    print("differ:", bad[:5], "extra:", extra[:5])
    sys.exit(1)
PY
}

# reference_loss HF_DIR SHARD T: the loss of the folder's model on the shard's first window (T
# tokens and their next tokens), computed here in double from the Hugging Face tensors by the
# published LlamaForCausalLM arithmetic (RMSNorm, rotate-half rotary positions, grouped-query
# attention, SwiGLU gate x up, the untied head)
reference_loss() {
    python3 - "$@" <<'PY'
import json, math, os, struct, sys
hf, shard, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = json.load(open(os.path.join(hf, "config.json")))
index = json.load(open(os.path.join(hf, "model.safetensors.index.json")))
W = {}
for f in sorted(set(index["weight_map"].values())):
    raw = open(os.path.join(hf, f), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n]); header.pop("__metadata__", None)
    for name, e in header.items():
        a, b = e["data_offsets"]
        vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0]
                for (h,) in struct.iter_unpack("<H", raw[8 + n + a: 8 + n + b])]
        rows = e["shape"][0] if len(e["shape"]) == 2 else 1
        cols = e["shape"][-1]
        W[name] = vals if rows == 1 and len(e["shape"]) == 1 else [vals[r * cols:(r + 1) * cols] for r in range(rows)]
raw = open(shard, "rb").read()
tokens = [t for (t,) in struct.iter_unpack("<H", raw[1024:])][: T + 1]
C, NH, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd, eps, theta = C // NH, cfg["rms_norm_eps"], cfg["rope_theta"]
def rms(x, w):
    r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * r * g for v, g in zip(x, w)]
def lin(x, m):
    return [sum(a * b for a, b in zip(x, row)) for row in m]
def inv_freq(i):
    # Llama 3.1's scaling as Hugging Face's rope_type "llama3" documents it: wavelengths under
    # original / high_freq_factor kept, over original / low_freq_factor divided by factor,
    # between them a blend linear in original / wavelength
    f = theta ** (-2.0 * i / hd)
    sc = cfg.get("rope_scaling")
    if not sc:
        return f
    wl, old = 2 * math.pi / f, sc["original_max_position_embeddings"]
    lo, hi, factor = sc["low_freq_factor"], sc["high_freq_factor"], sc["factor"]
    if wl < old / hi:
        return f
    if wl > old / lo:
        return f / factor
    a = (old / wl - lo) / (hi - lo)
    return (1 - a) * f / factor + a * f
def rope(v, t):
    out = list(v)
    for h in range(len(v) // hd):
        for i in range(hd // 2):
            ang = t * inv_freq(i)
            x1, x2 = v[h * hd + i], v[h * hd + i + hd // 2]
            out[h * hd + i] = x1 * math.cos(ang) - x2 * math.sin(ang)
            out[h * hd + i + hd // 2] = x2 * math.cos(ang) + x1 * math.sin(ang)
    return out
x = [list(W["model.embed_tokens.weight"][tok]) for tok in tokens[:T]]
for l in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{l}."
    h = [rms(v, W[p + "input_layernorm.weight"]) for v in x]
    q = [rope(lin(v, W[p + "self_attn.q_proj.weight"]), t) for t, v in enumerate(h)]
    k = [rope(lin(v, W[p + "self_attn.k_proj.weight"]), t) for t, v in enumerate(h)]
    vv = [lin(v, W[p + "self_attn.v_proj.weight"]) for v in h]
    att = []
    for t in range(T):
        y = []
        for head in range(NH):
            g = head // (NH // KV)
            s = [sum(q[t][head * hd + i] * k[u][g * hd + i] for i in range(hd)) / math.sqrt(hd)
                 for u in range(t + 1)]
            m = max(s); e = [math.exp(a - m) for a in s]; z = sum(e)
            y += [sum(e[u] / z * vv[u][g * hd + i] for u in range(t + 1)) for i in range(hd)]
        att.append(y)
    x = [[a + b for a, b in zip(xt, lin(yt, W[p + "self_attn.o_proj.weight"]))] for xt, yt in zip(x, att)]
    h = [rms(v, W[p + "post_attention_layernorm.weight"]) for v in x]
    mlp = []
    for v in h:
        gate, up = lin(v, W[p + "mlp.gate_proj.weight"]), lin(v, W[p + "mlp.up_proj.weight"])
        mlp.append(lin([g / (1 + math.exp(-g)) * u for g, u in zip(gate, up)], W[p + "mlp.down_proj.weight"]))
    x = [[a + b for a, b in zip(xt, mt)] for xt, mt in zip(x, mlp)]
loss = 0.0
for t in range(T):
    logits = lin(rms(x[t], W["model.norm.weight"]), W["lm_head.weight"])
    m = max(logits)
    loss += m + math.log(sum(math.exp(a - m) for a in logits)) - logits[tokens[t + 1]]
print(f"{loss / T:.9f}")
PY
}

write_llama hf
# the model loom reads is the model Hugging Face's arithmetic describes: its loss on a window
# equals an independent double-precision forward pass over the folder's tensors
shard=$(find data -name 'train_*.bin' | sort | head -n1)
want=$(reference_loss hf "$shard" 16)
got=$("$LOOM" eval --checkpoint hf --data "$shard" --seq-len 16 --batch 1 --max-windows 1 --threads 1 2>err.txt | awk '/^loss/ {print $2}')
why=$(python3 -c "import sys; a, b = float('$got' or 'nan'), float('$want'); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" 2>&1) &&
    why="" || why="loom eval $got vs the reference $want: $(tail -2 err.txt)"
check "a Hugging Face Llama folder's loss equals a double-precision reference" "$why"
train=(--data 'data/train_*.bin' --seq-len 16 --micro-batch-size 2 --global-batch-size 2
    --threads 1 --steps 1 --eval-every 0 --lr 0 --warmup-steps 0)
if "$LOOM" train --init-from hf "${train[@]}" --out from_hf >from_hf.log 2>&1; then
    check "init from a sharded bf16 Llama folder" ""
    ck=from_hf/checkpoints/step_00000001
    if grep -q "arch llama: 2 kv heads, SwiGLU 48, untied head" from_hf.log; then
        check "its configuration read from config.json" ""
    else
        check "its configuration read from config.json" "$(grep -m1 '^model:' from_hf.log)"
    fi
    why=$(same_values hf "$ck/model.safetensors" 2>&1) && why=""
    check "the checkpoint holds the folder's values under its names (lr 0)" "$why"
    why=$(python3 - "$ck/config.json" <<'PY' 2>&1
import json, sys
c = json.load(open(sys.argv[1]))
want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
        "intermediate_size": 48, "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "vocab_size": 257,
        "tie_word_embeddings": False, "hidden_act": "silu", "rope_theta": 10000.0,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "attention_bias": False}
bad = {k: c.get(k) for k in want if c.get(k) != want[k]}
if bad:
    print("config.json differs:", bad)
    sys.exit(1)
PY
    ) && why=""
    check "the checkpoint folder's config.json is LlamaForCausalLM's" "$why"
    # loom's own folder reads back as a Hugging Face folder too
    if "$LOOM" train --init-from "$ck" "${train[@]}" --out again >again.log 2>&1 &&
        python3 - "$ck/model.safetensors" again/checkpoints/step_00000001/model.safetensors <<'PY'
import sys
a, b = (open(p, "rb").read() for p in sys.argv[1:])
import json, struct
def body(raw):
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return h, raw[8 + n:]
ha, da = body(a); hb, db = body(b)
sys.exit(0 if ha == hb and da == db else 1)
PY
    then
        check "loom's checkpoint folder read back as a Hugging Face folder" ""
    else
        check "loom's checkpoint folder read back as a Hugging Face folder" "$(tail -2 again.log)"
    fi
else
    check "init from a sharded bf16 Llama folder" "$(tail -3 from_hf.log)"
fi

# GPT-2's checkpoint folders are GPT2LMHeadModel folders
if "$LOOM" train --model tiny "${train[@]}" --out gpt >gpt.log 2>&1; then
    why=$(python3 - gpt/checkpoints/step_00000001/config.json <<'PY' 2>&1
import json, sys
c = json.load(open(sys.argv[1]))
want = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 16, "n_head": 2,
        "n_layer": 2, "n_positions": 16, "vocab_size": 257, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-05, "tie_word_embeddings": True}
bad = {k: c.get(k) for k in want if c.get(k) != want[k]}
if bad:
    print("config.json differs:", bad)
    sys.exit(1)
PY
    ) && why=""
    check "a GPT-2 checkpoint folder's config.json is GPT2LMHeadModel's" "$why"
else
    check "a GPT-2 run" "$(tail -3 gpt.log)"
fi

# Llama 3.1's rope scaling, at an original context of 64 so that a head of 8 has a kept, a
# blended and two divided frequencies: the loss equals the reference's with the scaled
# frequencies (and differs from the unscaled folder's), the checkpoint's config.json keeps it
write_llama scaled 'rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}'
want_scaled=$(reference_loss scaled "$shard" 16)
got=$("$LOOM" eval --checkpoint scaled --data "$shard" --seq-len 16 --batch 1 --max-windows 1 --threads 1 2>err.txt | awk '/^loss/ {print $2}')
why=$(python3 -c "
import sys
a, b, plain = float('$got' or 'nan'), float('$want_scaled'), float('$want')
if abs(a - b) > 1e-5 * abs(b): sys.exit(f'loom eval {a} vs the reference {b}')
if abs(b - plain) < 1e-4 * abs(b): sys.exit(f'the scaling does not move the reference loss ({b} vs {plain})')
" 2>&1) && why="" || why="$why $(tail -2 err.txt)"
check "a folder with Llama 3.1's rope scaling: loss equals the reference's" "$why"
if "$LOOM" train --init-from scaled "${train[@]}" --out from_scaled >from_scaled.log 2>&1; then
    why=$(python3 - from_scaled/checkpoints/step_00000001/config.json <<'PY' 2>&1
import json, sys
c = json.load(open(sys.argv[1]))["rope_scaling"]
want = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}
if c != want:
    sys.exit(f"rope_scaling {c}")
PY
    ) && why=""
    check "the checkpoint's config.json keeps the rope scaling" "$why"
    "$LOOM" eval --checkpoint from_scaled --data "$shard" --seq-len 16 --batch 1 --max-windows 1 \
        --threads 1 2>/dev/null | grep -q "^loss $got" &&
        check "and its loss" "" || check "and its loss" "not $got after a round trip"
else
    check "init from a folder with rope scaling" "$(tail -3 from_scaled.log)"
fi

# refused by name
write_llama yarn 'rope_scaling={"rope_type": "yarn", "factor": 4.0}'
bad "another rope scaling refused" "rope_scaling: type \"yarn\" is not supported" -- "$LOOM" train --init-from yarn "${train[@]}" --out r1
write_llama halfscaled 'rope_scaling={"rope_type": "llama3", "factor": 8.0}'
bad "a llama3 scaling without its numbers refused" "rope_scaling: low_freq_factor: expected a number" -- "$LOOM" train --init-from halfscaled "${train[@]}" --out r1b
write_llama biased 'attention_bias=true'
bad "attention biases refused" "attention_bias: biases" -- "$LOOM" train --init-from biased "${train[@]}" --out r2
write_llama windowed 'sliding_window=4096'
bad "sliding window refused" "sliding_window: sliding-window" -- "$LOOM" train --init-from windowed "${train[@]}" --out r3
write_llama mistral 'model_type="mistral"'
bad "another model_type refused" "model_type: expected \"gpt2\" or \"llama\"" -- "$LOOM" train --init-from mistral "${train[@]}" --out r4

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
