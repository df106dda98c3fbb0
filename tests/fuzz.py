#!/usr/bin/env python3
"""fuzz.py — loom's own file-format fuzzer: mutates valid files of every format loom reads and
runs the given loom binary on each mutant, one at a time.

Formats and the commands that read them:
  shard   llm.c token shards        train --data, train --val-data, eval --data
  llmc    llm.c fp32 checkpoints    train --init-from, sample/eval --checkpoint
  model   model.safetensors         train --init-from, train --resume, sample/eval --checkpoint
  state   state.safetensors         train --resume
  config  train --config JSON       train --config
  plan    plan files                train --plan, plan --check
  compress compressor state        mpirun -np 2 train --resume
          (rank 0's compress_rank00000.safetensors, and the signature in state.safetensors's
          metadata loom.compress)
  cluster cluster descriptions      plan --check-cluster
  tokenizer GPT-2 tokenizer files   tokenize --tokenizer (and --decode): a folder of vocab.json +
          merges.txt, one of tokenizer.json, one of llm.c's gpt2_tokenizer.bin (decoding only)

The valid seeds are made here with the binary itself (prepare, a 1-step tiny run, a 2-step run
of 2 ranks with data-parallel PowerSGD under mpirun, loom plan) or written by this script (the
JSON config, an llm.c checkpoint of the tiny model's shape, a tiny byte-level BPE in its three
file formats (GPT-2's byte alphabet, a few merges, <|endoftext|>), and the repository's
clusters/dgx-a100.json with a collective fit and compressor throughputs added, so that every
part of the schema is mutated). Without mpirun the compress format is skipped, with a note.
Mutant i of seed S is a pure function of (S, i) and the formats asked for: format i mod their
number (9: shard, llmc, model, state, config, plan, compress, cluster, tokenizer), then one
operator drawn
from random.Random("S/i"): bit flips, byte and integer-slot writes at the header
fields, truncation, extension, insertion/deletion, and structured edits (JSON values, keys and
nesting; safetensors shapes, dtypes, offsets, names and metadata; llm.c header dimensions; token
values; special float values in compressor state; compressor files missing or exchanged between
ranks). --limit FORMAT=N skips a format's turns after its first N mutants.

Each mutant run ends in one class: refused (exit 2), accepted (exit 0), failed (exit 1), crash
(a signal, exit >= 128 or an unexpected status, or a sanitizer report), hang (no progress before
the timeout), or slow (a training run the mutant made long, killed once it had done 20 steps, or
at the timeout while it still kept a core busy).
An accepted mutant is compared with its unmutated seed run through the same command (training
losses, learning rates, gradient norms and the saved weights; or stdout): every operator also
says what it expects: "refuse" (the file is broken), "same" (the edit is irrelevant to what is
trained), "any" (a legitimate file that may train differently), or "warn" (accepted with a
"warning:" line: a signature in state.safetensors that is not the run's makes the compressors
start fresh). Accepted "refuse" mutants, "same" mutants whose outcome changed without a
"warning:" line, and "warn" mutants refused or accepted without a warning are SUSPICIOUS;
accepted mutants of a header, metadata or JSON that changed the outcome are listed for REVIEW.

Crashes, hangs and suspicious mutants are kept under WORKDIR/findings/ with a repro.sh.
Exit status: 1 on any crash or hang (also on a suspicious mutant with --strict), else 0. The last
line is "N passed, N failed" (failed = crashes + hangs [+ suspicious with --strict]).

usage: fuzz.py LOOM_BINARY WORKDIR [--count N] [--seed S] [--timeout SECONDS]
               [--formats shard,llmc,...] [--limit FORMAT=N,...] [--strict] [--quiet]
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

FORMATS = ["shard", "llmc", "model", "state", "config", "plan", "compress", "cluster",
           "tokenizer"]
CLASSES = ["refused", "accepted", "failed", "crash", "hang", "slow"]
TINY = ["--threads", "1", "--seq-len", "16", "--micro-batch-size", "2", "--global-batch-size", "2"]
RUN_FLAGS = ["--threads", "1", "--eval-every", "0", "--log-every", "1", "--out", "run"]
# the compressed run (under mpirun -np 2): data-parallel PowerSGD
COMPRESS_RUN = ["--model", "tiny", "--data", "data/train_*.bin", "--seq-len", "16",
                "--micro-batch-size", "2", "--global-batch-size", "4", "--dp-compression",
                "powersgd", "--dp-compression-rank", "2"]
# Under mpirun every rank runs through this, which keeps its exit status: mpirun itself reports
# only the first non-zero one, and by default kills the other ranks then, sanitizer reports
# unwritten. (A signal reads as 128 + its number, as from a shell.)
RANK_STATUS_SH = """#!/bin/sh
"$@"
status=$?
echo $status >"rank${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}.status"
exit $status
"""
# loom's messages, under mpirun prefixed with the rank
ERROR_LINE = re.compile(r"^(\[rank \d+\] )?error: ", re.M)
WARNING_LINE = re.compile(r"^(\[rank \d+\] )?warning: ", re.M)
SANITIZER = re.compile(r"ERROR: (Address|Leak|Memory|Thread|UndefinedBehavior)Sanitizer|"
                       r"SUMMARY: \w+Sanitizer|:[0-9]+:[0-9]+: runtime error: |"
                       r"Segmentation fault|core dumped|stack smashing|double free")
RSS_LIMIT = re.compile(r"hard rss limit exhausted|out of memory: allocator is trying")
SLOW_STEPS = 20  # a training run past this many steps is a legitimately long one
# the cluster seed: a shipped description (the fuzzer runs from the repository's tests/)
CLUSTER_SEED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "clusters", "dgx-a100.json")

# ---- tiny model shape (loom's `tiny` preset) -------------------------------------------------

TINY_SHAPE = dict(maxT=16, V=257, L=2, NH=2, C=16, Vp=384)


def llmc_param_count(maxT, V, L, NH, C, Vp):
    return Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C


# ---- JSON with duplicate keys and raw number text ----------------------------------------------

class Obj(list):
    """A JSON object as a list of (key, value) pairs: keeps order and allows duplicates."""


class Raw:
    """A JSON token written as is (numbers Python would not print, invalid text)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def jparse(text):
    return json.loads(text, object_pairs_hook=Obj)


def jdump(v, indent=None, level=0):
    pad = "" if indent is None else "\n" + " " * (indent * (level + 1))
    end = "" if indent is None else "\n" + " " * (indent * level)
    sep = ":" if indent is None else ": "
    if isinstance(v, Raw):
        return v.text
    if isinstance(v, Obj):
        if not v:
            return "{}"
        items = [json.dumps(k) + sep + jdump(x, indent, level + 1) for k, x in v]
        return "{" + pad + ("," + pad).join(items) + end + "}"
    if isinstance(v, list):
        if not v:
            return "[]"
        return "[" + ",".join(jdump(x, None) for x in v) + "]"
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return "1e999"
    return json.dumps(v)


