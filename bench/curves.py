#!/usr/bin/env python3
"""Validation-loss curves of several runs in one SVG (no plotting library needed).

usage: python3 bench/curves.py [--from-step N] OUT.svg "TITLE" NAME=RUN_DIR [NAME=RUN_DIR ...]

Each RUN_DIR's metrics.jsonl gives the curve: its records with "val_loss", against "step" (from
step N on: the early steps' losses would squeeze the later differences). Runs without any are
left out (and named on stderr). The y axis spans every curve's values.
"""
import json
import os
import sys

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"]


def curve(run_dir, first_step):
    points = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("val_loss") is not None and rec["step"] >= first_step:
                points.append((rec["step"], rec["val_loss"]))
    return points


def main(argv):
    first_step = 0
    if len(argv) > 2 and argv[1] == "--from-step":
        first_step = int(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) < 4:
        sys.exit(__doc__)
    out, title = argv[1], argv[2]
    curves = []
    for arg in argv[3:]:
        name, _, run_dir = arg.partition("=")
        try:
            points = curve(run_dir, first_step)
        except OSError as e:
            print(f"curves.py: {name}: {e}", file=sys.stderr)
            continue
        if points:
            curves.append((name, points))
        else:
            print(f"curves.py: {name}: no validation loss in {run_dir}", file=sys.stderr)
    if not curves:
        sys.exit("curves.py: no curve to draw")
    width, height, left, bottom, legend = 900, 520, 60, 40, 230
    steps = [s for _, pts in curves for s, _ in pts]
    losses = [v for _, pts in curves for _, v in pts]
    lo_s, hi_s, lo_v, hi_v = min(steps), max(steps), min(losses), max(losses)

    def x(s):
        return left + (width - left - legend) * (s - lo_s) / ((hi_s - lo_s) or 1)

    def y(v):
        return height - bottom - (height - bottom - 24) * (v - lo_v) / ((hi_v - lo_v) or 1)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="14">{title}</text>',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - legend}" '
           f'y2="{height - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="24" x2="{left}" y2="{height - bottom}" stroke="black"/>',
           f'<text x="{(width - legend) / 2:.0f}" y="{height - 6}">step</text>']
    for t in range(6):
        v = lo_v + (hi_v - lo_v) * t / 5
        s = lo_s + (hi_s - lo_s) * t / 5
        svg.append(f'<text x="4" y="{y(v) + 4:.1f}">{v:.3f}</text>')
        svg.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{width - legend}" y2="{y(v):.1f}" '
                   f'stroke="#eee"/>')
        svg.append(f'<text x="{x(s) - 10:.1f}" y="{height - bottom + 16}">{s:.0f}</text>')
    for i, (name, pts) in enumerate(curves):
        color = PALETTE[i % len(PALETTE)]
        line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in pts)
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{line}"/>')
        svg.append(f'<text x="{width - legend + 10}" y="{34 + 16 * i}" fill="{color}">'
                   f'{name} ({pts[-1][1]:.4f})</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"curves: {out} ({len(curves)} runs)")


if __name__ == "__main__":
    main(sys.argv)
