#!/usr/bin/env python3
"""The import graph between loom's modules: every module may include only modules below it.

A module is a folder of src/ together with its public header include/loom/<module>.h. An
include of "loom/X.h" or "X/..." from a file of module M is an edge M -> X. The order below is
DESIGN's (docs/design.md, "Layout"): a module imports only modules listed before it, so there
is no edge upward and no circle between folders. Prints every offending include and exits 1.
"""
import glob
import os
import re
import sys

# lowest first
LAYERS = ["base", "ops", "comm", "trace", "compress", "model", "data", "io", "plan",
          "parallel", "cluster", "planner", "train", "cli"]

def module_of(path):
    parts = path.split(os.sep)
    if parts[0] == "include":
        return os.path.splitext(parts[2])[0]
    return parts[1]

def main(root):
    os.chdir(root)
    files = glob.glob("src/**/*.[ch]", recursive=True) + glob.glob("include/loom/*.h")
    rank = {m: i for i, m in enumerate(LAYERS)}
    bad, edges = [], set()
    for f in sorted(files):
        mod = module_of(f)
        if mod not in rank:
            bad.append(f"{f}: module '{mod}' is not in the layer list of {sys.argv[0]}")
            continue
        for n, line in enumerate(open(f, encoding="utf-8"), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            inc = m.group(1)
            if inc.startswith("loom/"):
                dep = os.path.splitext(inc[5:])[0]
            elif "/" in inc:
                dep = inc.split("/")[0]
            else:
                continue  # the module's own private header
            if dep == mod:
                continue
            if dep not in rank:
                bad.append(f"{f}:{n}: includes \"{inc}\" of unknown module '{dep}'")
            elif rank[dep] > rank[mod]:
                bad.append(f"{f}:{n}: {mod} includes \"{inc}\": {dep} stands above {mod}")
            else:
                edges.add((mod, dep))
    for b in bad:
        print(b)
    print(f"{len(edges)} module edges, all downward; {len(bad)} upward or unknown")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