def jnodes(v, path=()):
    """Every node below the root: (path, parent, key-or-index, value)."""
    out = []
    if isinstance(v, Obj):
        for i, (k, x) in enumerate(v):
            out.append((path + (k,), v, i, x))
            out += jnodes(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out.append((path + (i,), v, i, x))
            out += jnodes(x, path + (i,))
    return out


def jset(parent, index, value):
    if isinstance(parent, Obj):
        parent[index] = (parent[index][0], value)
    else:
        parent[index] = value


def jpath(path):
    return ".".join(str(p) for p in path) or "(root)"


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return (is_int(v) or isinstance(v, float)) and not isinstance(v, bool)


# the limits of int32/int64/uint64, and values whose products with small factors (12 L, 4 C)
# wrap an int
HUGE_NUMBERS = ["2147483647", "2147483648", "4294967296", "9223372036854775807",
                "9223372036854775808", "18446744073709551616", "99999999999999999999999",
                "1e308", "1e999", "1000000000", "178956971", "357913942", "536870912", "65536"]
UNKNOWN_KEYS = ["stepz", "extra", "", "__metadata__", "LAYERS", "model ", "x" * 300]


def json_value_edit(rng, value):
    """A new value for a JSON leaf or container: (new value, description, expectation)."""
    choices = []
    if is_num(value):
        choices += [
            ("huge", lambda: Raw(rng.choice(HUGE_NUMBERS)), "any"),
            ("negative", lambda: -abs(value) if value else -1, "refuse"),
            ("negative-big", lambda: Raw("-9223372036854775809"), "refuse"),
            ("zero", lambda: 0 if is_int(value) else 0.0, "any"),
            ("plus-one", lambda: value + 1, "any"),
            ("times-two", lambda: value * 2, "any"),
            ("string", lambda: str(value), "refuse"),
            ("word", lambda: "abc", "refuse"),
            ("bool", lambda: rng.choice([True, False]), "refuse"),
            ("null", lambda: None, "refuse"),
        ]
        if is_int(value):
            choices += [("fraction", lambda: value + 0.5, "refuse"),
                        ("integral-real", lambda: Raw("%d.0" % value), "any"),
                        ("exponent", lambda: Raw("%de0" % value), "any")]
        else:
            choices += [("tiny-real", lambda: 1e-300, "any"), ("nan-text", lambda: Raw("NaN"),
                                                               "refuse")]
    elif isinstance(value, str):
        choices += [
            ("empty", lambda: "", "any"),
            ("other-word", lambda: rng.choice(["gpipe", "1f1b", "cosine", "constant", "none",
                                               "tiny", "small", "gpt2", "F16", "x"]), "any"),
            ("long", lambda: "a" * rng.choice([31, 32, 64, 255, 256, 5000]), "any"),
            ("unicode", lambda: value + "\u00e9\u4e2d", "any"),
            ("nul-escape", lambda: Raw(json.dumps(value)[:-1] + "\\u0000\""), "refuse"),
            ("number", lambda: rng.choice([0, 1, -1, 2.5]), "refuse"),
            ("bool", lambda: True, "refuse"),
        ]
    elif isinstance(value, bool):
        # booleans may be spelled 0/1 or "true"/"false" (the same value as `value` when it matches)
        choices += [("flip", lambda: not value, "any"), ("number-0", lambda: 0, "any"),
                    ("number-1", lambda: 1, "any"), ("string", lambda: str(value).lower(), "any"),
                    ("number-2", lambda: 2, "refuse"), ("null", lambda: None, "refuse")]
    elif value is None:
        choices += [("zero", lambda: 0, "refuse")]
    if isinstance(value, (Obj, list)) or choices:
        choices += [("wrap-array", lambda: [value], "refuse"),
                    ("wrap-object", lambda: Obj([("value", value)]), "refuse")]
    if isinstance(value, Obj):
        choices += [("object-to-array", lambda: [x for _, x in value], "refuse"),
                    ("empty-object", lambda: Obj(), "any")]
    if isinstance(value, list):
        choices += [("array-to-object", lambda: Obj((str(i), x) for i, x in enumerate(value)),
                     "refuse"),
                    ("empty-array", lambda: [], "any"),
                    ("reverse", lambda: list(reversed(value)), "any"),
                    ("drop-last", lambda: value[:-1], "any"),
                    ("append", lambda: value + [rng.choice([0, 1, 7, -1, 99])], "any")]
    name, make, expect = rng.choice(choices)
    return make(), name, expect


def json_edit(rng, doc, rules):
    """One structured edit of a parsed document (changed in place). `rules(path, op, expect)`
    refines the generic expectation for a format. Returns (description, expectation)."""
    nodes = jnodes(doc)
    path, parent, index, value = rng.choice(nodes)
    op = rng.choice(["value"] * 6 + ["delete", "duplicate", "unknown-key", "rename"])
    if op in ("delete", "duplicate", "unknown-key", "rename") and not isinstance(parent, Obj):
        op = "value"
    if op == "value":
        new, name, expect = json_value_edit(rng, value)
        jset(parent, index, new)
        desc = "%s: %s -> %s (%s)" % (jpath(path), short(jdump(value)), short(jdump(new)), name)
        if jdump(new) == jdump(value):  # e.g. a one-element array reversed
            return desc, "same"
        return desc, rules(path, name, expect)
    key = parent[index][0]
    if op == "delete":
        del parent[index]
        return "%s: deleted" % jpath(path), rules(path, "delete", "any")
    if op == "duplicate":
        copy = value if rng.random() < 0.5 else json_value_edit(rng, value)[0]
        parent.insert(index + rng.choice([0, 1]), (key, copy))
        return "%s: duplicated (%s)" % (jpath(path), short(jdump(copy))), \
            rules(path, "duplicate", "refuse")
    if op == "unknown-key":
        new_key = rng.choice(UNKNOWN_KEYS)
        parent.insert(rng.randrange(len(parent) + 1), (new_key, rng.choice([1, "x", True, Obj()])))
        return "%s: unknown key %s added beside it" % (jpath(path), short(json.dumps(new_key))), \
            rules(path[:-1] + (new_key,), "unknown-key", "refuse")
    new_key = key.upper() if rng.random() < 0.5 else key + "_"
    parent[index] = (new_key, value)
    return "%s: renamed to %s" % (jpath(path), short(json.dumps(new_key))), \
        rules(path, "rename", "refuse")


def short(text, n=70):
    text = str(text)
    return text if len(text) <= n else text[:n - 3] + "..."


# ---- byte-level operators -------------------------------------------------------------------

INTERESTING_BYTES = [0x00, 0x01, 0x7f, 0x80, 0xff, ord("{"), ord("}"), ord('"'), ord(","),
                     ord(":"), ord("0"), ord("9"), ord("-"), ord(" "), ord("\\"), ord("[")]
INTERESTING_I32 = [0, 1, -1, 2, 3, 5, 7, 16, 255, 256, 257, 65535, 65536, 0x7fffffff,
                   -0x80000000, 0x40000000, 20240520, 20240326]


def le32(data, at):
    return struct.unpack_from("<i", data, at)[0]


class Mutant:
    """data: the mutated file (None: the file removed); file: which file of a checkpoint folder it
    replaces, where a format's command reads several (None: the format's own)."""

    def __init__(self, data, op, expect, where, file=None):
        self.data, self.op, self.expect, self.where, self.file = data, op, expect, where, file


def byte_op(rng, seed, regions, classify):
    """Generic byte mutations. regions: name -> (start, end); classify(set of changed offsets,
    size changed?) -> (expectation, where)."""
    data = bytearray(seed)
    n = len(data)
    op = rng.choice(["bitflip", "bitflip", "byte", "byte", "truncate", "extend", "insert",
                     "delete", "splice"])
    header = regions["header"]
    if op == "bitflip":
        flips = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            lo, hi = header if rng.random() < 0.7 else (0, n)
            pos = rng.randrange(lo, hi)
            bit = rng.randrange(8)
            data[pos] ^= 1 << bit
            flips.append((pos, bit))
        expect, where = classify({p for p, _ in flips}, False)
        return Mutant(bytes(data), "bitflip " + ",".join("%d.%d" % f for f in flips), expect,
                      where)
    if op == "byte":
        lo, hi = header
        pos = rng.randrange(lo, hi)
        old = data[pos]
        data[pos] = rng.choice([b for b in INTERESTING_BYTES + [rng.randrange(256)] if b != old])
        expect, where = classify({pos} if data[pos] != old else set(), False)
        return Mutant(bytes(data), "byte @%d 0x%02x->0x%02x" % (pos, old, data[pos]), expect,
                      where)
    if op == "truncate":
        cuts = [0, 1, 4, 7, 8, header[1] - 1, header[1], header[1] + 1, n - 1, n - 2, n - 4,
                rng.randrange(n)]
        size = rng.choice([c for c in cuts if 0 <= c < n])
        return Mutant(bytes(data[:size]), "truncate %d->%d" % (n, size), *classify(None, True))
    if op == "extend":
        k = rng.choice([1, 2, 3, 4, 8, 16, 1024, rng.randrange(1, 5000)])
        fill = rng.choice(["zeros", "ff", "random", "copy"])
        tail = {"zeros": bytes(k), "ff": b"\xff" * k,
                "random": bytes(rng.randrange(256) for _ in range(k)),
                "copy": (bytes(data) * (k // n + 1))[:k]}[fill]
        return Mutant(bytes(data) + tail, "extend +%d %s" % (k, fill), *classify(None, True))
    if op == "insert":
        pos = rng.randrange(*header)
        k = rng.choice([1, 2, 4, 8])
        data[pos:pos] = bytes(rng.choice(INTERESTING_BYTES) for _ in range(k))
        return Mutant(bytes(data), "insert %d bytes @%d" % (k, pos), *classify(None, True))
    if op == "delete":
        pos = rng.randrange(*header)
        k = rng.choice([1, 2, 4, 8])
        del data[pos:pos + k]
        return Mutant(bytes(data), "delete %d bytes @%d" % (k, pos), *classify(None, True))
    # splice: overwrite a chunk with bytes from elsewhere (same size)
    k = rng.choice([4, 8, 16, 64])
    src = rng.randrange(0, max(1, n - k))
    dst = rng.randrange(header[0], max(header[0] + 1, min(header[1], n - k)))
    old = bytes(data[dst:dst + k])
    data[dst:dst + k] = seed[src:src + k]
    changed = {dst + i for i in range(k) if old[i] != data[dst + i]}
    return Mutant(bytes(data), "splice %d bytes %d->%d" % (k, src, dst), *classify(changed, False))


def slot_op(rng, seed, slots, classify):
    """Writes an interesting int32 into a header slot (slots: the meaningful ones)."""
    data = bytearray(seed)
    slot = rng.choice(slots) if rng.random() < 0.85 else rng.randrange(8, 256)
    old = le32(data, 4 * slot)
    value = rng.choice(INTERESTING_I32 + [old + 1, old - 1, old * 2, old // 2, -old])
    value = (value + 2 ** 31) % 2 ** 32 - 2 ** 31
    struct.pack_into("<i", data, 4 * slot, value)
    changed = set(range(4 * slot, 4 * slot + 4)) if value != old else set()
    expect, where = classify(changed, False)
    return Mutant(bytes(data), "header[%d] %d -> %d" % (slot, old, value), expect, where), slot, \
        value


# ---- formats --------------------------------------------------------------------------------

def shard_mutant(rng, seed, vocab=257):
    n = len(seed)

    def classify(changed, resized):
        if resized:
            return "refuse", "size"
        if not changed:
            return "same", "none"
        if min(changed) < 12:
            return "refuse", "header"
        if max(changed) < 1024:
            return "same", "header (unused slots)"
        return "any", "payload"

    r = rng.random()
    if r < 0.25:
        return slot_op(rng, seed, [0, 1, 2], classify)[0]
    if r < 0.4:
        data = bytearray(seed)
        count = (n - 1024) // 2
        pos = rng.randrange(count)
        old = struct.unpack_from("<H", data, 1024 + 2 * pos)[0]
        value = rng.choice([vocab - 1, vocab, vocab + 1, 65535, 256, 0, 300])
        struct.pack_into("<H", data, 1024 + 2 * pos, value)
        expect = "refuse" if value >= vocab else ("same" if value == old else "any")
        return Mutant(bytes(data), "token[%d] %d -> %d" % (pos, old, value), expect, "payload")
    return byte_op(rng, seed, {"header": (0, 1024)}, classify)


def llmc_mutant(rng, seed):
    def classify(changed, resized):
        if resized:
            return "refuse", "size"
        if not changed:
            return "same", "none"
        if min(changed) < 8:
            return "refuse", "header"
        if min(changed) < 32:
            return "any", "header (dimensions)"
        if max(changed) < 1024:
            return "same", "header (unused slots)"
        return "any", "payload"

    if rng.random() < 0.4:
        m, slot, value = slot_op(rng, seed, [0, 1, 2, 3, 4, 5, 6, 7], classify)
        if 2 <= slot <= 7 and m.expect != "same":
            dims = [le32(m.data, 4 * s) for s in range(2, 8)]
            maxT, V, L, NH, C, Vp = dims
            ok = min(dims) > 0 and C % NH == 0 and Vp >= V and \
                llmc_param_count(maxT, V, L, NH, C, Vp) == llmc_param_count(**TINY_SHAPE)
            m.expect = "any" if ok else "refuse"
        return m
    return byte_op(rng, seed, {"header": (0, 1024)}, classify)


def st_split(data):
    n = struct.unpack_from("<Q", data, 0)[0]
    return data[8:8 + n].decode(), data[8 + n:]


def st_join(header, body, pad=True):
    raw = header.encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def st_tensor_rules(path, op, expect):
    """Expectations for generic JSON edits of a safetensors header."""
    if not path:
        return expect
    if path[0] == "__metadata__":
        if len(path) == 1:
            return "refuse" if op not in ("delete", "empty-object") else "any"
        if op == "unknown-key":
            return "same"
        if op == "rename":  # as if deleted: a state file is refused, a model one is Hugging Face's
            return "any"
        return expect
    if len(path) == 1:  # a tensor entry as a whole
        return "refuse" if op != "unknown-key" else "refuse"
    return "refuse" if expect != "same" else "same"


def state_meta_values(old):
    return [("0", "any"), ("1", "any"), ("2", "any"), ("7", "any"), ("1000", "any"),
            ("-1", "refuse"), ("abc", "refuse"), ("", "refuse"), ("1.5", "refuse"),
            ("0x10", "refuse"), ("1e3", "refuse"), ("18446744073709551615", "refuse-if-signed"),
            ("18446744073709551616", "refuse"), ("9223372036854775807", "any"),
            ("9223372036854775808", "refuse-if-signed"), (" " + old, "same"), ("+" + old, "same"),
            ("0" + old, "same"), (old + " ", "refuse"), (old + "\n", "refuse")]


SIGNED_STATE = {"step", "bad_steps", "skipped_total"}


def st_with_field(doc, name, field, value):
    """The header with tensor `name`'s `field` replaced."""
    return Obj((k, Obj((f, value if f == field else x) for f, x in v) if k == name else v)
               for k, v in doc)


def st_length_mutant(rng, seed):
    data = bytearray(seed)
    old = struct.unpack_from("<Q", data, 0)[0]
    value = rng.choice([0, 1, 7, old - 1, old + 1, old - 8, old + 8, len(seed) - 8, len(seed),
                        100000000, 100000001, 2 ** 63, 2 ** 64 - 1, 2 ** 32 + old])
    value %= 2 ** 64
    struct.pack_into("<Q", data, 0, value)
    return Mutant(bytes(data), "header length %d -> %d" % (old, value),
                  "refuse" if value != old else "same", "header length")


def st_shape_mutant(rng, doc, body, name, entry):
    shape = list(dict(entry)["shape"])
    op = rng.choice(["swap", "plus", "minus", "double", "add-1", "drop", "negative", "huge",
                     "scalar", "zero"])
    new = {
        "swap": shape[::-1],
        "plus": [d + 1 for d in shape] or [1],
        "minus": [max(0, d - 1) for d in shape] or [0],
        "double": shape[:-1] + [shape[-1] * 2] if shape else [2],
        "add-1": [1] + shape,  # the same element count
        "drop": shape[1:],
        "negative": [-d for d in shape] or [-1],
        "huge": rng.choice([[2 ** 62, 2 ** 62], [2 ** 31] + shape[1:], [2 ** 64] + shape[1:]]),
        "zero": [0] + shape[1:],
        "scalar": [],
    }[op]
    return Mutant(st_join(jdump(st_with_field(doc, name, "shape", new)), body),
                  "%s.shape %s -> %s" % (name, shape, new), "same" if new == shape else "refuse",
                  "header JSON")


def st_dtype_mutant(rng, doc, body, name, entry):
    new = rng.choice(["F16", "BF16", "F64", "I32", "U8", "f32", "F32 ", "", "F8_E4M3"])
    return Mutant(st_join(jdump(st_with_field(doc, name, "dtype", new)), body),
                  "%s.dtype F32 -> %s" % (name, json.dumps(new)), "refuse", "header JSON")


def st_offsets_mutant(rng, doc, body, name, entry):
    tensors = [(k, v) for k, v in doc if k != "__metadata__"]
    begin, end = dict(entry)["data_offsets"]
    op = rng.choice(["shift", "shift", "swap-same-size", "begin-end", "past-end", "huge"])
    same = [k for k, v in tensors if k != name and
            dict(v)["data_offsets"][1] - dict(v)["data_offsets"][0] == end - begin]
    if op == "swap-same-size" and same:
        # a valid file that stores the two tensors in each other's place: nothing can tell
        other = rng.choice(same)
        theirs = dict(dict(doc)[other])["data_offsets"]
        doc = st_with_field(st_with_field(doc, name, "data_offsets", list(theirs)), other,
                            "data_offsets", [begin, end])
        return Mutant(st_join(jdump(doc), body),
                      "data_offsets of %s and %s swapped" % (name, other), "any", "header JSON")
    k = rng.choice([1, 4, 8, -4])
    new = {"shift": [begin + k, end + k], "swap-same-size": [begin + k, end + k],
           "begin-end": [end, begin], "past-end": [begin, end + len(body)],
           "huge": [begin, 2 ** 63 + begin]}[op]
    return Mutant(st_join(jdump(st_with_field(doc, name, "data_offsets", new)), body),
                  "%s.data_offsets %s -> %s" % (name, [begin, end], new), "refuse", "header JSON")


def st_names_mutant(rng, doc, body, name, entry, kind):
    where = "header JSON"
    # a compressor file holds exactly its compressors' arrays: every name outside them is refused
    unused = "refuse" if kind == "compress" else "same"
    op = rng.choice(["rename", "delete", "duplicate", "extra-empty", "extra-data", "prefix"])
    if op == "rename":
        new = rng.choice([name + "x", name.upper(), "h.9." + name, name.replace(".", "_"),
                          name[:-1]])
        doc = Obj((new if k == name else k, v) for k, v in doc)
        return Mutant(st_join(jdump(doc), body), "tensor %s renamed %s" % (name, new), "refuse",
                      where)
    if op == "delete":
        doc = Obj((k, v) for k, v in doc if k != name)
        return Mutant(st_join(jdump(doc), body), "tensor %s deleted" % name, "refuse", where)
    if op == "duplicate":
        text = jdump(doc)
        entry_text = json.dumps(name) + ":" + jdump(entry)
        text = text.replace(entry_text, entry_text + "," + entry_text, 1)
        return Mutant(st_join(text, body), "tensor %s given twice" % name, "refuse", where)
    if op == "prefix":  # Hugging Face's "transformer." prefix on every name
        doc = Obj((k if k == "__metadata__" else "transformer." + k, v) for k, v in doc)
        return Mutant(st_join(jdump(doc), body), "every tensor prefixed 'transformer.'", unused,
                      where)
    # tensors the model does not use (Hugging Face files carry attn.bias buffers) are ignored
    end = len(body)
    extra = rng.choice(["dp.99.residual", "pp.grad.residual", "dp.0.p", "extra"]
                       if kind == "compress" else
                       ["h.0.attn.bias", "lm_head.weight", "extra", "h.5.ln_1.weight"])
    if op == "extra-empty":
        doc.append((extra, Obj([("dtype", "F32"), ("shape", [0]), ("data_offsets", [end, end])])))
        return Mutant(st_join(jdump(doc), body), "extra empty tensor %s" % extra, unused, where)
    doc.append((extra, Obj([("dtype", "F32"), ("shape", [2]), ("data_offsets", [end, end + 8])])))
    return Mutant(st_join(jdump(doc), body + struct.pack("<2f", 1.5, -2.0)),
                  "extra tensor %s with data" % extra, unused, where)


def safetensors_mutant(rng, seed, kind):
    header, body = st_split(seed)
    doc = jparse(header)
    meta = dict(doc).get("__metadata__", Obj())
    hlen = 8 + struct.unpack_from("<Q", seed, 0)[0]

    def classify(changed, resized):
        if resized:
            return "refuse", "size"
        if not changed:
            return "same", "none"
        if min(changed) < 8:
            return "refuse", "header length"
        if min(changed) < hlen:
            return "any", "header JSON"
        return "any", "payload"

    if kind == "state" and rng.random() < 0.4:  # the loop state: what a resumed run trusts most
        return st_metadata_mutant(rng, doc, body, meta, kind)
    r = rng.random()
    if r < 0.35:
        return byte_op(rng, seed, {"header": (0, hlen)}, classify)
    if r < 0.45:
        return st_length_mutant(rng, seed)
    name, entry = rng.choice([(k, v) for k, v in doc if k != "__metadata__"])
    r = rng.random()
    for limit, edit in ((0.15, st_shape_mutant), (0.25, st_dtype_mutant),
                        (0.37, st_offsets_mutant)):
        if r < limit:
            return edit(rng, doc, body, name, entry)
    if r < 0.45:
        return st_names_mutant(rng, doc, body, name, entry, kind)
    if r < 0.75 and meta:
        return st_metadata_mutant(rng, doc, body, meta, kind)
    desc, expect = json_edit(rng, doc,
                             compress_tensor_rules if kind == "compress" else st_tensor_rules)
    return Mutant(st_join(jdump(doc), body), desc, expect, "header JSON")


def st_metadata_mutant(rng, doc, body, meta, kind):
    where = "metadata"
    keys = [k for k, _ in meta]
    key = rng.choice(keys)
    old = dict(meta)[key]

    def rebuild(new_meta):
        return Obj((k, new_meta if k == "__metadata__" else v) for k, v in doc)

    r = rng.random()
    if r < 0.1:
        new_meta = Obj((k, v) for k, v in meta if k != key)
        expect = "refuse" if kind in ("state", "compress") and key != "format" else "any"
        if key == "format":  # a compressor file is loom's own: it must say which format it is
            expect = "refuse" if kind == "compress" else "same"
        return Mutant(st_join(jdump(rebuild(new_meta)), body), "metadata %s deleted" % key,
                      expect, where)
    if r < 0.18:
        new_meta = Obj(meta + [(rng.choice(["note", "loom.extra", "step2"]), "1")])
        return Mutant(st_join(jdump(rebuild(new_meta)), body), "metadata key added", "same",
                      where)
    if r < 0.25:
        new = rng.choice([1, 1.5, None, True, [old], Obj()])
        new_meta = Obj((k, new if k == key else v) for k, v in meta)
        return Mutant(st_join(jdump(rebuild(new_meta)), body), "metadata %s: %s -> %s" % (
            key, json.dumps(old), short(jdump(new))), "refuse", where)
    if key == "loom.config":
        return loom_config_mutant(rng, rebuild, meta, old, body)
    if key == "loom.compress":  # must equal the state file's: every other value is refused
        new = rng.choice(signature_edits(old))
        new_meta = Obj((k, new if k == key else v) for k, v in meta)
        return Mutant(st_join(jdump(rebuild(new_meta)), body), "metadata loom.compress %s" %
                      signature_desc(old, new), "refuse", where)
    if key == "format":
        new = rng.choice([w for w in ["pt", "tf", "", "loom.train_state.v2",
                                      "loom.train_state.v1", "np"] if w != old])
        new_meta = Obj((k, new if k == key else v) for k, v in meta)
        return Mutant(st_join(jdump(rebuild(new_meta)), body), "metadata format %s -> %s" % (
            json.dumps(old), json.dumps(new)), "refuse" if kind == "compress" else "same", where)
    new, expect = rng.choice([v for v in state_meta_values(old) if v[0] != old])
    if expect == "refuse-if-signed":
        expect = "refuse" if key in SIGNED_STATE else "any"
    if key == "rng_state" and expect == "any":
        expect = "same"  # saved for the record; nothing reads it
    if new == old:
        expect = "same"
    new_meta = Obj((k, new if k == key else v) for k, v in meta)
    return Mutant(st_join(jdump(rebuild(new_meta)), body), "metadata %s: %s -> %s" % (
        key, json.dumps(old), json.dumps(new)), expect, where)


def loom_config_mutant(rng, rebuild, meta, old, body):
    cfg = jparse(old)
    field = rng.choice([k for k, _ in cfg])
    value = dict(cfg)[field]
    op = rng.choice(["plus", "double", "zero", "negative", "huge", "string", "delete", "text"])
    if op == "text":
        text = rng.choice(["", "{", "[]", "null", old[:-1], old + "x", "{}"])
        desc = "loom.config %s -> %s" % (short(old, 30), short(json.dumps(text), 30))
    else:
        new = {"plus": value + 1, "double": value * 2, "zero": 0, "negative": -value,
               "huge": rng.choice([2 ** 40, 2 ** 31 - 1, 357913942, 178956971, 65536]),
               "string": str(value), "delete": None}[op]
        if op == "delete":
            cfg = Obj((k, v) for k, v in cfg if k != field)
        else:
            cfg = Obj((k, new if k == field else v) for k, v in cfg)
        text = jdump(cfg)
        desc = "loom.config %s: %s -> %s" % (field, value, "deleted" if op == "delete" else new)
    new_meta = Obj((k, text if k == "loom.config" else v) for k, v in meta)
    # what the tensors pin down must be refused when it changes; heads only divide d_model
    if field == "padded_vocab" and op != "text":
        expect = "same"
    elif field == "heads" and op in ("plus", "double") and 16 % (value + 1 if op == "plus"
                                                                 else value * 2) == 0:
        expect = "any"
    else:
        expect = "refuse"
    return Mutant(st_join(jdump(rebuild(new_meta)), body), desc, expect, "metadata")


# ---- compressor state: compress_rankNNNNN.safetensors and its signature in state.safetensors ---

COMPRESS_FILE = "compress_rank00000.safetensors"
# settings of other runs, as they read in a signature (whichever of them this one holds)
SIGNATURE_SWAPS = [("/r2/", "/r4/"), (" dp=2 ", " dp=1 "), ("micro=2x16", "micro=4x16"),
                   ("=powersgd/", "=topk/"), ("/ef1/", "/ef0/"), ("stages=0-2", "stages=0-1,1-2"),
                   ("/lazy1/", "/lazy0/"), ("atall", "at0")]
NONFINITE_F32 = [0x7fc00000, 0xffc00000, 0x7f800001, 0xffffffff, 0x7f800000, 0xff800000]
# the largest finite values, the smallest denormal, -0, 0, 1 and 1e10
FINITE_F32 = [0x7f7fffff, 0xff7fffff, 0x00000001, 0x80000000, 0x00000000, 0x3f800000, 0x501502f9]


def f32_finite(bits):
    return (bits >> 23) & 0xff != 0xff


def f32_text(bits):
    return "%g (0x%08x)" % (struct.unpack("<f", struct.pack("<I", bits))[0], bits)


def first_nonfinite(body):
    """The index of the first non-finite float32 of a payload, or None."""
    for i, bits in enumerate(struct.unpack_from("<%dI" % (len(body) // 4), body)):
        if not f32_finite(bits):
            return i
    return None


def signature_edits(old):
    """Other layouts' and settings' signatures, and near misses of this one (never `old`)."""
    out = [old.replace(a, b, 1) for a, b in SIGNATURE_SWAPS if a in old]
    out += [old + " ", " " + old, old[:-1], old.upper(), old + "\u00e9", "", "x",
            old.replace(" ", "  ", 1)]
    return [v for v in out if v != old]


def signature_desc(old, new):
    """A signature's edit in a few characters: 'at 97: "/r2/" -> "/r4/"'."""
    i = 0
    while i < min(len(old), len(new)) and old[i] == new[i]:
        i += 1
    j = 0
    while j < min(len(old), len(new)) - i and old[-1 - j] == new[-1 - j]:
        j += 1
    return "at %d: %s -> %s" % (i, json.dumps(short(old[i:len(old) - j], 30)),
                                json.dumps(short(new[i:len(new) - j], 30)))


def compress_tensor_rules(path, op, expect):
    """Expectations for generic JSON edits of a compressor file's header: its format, its
    signature (the state file's), its step and its rank (world rank and coordinates) are
    checked, and it holds exactly its compressors' arrays."""
    if len(path) >= 2 and path[0] == "__metadata__":
        if path[1] in ("format", "loom.compress", "step", "rank", "coords"):
            return "refuse"
        return "same" if op == "unknown-key" else expect
    return "refuse" if expect != "same" else "same"


def compress_value_mutant(rng, seed):
    """One float of rank 0's compressor state set to a special value: a non-finite one must be
    refused; any finite one is a legitimate state (it trains differently)."""
    header, body = st_split(seed)
    hlen = len(seed) - len(body)
    name, entry = rng.choice([(k, v) for k, v in jparse(header) if k != "__metadata__"])
    begin, end = dict(entry)["data_offsets"]
    index = rng.randrange((end - begin) // 4)
    bits = rng.choice(NONFINITE_F32 + FINITE_F32)
    data = bytearray(seed)
    at = hlen + begin + 4 * index
    old = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at, bits)
    expect = "refuse" if not f32_finite(bits) else ("same" if bits == old else "any")
    return Mutant(bytes(data), "%s[%d] %s -> %s" % (name, index, f32_text(old), f32_text(bits)),
                  expect, "payload")


def compress_file_mutant(rng, seeds):
    """Whole files: rank 0's missing, the ranks' files exchanged, a file no rank reads."""
    op = rng.choice(["remove", "rank1-to-rank0", "rank0-to-rank1", "rank2"])
    if op == "remove":
        return Mutant(None, "%s removed" % COMPRESS_FILE, "refuse", "file", COMPRESS_FILE)
    if op == "rank1-to-rank0":  # the same names and shapes, but it records rank 1
        return Mutant(seeds["compress-rank1"], "rank 1's compressor file in rank 0's place",
                      "refuse", "payload", COMPRESS_FILE)
    if op == "rank0-to-rank1":
        return Mutant(seeds["compress"], "rank 0's compressor file in rank 1's place", "refuse",
                      "payload", "compress_rank00001.safetensors")
    return Mutant(seeds["compress"], "a compress_rank00002.safetensors that no rank reads", "same",
                  "file", "compress_rank00002.safetensors")


def state_compress_mutant(rng, seed):
    """The signature in state.safetensors: another one, or none, leaves the compressor files
    unread, with one warning ("warn"); a value that is not a string, or too long, is refused."""
    where, file, key = "metadata", "state.safetensors", "loom.compress"
    header, body = st_split(seed)
    doc = jparse(header)
    meta = dict(doc)["__metadata__"]
    old = dict(meta)[key]

    def with_meta(new_meta):
        return st_join(jdump(Obj((k, new_meta if k == "__metadata__" else v) for k, v in doc)),
                       body)

    def with_value(new):
        return with_meta(Obj((k, new if k == key else v) for k, v in meta))

    op = rng.choice(["other", "other", "other", "delete", "rename", "long", "not-string", "nul",
                     "duplicate"])
    if op == "other":
        new = rng.choice(signature_edits(old))
        return Mutant(with_value(new), "state.safetensors: metadata loom.compress " +
                      signature_desc(old, new), "warn", where, file)
    if op == "delete":
        return Mutant(with_meta(Obj((k, v) for k, v in meta if k != key)),
                      "state.safetensors: metadata loom.compress deleted", "warn", where, file)
    if op == "rename":
        new_key = rng.choice(["LOOM.COMPRESS", "loom.compress ", "loom.compres", "compress"])
        return Mutant(with_meta(Obj((new_key if k == key else k, v) for k, v in meta)),
                      "state.safetensors: metadata loom.compress renamed %s" % json.dumps(new_key),
                      "warn", where, file)
    if op == "long":  # the state keeps at most 511 characters
        n = rng.choice([511, 512, 600, 5000])
        new = rng.choice(["a" * n, (old + "x" * n)[:n]])
        return Mutant(with_value(new), "state.safetensors: metadata loom.compress: %d characters"
                      % n, "warn" if n <= 511 else "refuse", where, file)
    if op == "not-string":
        new = rng.choice([1, 1.5, None, True, [old], Obj()])
        return Mutant(with_value(new), "state.safetensors: metadata loom.compress -> %s" %
                      short(jdump(new), 30), "refuse", where, file)
    if op == "nul":  # read as a C string, it would be the run's own signature
        return Mutant(with_value(Raw(json.dumps(old)[:-1] + "\\u0000\"")),
                      "state.safetensors: metadata loom.compress + \\u0000", "refuse", where, file)
    text = jdump(Obj((k, meta if k == "__metadata__" else v) for k, v in doc))
    entry = json.dumps(key) + ":" + json.dumps(old)
    second = json.dumps(key) + ":" + json.dumps(rng.choice([old] + signature_edits(old)))
    text = text.replace(entry, entry + "," + second, 1)
    return Mutant(st_join(text, body), "state.safetensors: metadata loom.compress given twice",
                  "refuse", where, file)


def compress_mutant(rng, seeds):
    seed = seeds["compress"]
    r = rng.random()
    if r < 0.25:
        return state_compress_mutant(rng, seeds["compress-state"])
    if r < 0.32:
        return compress_file_mutant(rng, seeds)
    if r < 0.45:
        return compress_value_mutant(rng, seed)
    m = safetensors_mutant(rng, seed, "compress")
    # a payload edit (the header untouched) that made a value non-finite must be refused
    hlen = len(seed) - len(st_split(seed)[1])
    if m.data is not None and len(m.data) == len(seed) and m.data[:hlen] == seed[:hlen] and \
            m.data != seed and first_nonfinite(m.data[hlen:]) is not None:
        m.expect = "refuse"
    return m


def text_json_mutant(rng, seed, rules, indent):
    text = seed.decode()
    if rng.random() < 0.3:
        def classify(changed, resized):
            return "any", "JSON text"

        m = byte_op(rng, seed, {"header": (0, len(seed))}, classify)
        if m.op.startswith("truncate"):
            m.expect = "same" if m.data.strip() == seed.strip() else "refuse"
        elif m.op.startswith("extend"):
            m.expect = "same" if m.data.strip() == seed.strip() else "refuse"
        return m
    doc = jparse(text)
    desc, expect = json_edit(rng, doc, rules)
    return Mutant((jdump(doc, indent) + "\n").encode(), desc, expect, "JSON")


def config_rules(path, op, expect):
    if op == "delete":
        return "any"  # the default applies
    return expect


def plan_rules(path, op, expect):
    if op == "delete" and path and path[0] == "predicted":
        return "same" if len(path) == 1 else "any"
    if path and path[0] == "predicted" and expect == "any":
        return "same" if op != "huge" else "any"
    return expect


# keys a cluster description cannot do without (where they appear: "name" at the top and in
# node.device); the others (source, sources, collectives, compressors, a precision's peak, a
# method's throughput) may be left out
CLUSTER_REQUIRED = {"name", "nodes", "max_nodes", "node", "devices", "device", "memory_bytes",
                    "peak_flops", "memory_bandwidth", "gemm_efficiency", "links", "intra_node",
                    "inter_node", "bandwidth", "latency_s", "flops", "efficiency", "op", "link",
                    "ranks", "alpha_s", "beta_s_per_byte"}


def cluster_rules(path, op, expect):
    """Expectations for edits of a cluster description: "source" and "sources" are free text
    nobody reads (any string, any key under "sources"); a required key deleted is refused."""
    free = [i for i, p in enumerate(path) if p in ("source", "sources")]
    if free:
        i = free[0]
        inside = len(path) > i + 1  # below "sources": one text of the object
        if op in ("duplicate",) or (op == "rename" and not inside):
            return "refuse"
        if op == "unknown-key":
            return "any"  # a new text under "sources" (refused if its value is not a string)
        if op in ("delete", "rename") or expect == "any":
            return "same"  # any string is fine, and nothing reads it
        return expect
    if op == "delete" and path and path[-1] in CLUSTER_REQUIRED and \
            (len(path) < 2 or path[-2] not in ("peak_flops", "compressors")):
        return "refuse"
    return expect


def cluster_seed():
    """clusters/dgx-a100.json with one collective fit and two compressor throughputs added."""
    try:
        doc = jparse(read_text(CLUSTER_SEED))
    except ValueError:
        doc = None
    if not isinstance(doc, Obj):
        raise SystemExit("fuzz.py: %s is missing or not a JSON object" % CLUSTER_SEED)
    doc.append(("collectives", [Obj([("op", "allreduce"), ("link", "inter_node"), ("ranks", 16),
                                     ("alpha_s", 3e-05), ("beta_s_per_byte", 4.5e-11)])]))
    doc.append(("compressors", Obj([("powersgd", 2200000000.0), ("int8", 460000000.0)])))
    return (jdump(doc, 2) + "\n").encode()


# ---- tokenizer files ------------------------------------------------------------------------

TOKENIZER_MERGES = [("t", "h"), ("th", "e"), (" ", "the"), ("e", "r"), (" ", "a"), ("i", "n"),
                    ("o", "n"), (" ", "s"), ("c", "af"), ("a", "f"), ("!", " ")]
TOKENIZER_TEXT = ("the thin cafe\u0301 caf\u00e9! naive \u6771\u4eac 2026 it's they're  \t\n\n"
                  "<|endoftext|>x\u00a0y \U0001f642 \x7f end ")
# which files a tokenizer variant reads (mutated one at a time)
TOKENIZER_FILES = {"tokenize vocab+merges": ["vocab.json", "merges.txt"],
                   "tokenize tokenizer.json": ["tokenizer.json"],
                   "tokenize --decode .bin": ["gpt2_tokenizer.bin"]}


def tokenizer_seeds():
    """The tiny BPE's files: {name: bytes}."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    sym = {b: chr(c) for b, c in zip(bs, cs)}

    def enc(text):
        return "".join(sym[b] for b in text.encode())

    vocab = [(sym[b], b) for b in range(256)]
    pieces = [bytes([b]) for b in range(256)]
    for i, (a, b) in enumerate(TOKENIZER_MERGES):
        vocab.append((enc(a + b), 256 + i))
        pieces.append((a + b).encode())
    eot = 256 + len(TOKENIZER_MERGES)
    vocab.append(("<|endoftext|>", eot))
    pieces.append(b"<|endoftext|>")
    merges = ["%s %s" % (enc(a), enc(b)) for a, b in TOKENIZER_MERGES]
    tokenizer_json = Obj([
        ("version", "1.0"),
        ("added_tokens", [Obj([("id", eot), ("content", "<|endoftext|>"), ("special", True)])]),
        ("model", Obj([("type", "BPE"), ("vocab", Obj(vocab)), ("merges", merges)]))])
    header = [20240328, 2, len(pieces), eot] + [0] * 252
    binary = struct.pack("<256i", *header) + b"".join(bytes([len(p)]) + p for p in pieces)
    return {"vocab.json": (jdump(Obj(vocab), 1) + "\n").encode(),
            "merges.txt": ("#version: 0.2\n" + "\n".join(merges) + "\n").encode(),
            "tokenizer.json": (jdump(tokenizer_json, 2) + "\n").encode(),
            "gpt2_tokenizer.bin": binary}


def tokenizer_json_rules(path, op, expect):
    """vocab.json and tokenizer.json: a renamed or deleted token is a legitimate vocabulary (or
    refused when it breaks the bytes or a merge); tokenizer.json's other keys are not read."""
    if op in ("rename", "delete", "unknown-key"):
        return "any"
    return expect


def merges_mutant(rng, seed):
    """Line edits of merges.txt: drop, swap, repeat, a third symbol, an unknown symbol, an empty
    line, no #version line; else a byte-level operator."""
    lines = seed.decode().split("\n")
    body = list(range(1, len(lines) - 1))
    op = rng.choice(["drop", "swap", "repeat", "three", "unknown", "blank", "no-version",
                     "bytes", "bytes"])
    i, j = rng.choice(body), rng.choice(body)
    expect = "any"
    if op == "drop":
        del lines[i]
    elif op == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "repeat":
        lines.insert(j, lines[i])
    elif op == "three":
        lines[i] += " x"
        expect = "refuse"
    elif op == "unknown":
        lines[i] = "zz " + lines[i].split(" ")[-1]
        expect = "refuse"
    elif op == "blank":
        lines.insert(i, "")
    elif op == "no-version":
        del lines[0]
    else:
        def classify(changed, resized):
            return "any", "tokenizer"

        m = byte_op(rng, seed, {"header": (0, len(seed))}, classify)
        m.file = "merges.txt"
        return m
    return Mutant("\n".join(lines).encode(), "merges.txt: %s line %d" % (op, i), expect,
                  "tokenizer", "merges.txt")


def tokenizer_mutant(rng, seeds, variant):
    """One of the variant's files, mutated."""
    name = rng.choice(TOKENIZER_FILES[variant])
    seed = seeds[name]
    if name == "merges.txt":
        return merges_mutant(rng, seed)
    if name == "gpt2_tokenizer.bin":
        def classify(changed, resized):  # past the 1024-byte header: a token's bytes or length
            return "any", "payload" if changed and min(changed) >= 1024 else "header"

        if rng.random() < 0.4:
            m = slot_op(rng, seed, [0, 1, 2, 3], classify)[0]
        else:
            m = byte_op(rng, seed, {"header": (0, len(seed))}, classify)
    else:
        m = text_json_mutant(rng, seed, tokenizer_json_rules, 1 if name == "vocab.json" else 2)
        m.where = "tokenizer"
    m.file, m.op = name, name + ": " + m.op
    return m


# ---- the seeds ------------------------------------------------------------------------------

def lcg_text(words, count, seed=7):
    out = []
    for i in range(count):
        seed = (seed * 1103515245 + 12345) % 2147483648
        out.append(words[(seed >> 8) % len(words)])
        if i % 10 == 9:
            out.append("\n")
    return " ".join(out)


def write_llmc(path):
    s = TINY_SHAPE
    header = [20240326, 3, s["maxT"], s["V"], s["L"], s["NH"], s["C"], s["Vp"]] + [0] * 248
    count = llmc_param_count(**s)
    rng = random.Random(11)
    params = [rng.gauss(0.0, 0.2) for _ in range(count)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%df" % count, *params))


CONFIG = Obj([
    ("model", "tiny"), ("layers", 2), ("heads", 2), ("d_model", 16), ("context", 16),
    ("vocab", 257), ("data", "data/train_*.bin"), ("val_data", "data/val_*.bin"), ("steps", 2),
    ("micro_batch_size", 2), ("seq_len", 16), ("global_batch_size", 2), ("lr", 0.001),
    ("lr_schedule", "cosine"), ("min_lr_ratio", 0.1), ("warmup_steps", 1),
    ("weight_decay", 0.1), ("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-08), ("grad_clip", 1.0),
    ("max_bad_steps", 5), ("seed", 1337), ("threads", 1), ("save_every", 0),
    ("eval_every", 2), ("eval_batches", 1), ("log_every", 1), ("no_save", False),
    ("recompute", False), ("schedule", "1f1b"), ("bucket_mb", 25.0), ("comm_timeout", 60.0),
])


class Harness:
    def __init__(self, args):
        self.loom = os.path.abspath(args.loom)
        self.work = os.path.abspath(args.workdir)
        self.timeout = args.timeout
        self.quiet = args.quiet
        self.seeds_dir = os.path.join(self.work, "seeds")
        self.scratch = os.path.join(self.work, "scratch")
        self.findings = os.path.join(self.work, "findings")
        with open(self.loom, "rb") as f:
            self.sanitized = b"__asan_init" in f.read()
        self.env = dict(os.environ)
        self.env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_THREAD_LIMIT="4")
        asan = self.env.get("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
        # big allocations return NULL (loom must say "out of memory") instead of aborting, and
        # a mutant cannot take the shared machine's memory
        self.env["ASAN_OPTIONS"] = asan + ":allocator_may_return_null=1:malloc_limit_mb=2048" \
            ":hard_rss_limit_mb=3072"
        self.env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        self.baselines = {}
        self.mpirun = shutil.which("mpirun")
        # as tests/CMakeLists.txt's MPI tests: Open MPI as root, cores oversubscribed, idle ranks
        # yielding, Open MPI's own leaks hidden from LeakSanitizer; and Open MPI's own
        # point-to-point layer (ob1), which starts faster than UCX's (preferred where installed).
        self.mpi_env = dict(self.env)
        for k, v in (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                     ("OMPI_MCA_mpi_yield_when_idle", "1"),
                     ("OMPI_MCA_rmaps_base_oversubscribe", "1"), ("OMPI_MCA_pml", "ob1"),
                     ("LSAN_OPTIONS", "suppressions=%s:fast_unwind_on_malloc=0:"
                      "print_suppressions=0" % os.path.join(os.path.dirname(
                          os.path.abspath(__file__)), "lsan.supp"))):
            self.mpi_env.setdefault(k, v)
        # mutants: a rank's non-zero exit leaves the others running to their own end, each
        # status kept by RANK_STATUS_SH (a rank left waiting for a peer that is gone ends itself:
        # loom's liveness pings, which --comm-timeout 8 makes answer within the fuzzer's timeout)
        self.mpi_mutant_env = dict(self.mpi_env, OMPI_MCA_orte_abort_on_non_zero_status="0")

    # -- running one command --

    def limit_memory(self):
        if not self.sanitized:  # ASan's shadow memory cannot live under an address-space limit
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    def run(self, argv, cwd, train, env=None):
        out_path, err_path = os.path.join(cwd, "stdout.txt"), os.path.join(cwd, "stderr.txt")
        metrics = os.path.join(cwd, "run", "metrics.jsonl")
        start = time.time()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, env=env or self.env,
                                    start_new_session=True, preexec_fn=self.limit_memory)
            status, rc = None, None
            while True:
                try:
                    rc = proc.wait(timeout=0.05 if time.time() - start < 1 else 0.25)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if train and count_lines(metrics) > SLOW_STEPS:
                    status = "slow"
                elif time.time() - start > self.timeout:
                    # a training mutant still computing its first step (a huge batch, under the
                    # sanitizers ten times slower) is slow, not hung: it keeps a core busy
                    busy = session_cpu_s(proc.pid) > 0.5 * (time.time() - start)
                    status = "slow" if train and busy else "hang"
                    if status == "hang":
                        self.stack_of_hang(proc.pid, cwd)
                if status:
                    kill_session(proc.pid)
                    rc = proc.wait()
                    break
        with open(out_path, "rb") as f:
            stdout = f.read().decode(errors="replace")
        with open(err_path, "rb") as f:
            stderr = f.read().decode(errors="replace")
        return status, rc, stdout, stderr, time.time() - start

    def stack_of_hang(self, pid, cwd):
        """Every loom process's stacks (under mpirun, the ranks')."""
        if not shutil.which("gdb"):
            return
        pids = [p for p in session_pids(pid) if exe_of(p) == os.path.realpath(self.loom)] or [pid]
        try:
            with open(os.path.join(cwd, "hang_stack.txt"), "wb") as f:
                for p in pids:
                    f.write(b"== process %d\n" % p)
                    f.flush()
                    subprocess.run(["gdb", "-p", str(p), "-batch", "-ex", "thread apply all bt"],
                                   stdout=f, stderr=subprocess.STDOUT, timeout=30)
        except (subprocess.SubprocessError, OSError):
            pass

    def classify(self, status, rc, stderr, train, cwd):
        if status == "hang" and train and count_lines(os.path.join(cwd, "run", "metrics.jsonl")):
            status = "slow"
        if status:
            return status, ""
        if RSS_LIMIT.search(stderr):
            return "failed", "out of memory (sanitizer limit)"
        if SANITIZER.search(stderr) or rc < 0 or rc >= 128 or rc not in (0, 1, 2):
            m = SANITIZER.search(stderr)
            return "crash", (m.group(0) if m else "exit %d" % rc)
        return {0: "accepted", 1: "failed", 2: "refused"}[rc], ""

    def fingerprint(self, kind, cwd, stdout):
        if kind == "stdout":
            return stdout
        if kind == "check":  # a plan's predictions are printed, and change nothing it runs
            return "".join(l for l in stdout.splitlines(True) if not l.startswith("predicted"))
        records = []
        for line in read_text(os.path.join(cwd, "run", "metrics.jsonl")).splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                records.append(line)
                continue
            records.append({k: r.get(k) for k in ("step", "loss", "lr", "grad_norm", "skipped",
                                                   "val_loss") if k in r})
        model = ""
        latest = read_text(os.path.join(cwd, "run", "checkpoints", "latest")).strip()
        if latest:
            path = os.path.join(cwd, "run", "checkpoints", latest, "model.safetensors")
            model = latest + ":" + hashlib.sha256(read_bytes(path)).hexdigest()
        return json.dumps({"metrics": records, "model": model}, sort_keys=True)

    # -- seeds --

    def make_seeds(self, formats):
        s = self.seeds_dir
        marker = os.path.join(self.work, ".loom-fuzz")
        if os.path.isdir(self.work) and os.listdir(self.work) and not os.path.exists(marker):
            raise SystemExit("fuzz.py: %s is not empty and not a fuzz.py folder; not emptying it"
                             % self.work)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(s)
        write(marker, b"made by tests/fuzz.py; emptied by the next run\n")
        words = ("the quick brown fox jumps over a lazy dog and then runs far away into the deep "
                 "forest").split()
        with open(os.path.join(s, "text.txt"), "w") as f:
            f.write(lcg_text(words, 600))
        self.must([self.loom, "prepare", "--text", "text.txt", "--out", "data", "--seq-len", "16"])
        self.must([self.loom, "train", "--model", "tiny"] + TINY +
                  ["--data", "data/train_*.bin", "--steps", "1", "--out", "seedrun",
                   "--eval-every", "0", "--log-every", "1"])
        self.must([self.loom, "plan", "--model", "tiny", "--recompute-always", "--out",
                   "plan0.json"])  # "recompute": "always", and mesh.zero as the planner writes it
        plan = jparse(read_text(os.path.join(s, "plan0.json")))
        plan.append(("predicted", Obj([("seq_len", 16), ("step_s", 0.25), ("tokens_per_s", 512.0),
                                       ("peak_bytes_per_rank", [104857600])])))
        write(os.path.join(s, "plan.json"), (jdump(plan, 2) + "\n").encode())
        write(os.path.join(s, "config.json"), (jdump(CONFIG, 2) + "\n").encode())
        write_llmc(os.path.join(s, "model.bin"))
        self.tokenizer_files = tokenizer_seeds()
        write(os.path.join(s, "tok_text.txt"), TOKENIZER_TEXT.encode())
        write(os.path.join(s, "tok_ids.txt"),
              " ".join(str(i) for i in range(257 + len(TOKENIZER_MERGES))).encode())
        if "compress" in formats:  # 2 ranks, data-parallel PowerSGD, saved at step 2
            self.must([self.mpirun, "-np", "2", self.loom, "train"] + COMPRESS_RUN +
                      ["--steps", "2", "--out", "crun", "--eval-every", "0", "--log-every", "1"],
                      unchecked(self.mpi_env))
        step = os.path.join(s, "seedrun", "checkpoints", "step_00000001")
        cstep = os.path.join(s, "crun", "checkpoints", "step_00000002")
        self.seed_bytes = {
            "shard": read_bytes(os.path.join(s, "data", "train_000000.bin")),
            "llmc": read_bytes(os.path.join(s, "model.bin")),
            "model": read_bytes(os.path.join(step, "model.safetensors")),
            "state": read_bytes(os.path.join(step, "state.safetensors")),
            "config": read_bytes(os.path.join(s, "config.json")),
            "plan": read_bytes(os.path.join(s, "plan.json")),
            "cluster": cluster_seed(),
            "tokenizer": self.tokenizer_files["vocab.json"],
            "compress": read_bytes(os.path.join(cstep, COMPRESS_FILE)),
            "compress-rank1": read_bytes(os.path.join(cstep, "compress_rank00001.safetensors")),
            "compress-state": read_bytes(os.path.join(cstep, "state.safetensors")),
        }
        # the structured editors re-encode a header: without an edit it must be the same file
        for name in ("model", "state") + (("compress", "compress-state")
                                          if "compress" in formats else ()):
            header, body = st_split(self.seed_bytes[name])
            if st_join(jdump(jparse(header)), body) != self.seed_bytes[name]:
                raise SystemExit("fuzz.py: re-encoding the %s header changes it" % name)

    def must(self, argv, env=None):
        p = subprocess.run(argv, cwd=self.seeds_dir, env=env or self.env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        if p.returncode != 0:
            sys.stdout.write(p.stdout.decode(errors="replace"))
            raise SystemExit("fuzz.py: making the seeds failed: %s" % " ".join(argv))

    # -- commands per format: (variant, setup(cwd, data, file) -> argument, command(argument) ->
    #    argv, fingerprint kind[, environment]); file: the Mutant's --

    def variants(self, fmt):
        seeds = self.seeds_dir
        data = ["--data", "data/train_*.bin"]
        seedrun = os.path.join(seeds, "seedrun")

        def put(name):
            def setup(cwd, blob, file):
                write(os.path.join(cwd, name), blob)
                return name
            return setup

        def run_dir(mutated):
            def setup(cwd, blob, file):
                src = os.path.join(seedrun, "checkpoints", "step_00000001")
                dst = os.path.join(cwd, "mrun", "checkpoints", "step_00000001")
                os.makedirs(dst)
                for f in ("model.safetensors", "state.safetensors"):
                    if f != mutated:
                        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
                write(os.path.join(dst, mutated), blob)
                write(os.path.join(cwd, "mrun", "checkpoints", "latest"), b"step_00000001\n")
                return "mrun"
            return setup

        def compress_step(cwd, blob, file):
            """The compressed run's step folder, one file replaced (None: removed)."""
            write(os.path.join(cwd, "rank_status.sh"), RANK_STATUS_SH.encode())
            dst = os.path.join(cwd, "mrun", "checkpoints", "step_00000002")
            shutil.copytree(os.path.join(seeds, "crun", "checkpoints", "step_00000002"), dst)
            path = os.path.join(dst, file or COMPRESS_FILE)
            if blob is None:
                os.remove(path)
            else:
                write(path, blob)
            return os.path.join("mrun", "checkpoints", "step_00000002")

        train = [self.loom, "train"]
        tiny = ["--model", "tiny"] + TINY

        def sample_checkpoint(m):
            return [self.loom, "sample", "--checkpoint", m, "--tokens", "8", "--seed", "3",
                    "--threads", "1", "--prompt", "the"]

        def eval_checkpoint(m):
            return [self.loom, "eval", "--checkpoint", m, "--data", "data/val_*.bin", "--threads",
                    "1", "--max-windows", "8"]

        def tokenizer_dir(variant):
            def setup(cwd, blob, file):
                os.makedirs(os.path.join(cwd, "tok"))
                for name in TOKENIZER_FILES[variant]:
                    data = blob if name == (file or "vocab.json") else self.tokenizer_files[name]
                    write(os.path.join(cwd, "tok", name), data)
                for name in ("tok_text.txt", "tok_ids.txt"):
                    shutil.copyfile(os.path.join(seeds, name), os.path.join(cwd, name))
                return "tok"
            return setup

        # encode the text, print the ids, decode them (a signal or a sanitizer report of either
        # run is the result); the llm.c file decodes every id
        encode_decode = ('"$0" tokenize --tokenizer "$1" <tok_text.txt >ids.txt || exit $?; '
                         'cat ids.txt; exec "$0" tokenize --decode --tokenizer "$1" <ids.txt')
        decode_all = 'exec "$0" tokenize --decode --tokenizer "$1" <tok_ids.txt'

        table = {
            "tokenizer": [
                ("tokenize vocab+merges", tokenizer_dir("tokenize vocab+merges"),
                 lambda m: ["sh", "-c", encode_decode, self.loom, m], "stdout"),
                ("tokenize tokenizer.json", tokenizer_dir("tokenize tokenizer.json"),
                 lambda m: ["sh", "-c", encode_decode, self.loom, m], "stdout"),
                ("tokenize --decode .bin", tokenizer_dir("tokenize --decode .bin"),
                 lambda m: ["sh", "-c", decode_all, self.loom, m], "stdout"),
            ],
            "shard": [
                ("train --data", put("m.bin"),
                 lambda m: train + tiny + ["--data", m, "--steps", "2"] + RUN_FLAGS, "train"),
                ("train --val-data", put("m.bin"),
                 lambda m: train + tiny + data + ["--val-data", m, "--steps", "1"] + RUN_FLAGS +
                 ["--eval-every", "1", "--eval-batches", "2"], "train"),
                ("eval --data", put("m.bin"),
                 lambda m: [self.loom, "eval", "--checkpoint", seedrun, "--data", m, "--threads",
                            "1", "--max-windows", "16"], "stdout"),
            ],
            "llmc": [
                ("train --init-from", put("m.bin"),
                 lambda m: train + TINY + data + ["--init-from", m, "--steps", "2"] + RUN_FLAGS,
                 "train"),
                ("sample --checkpoint", put("m.bin"), sample_checkpoint, "stdout"),
                ("eval --checkpoint", put("m.bin"), eval_checkpoint, "stdout"),
            ],
            "model": [
                ("train --init-from", put("m.safetensors"),
                 lambda m: train + TINY + data + ["--init-from", m, "--steps", "2"] + RUN_FLAGS,
                 "train"),
                ("train --resume", run_dir("model.safetensors"),
                 lambda m: train + TINY + data + ["--resume", m, "--steps", "2"] + RUN_FLAGS,
                 "train"),
                ("sample --checkpoint", put("m.safetensors"), sample_checkpoint, "stdout"),
                ("eval --checkpoint", put("m.safetensors"), eval_checkpoint, "stdout"),
            ],
            "state": [
                ("train --resume", run_dir("state.safetensors"),
                 lambda m: train + TINY + data + ["--resume", m, "--steps", "3"] + RUN_FLAGS,
                 "train"),
            ],
            "config": [
                ("train --config", put("m.json"),
                 lambda m: train + ["--config", m, "--out", "run"], "train"),
            ],
            "compress": [
                ("mpirun train --resume", compress_step,
                 lambda m: [self.mpirun or "mpirun", "-np", "2", "sh", "rank_status.sh", self.loom,
                            "train"] + COMPRESS_RUN + ["--resume", m, "--steps", "3",
                                                       "--comm-timeout", "8"] + RUN_FLAGS,
                 "train", self.mpi_mutant_env),
            ],
            "plan": [
                ("train --plan", put("m.json"),
                 lambda m: train + ["--plan", m] + data + ["--seq-len", "16", "--steps", "2"] +
                 RUN_FLAGS, "train"),
                ("plan --check", put("m.json"),
                 lambda m: [self.loom, "plan", "--check", m], "check"),
            ],
            "cluster": [
                ("plan --check-cluster", put("m.json"),
                 lambda m: [self.loom, "plan", "--check-cluster", m], "stdout"),
            ],
        }
        return table[fmt]

    def fresh_scratch(self):
        shutil.rmtree(self.scratch, ignore_errors=True)
        os.makedirs(self.scratch)
        os.symlink(os.path.join(self.seeds_dir, "data"), os.path.join(self.scratch, "data"))
        return self.scratch

    def run_case(self, variant, blob, file=None, env=None):
        name, setup, command, kind = variant[:4]
        env = env or (variant[4] if len(variant) > 4 else None)
        cwd = self.fresh_scratch()
        argv = command(setup(cwd, blob, file))
        status, rc, stdout, stderr, secs = self.run(argv, cwd, kind == "train", env)
        rc, disagree = self.rank_status(cwd, rc)
        cls, note = self.classify(status, rc, stderr, kind == "train", cwd)
        if disagree and not status:
            note = (note + "; " if note else "") + disagree
        fp = self.fingerprint(kind, cwd, stdout) if cls == "accepted" else None
        return dict(cls=cls, note=note, rc=rc, secs=secs, argv=argv, stderr=stderr, fp=fp,
                    env=env)

    def rank_status(self, cwd, rc):
        """Under RANK_STATUS_SH: the job's status from every rank's (a crash first, then the
        highest; mpirun's own when it ended the job: MPI_Abort), and a note when ranks disagree."""
        statuses = {}
        for r in range(2):
            text = read_text(os.path.join(cwd, "rank%d.status" % r)).strip()
            statuses[r] = int(text) if text.isdigit() else None
        known = [s for s in statuses.values() if s is not None]
        if not known:
            return rc, ""
        crashes = [s for s in known if s not in (0, 1, 2)]
        if crashes or rc:  # mpirun's non-zero status: it ended the job (MPI_Abort)
            return (crashes or [rc])[0], ""
        if len(set(statuses.values())) > 1:
            return max(known), "ranks disagree: " + ", ".join(
                "rank %d exit %s" % (r, "none" if s is None else s) for r, s in statuses.items())
        return known[0], ""

    def baseline(self, fmt):
        for variant in self.variants(fmt):
            key = (fmt, variant[0])
            if key in self.baselines:
                continue
            env = variant[4] if len(variant) > 4 else None
            if env:  # under mpirun: no leak check (see unchecked)
                env = unchecked(env)
            result = self.run_case(variant, self.seed_bytes[fmt], env=env)
            again = self.run_case(variant, self.seed_bytes[fmt], env=env)
            if result["cls"] != "accepted":
                sys.stdout.write(result["stderr"][-3000:])
                raise SystemExit("fuzz.py: the unmutated %s seed is not accepted by %s (%s)" % (
                    fmt, variant[0], result["cls"]))
            if result["fp"] != again["fp"]:
                raise SystemExit("fuzz.py: two runs of the unmutated %s seed through %s differ: "
                                 "the outcome is not deterministic" % (fmt, variant[0]))
            self.baselines[key] = result["fp"]

    # -- one mutant --

    def mutate(self, fmt, rng, variant):
        seed = self.seed_bytes[fmt]
        if fmt == "tokenizer":
            return tokenizer_mutant(rng, self.tokenizer_files, variant)
        if fmt == "shard":
            return shard_mutant(rng, seed)
        if fmt == "llmc":
            return llmc_mutant(rng, seed)
        if fmt in ("model", "state"):
            return safetensors_mutant(rng, seed, fmt)
        if fmt == "compress":
            return compress_mutant(rng, self.seed_bytes)
        if fmt == "config":
            return text_json_mutant(rng, seed, config_rules, 2)
        if fmt == "cluster":
            return text_json_mutant(rng, seed, cluster_rules, 2)
        return text_json_mutant(rng, seed, plan_rules, 2)

    def keep(self, index, fmt, variant, mutant, result):
        folder = os.path.join(self.findings, "%05d-%s" % (index, fmt))
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(self.scratch, folder, symlinks=True)
        argv = [a.replace(self.scratch, ".") for a in result["argv"]]
        with open(os.path.join(folder, "repro.sh"), "w") as f:
            f.write("#!/bin/sh\n# %s, %s: %s (expected: %s)\n# outcome: %s %s\n" % (
                fmt, variant[0], mutant.op, mutant.expect, result["cls"], result["note"]))
            for k, v in sorted((result["env"] or {}).items()):
                if k.startswith("OMPI_") or k == "LSAN_OPTIONS":
                    f.write("export %s=%s\n" % (k, shell_quote(v)))
            f.write("cd \"$(dirname \"$0\")\" && exec %s\n" % " ".join(shell_quote(a)
                                                                       for a in argv))
        return folder


def review_kind(op):
    """What an operator edited, without the values: 'metadata step', 'lr (times-two)'."""
    name = re.search(r" \(([\w-]+)\)$", op)
    left = op.split(" -> ")[0]
    left = left.rsplit(":", 1)[0] if ":" in left else re.sub(r" -?\d+$", "", left)
    left = re.sub(r"\bh\.\d+\.", "h.N.", left)
    return left + (" (%s)" % name.group(1) if name else "")


def first_message(stderr):
    """loom's first error line that says why (not another rank's "its message says why"), else
    its first error or warning line, for the record."""
    lines = [l for l in stderr.splitlines() if ERROR_LINE.match(l)]
    lines = [l for l in lines if "its message says why" not in l] or lines or \
        [l for l in stderr.splitlines() if WARNING_LINE.match(l)]
    return lines[0] if lines else ""


def crash_report(stderr, frames=8):
    """The sanitizer's first report line and the stack under it (or the last lines)."""
    lines = stderr.splitlines()
    for i, l in enumerate(lines):
        if SANITIZER.search(l):
            out = [l]
            for nxt in lines[i + 1:]:
                if not nxt.strip() and len(out) > 1:
                    break
                if nxt.strip():
                    out.append(nxt)
                if len(out) > frames + 1:
                    break
            return out
    return [l for l in lines if l.strip()][-frames:]


def shell_quote(s):
    return s if re.fullmatch(r"[A-Za-z0-9_./=:,+-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def unchecked(env):
    """The environment without LeakSanitizer: under mpirun it needs the slow unwinder to see Open
    MPI's frames (about 2 s a run). For the compressed seed run and its baselines, which are
    tests/mpi_compression.sh's runs (checked for leaks there); mutants keep the check."""
    return dict(env, ASAN_OPTIONS=env.get("ASAN_OPTIONS", "") + ":detect_leaks=0")


def session_pids(sid):
    """The processes of a session (Linux): mpirun puts each rank in a process group of its own."""
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # state, ppid, pgrp, session, ...
        if len(fields) > 3 and fields[3] == str(sid):
            pids.append(int(entry))
    return pids


def session_cpu_s(sid):
    """CPU seconds (user + system) the processes of a session have used so far (Linux)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in session_pids(sid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # state is field 3; utime, stime 14, 15
        if len(fields) > 12:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def kill_session(sid):
    """SIGKILL a command started in a session of its own: its process group, then whatever else
    is left in the session (the ranks under mpirun)."""
    for pid in [sid] + [p for p in session_pids(sid) if p != sid]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


def exe_of(pid):
    return os.path.realpath("/proc/%d/exe" % pid)


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def write(path, blob):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(blob)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("loom")
    ap.add_argument("workdir")
    ap.add_argument("--count", type=int, default=150)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--strict", action="store_true", help="also fail on suspicious mutants")
    ap.add_argument("--quiet", action="store_true", help="no line per mutant")
    ap.add_argument("--limit", default="", metavar="FORMAT=N,...",
                    help="run at most N mutants of FORMAT; its later turns are skipped (the "
                    "other mutants stay the same)")
    args = ap.parse_args()
    formats = args.formats.split(",")
    for f in formats:
        if f not in FORMATS:
            ap.error("unknown format %r (expected some of %s)" % (f, ",".join(FORMATS)))
    limits = {}
    for item in filter(None, args.limit.split(",")):
        f, _, n = item.partition("=")
        if f not in FORMATS or not n.isdigit():
            ap.error("--limit %r: expected FORMAT=N with FORMAT one of %s" % (item, ",".join(
                FORMATS)))
        limits[f] = int(n)
    h = Harness(args)
    if "compress" in formats and not h.mpirun:
        print("fuzz: no mpirun on PATH: the compress format (a 2-rank resume) is skipped")
        formats.remove("compress")
        if not formats:
            print("0 passed, 0 failed")
            return 0
    t0 = time.time()
    h.make_seeds(formats)
    for fmt in formats:
        h.baseline(fmt)
    print("fuzz: %s (%s), seed %d, %d mutants of %s, timeout %g s; seeds and baselines in %.1f s"
          % (h.loom, "sanitized" if h.sanitized else "not sanitized", args.seed, args.count,
             ",".join(formats), args.timeout, time.time() - t0))
    totals = {f: dict.fromkeys(CLASSES, 0) for f in formats}
    bad, suspicious, review, silent, skipped = [], [], [], 0, 0
    log = open(os.path.join(h.work, "results.jsonl"), "w")
    for i in range(args.count):
        fmt = formats[i % len(formats)]
        if fmt in limits and sum(totals[fmt].values()) >= limits[fmt]:
            skipped += 1
            continue
        rng = random.Random("%d/%d" % (args.seed, i))
        variants = h.variants(fmt)
        variant = variants[rng.randrange(len(variants))]
        mutant = h.mutate(fmt, rng, variant[0])
        result = h.run_case(variant, mutant.data, mutant.file)
        cls = result["cls"]
        totals[fmt][cls] += 1
        verdict = ""
        if cls == "refused" and not ERROR_LINE.search(result["stderr"]):
            silent += 1
        if mutant.expect == "warn" and cls in ("refused", "failed"):
            verdict = "SUSPICIOUS: refused a file to be accepted with a warning"
        if cls == "accepted":
            changed = result["fp"] != h.baselines[(fmt, variant[0])]
            warned = WARNING_LINE.search(result["stderr"]) is not None
            if mutant.expect == "warn" and not warned:
                verdict = "SUSPICIOUS: accepted without the warning it needs"
            elif mutant.expect == "refuse":
                verdict = "SUSPICIOUS: accepted a broken file (%s)" % (
                    "outcome changed" if changed else "outcome unchanged")
            elif mutant.expect == "same" and changed and not warned:
                verdict = "SUSPICIOUS: an edit that should not matter changed the outcome"
            elif changed and mutant.where not in ("payload",) and not warned:
                verdict = "REVIEW: accepted, outcome changed"
        if "ranks disagree" in result["note"] and not verdict.startswith("SUSPICIOUS"):
            verdict = "SUSPICIOUS: the ranks ended differently"
        line = "%5d %-8s %-22s %-8s %-6s %s" % (i, fmt, variant[0], cls, mutant.expect,
                                                short(mutant.op, 90))
        if result["note"]:
            line += "  [%s]" % result["note"]
        if verdict:
            line += "  <- " + verdict
        record = dict(index=i, format=fmt, command=variant[0], op=mutant.op,
                      expect=mutant.expect, where=mutant.where, cls=cls, rc=result["rc"],
                      note=result["note"], verdict=verdict, secs=round(result["secs"], 2),
                      message=first_message(result["stderr"]))
        if cls in ("crash", "hang") or verdict.startswith("SUSPICIOUS"):
            record["kept"] = h.keep(i, fmt, variant, mutant, result)
            line += "\n      kept: %s" % record["kept"]
            if cls == "crash":
                line += "".join("\n      | " + l for l in crash_report(result["stderr"]))
        if cls in ("crash", "hang"):
            bad.append(line)
        elif verdict.startswith("SUSPICIOUS"):
            suspicious.append(line)
        elif verdict:
            review.append((fmt, mutant.op, i))
        log.write(json.dumps(record) + "\n")
        if not args.quiet or cls in ("crash", "hang") or verdict:
            print(line, flush=True)
    log.close()
    print("\n%-8s %8s %8s %8s %8s %8s %8s %8s" % (("format", "exit 2", "exit 0", "exit 1") +
                                                   ("crash", "hang", "slow", "total")))
    grand = dict.fromkeys(CLASSES, 0)
    for f in formats:
        t = totals[f]
        for c in CLASSES:
            grand[c] += t[c]
        print("%-8s %8d %8d %8d %8d %8d %8d %8d" % ((f,) + tuple(t[c] for c in CLASSES) +
                                                     (sum(t.values()),)))
    print("%-8s %8d %8d %8d %8d %8d %8d %8d" % (("all",) + tuple(grand[c] for c in CLASSES) +
                                                 (sum(grand.values()),)))
    print("suspicious accepted: %d; accepted with a changed outcome, for review: %d; refused "
          "without an 'error: ' line: %d; %.0f s" % (len(suspicious), len(review), silent,
                                                     time.time() - t0))
    if skipped:
        print("skipped (--limit %s): %d mutants" % (args.limit, skipped))
    for title, lines in (("crashes and hangs", bad), ("suspicious", suspicious)):
        if lines:
            print("\n%s:" % title)
            for l in lines:
                print(l)
    if review:
        print("\nfor review (accepted, outcome changed, no warning), by kind:")
        kinds = {}
        for fmt, op, index in review:
            kinds.setdefault((fmt, review_kind(op)), []).append(index)
        for (fmt, kind), indices in sorted(kinds.items()):
            print("  %4d  %-8s %s  (e.g. #%d)" % (len(indices), fmt, kind, indices[0]))
    failed = len(bad) + (len(suspicious) if args.strict else 0)
    print("%d passed, %d failed" % (args.count - skipped - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
