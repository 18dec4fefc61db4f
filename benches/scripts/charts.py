#!/usr/bin/env python3
"""Draws the comparison charts of BENCHMARKS.md as SVG, from the raw results.

    python3 benches/scripts/charts.py [RESULTS_DIR] [CHARTS_DIR]

Reads every `*.txt` under RESULTS_DIR (default benches/results): lines of
`<group> <side> <round> <value>` as the scripts write them with OUT=file (e2e.sh: group
`http`, requests per second, and `http_cpu`, server µs per request; callgrind.sh: `check_instructions_<keys>`; e2e_instructions.sh:
`http_instructions`; redis_cpu.sh: `redis_cpu`, Redis µs per decision;
redis_instructions.sh: `redis_instructions`), other lines ignored. Per group, one horizontal bar chart: each side's median
across rounds, a whisker from min to max, and the median's ratio to the group's reference
side (`bare` for the HTTP groups, `rlf_fixed` for the Redis ones, `governor` for the direct check). Writes CHARTS_DIR/<file stem>.svg (default
benches/charts). No dependencies beyond the standard library.
"""

import os
import statistics
import sys
from collections import OrderedDict
from xml.sax.saxutils import escape

GROUPS = {
    "check_instructions_1": {"title": "Limiter::check on the memory store, 1 key: instructions per check (callgrind)",
                             "unit": "instr", "reference": "governor", "higher_is_better": False,
                             "rounds": "runs (counts do not depend on load)"},
    "check_instructions_10000": {"title": "Limiter::check on the memory store, 10 000 keys: instructions per check (callgrind)",
                                 "unit": "instr", "reference": "governor", "higher_is_better": False,
                                 "rounds": "runs (counts do not depend on load)"},
    "http": {"title": "axum hello-world, requests/s (server on core 0, wrk on core 1)",
             "unit": "req/s", "reference": "bare", "higher_is_better": True},
    "http_instructions": {"title": "axum hello-world, instructions per request (connection task, callgrind)",
                          "unit": "instr", "reference": "bare", "higher_is_better": False},
    "http_cpu": {"title": "axum hello-world, server CPU per request (user + system, /proc)",
                 "unit": "µs", "reference": "bare", "higher_is_better": False},
    "redis_instructions": {"title": "Redis instructions per uncoalesced decision (callgrind of redis-server)",
                           "unit": "instr", "reference": "rlf_fixed", "higher_is_better": False},
    "redis_cpu": {"title": "Redis CPU per uncoalesced decision (INFO commandstats usec_per_call)",
                  "unit": "µs", "reference": "rlf_fixed", "higher_is_better": False},
}
COLOURS = {"bare": "#888888", "trivial": "#888888"}
PEER = "#d98c2b"
OURS = "#2b6cd9"


def colour(side):
    if side in COLOURS:
        return COLOURS[side]
    if side.startswith(("tower_governor", "rlf", "governor")):
        return PEER
    if side.startswith("before"):
        return "#9db8e8"
    return OURS


def read(path):
    groups = OrderedDict()
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 4 or parts[0] not in GROUPS:
                continue
            group, side, _, value = parts
            try:
                v = float(value)
            except ValueError:
                continue
            groups.setdefault(group, OrderedDict()).setdefault(side, []).append(v)
    return groups


def chart(group, sides, note):
    spec = GROUPS[group]
    rows = [(s, statistics.median(v), min(v), max(v), len(v)) for s, v in sides.items()]
    ref = next((m for s, m, *_ in rows if s == spec["reference"]), None)
    top = max(hi for *_, hi, _ in rows) * 1.08
    label_w, bar_w, row_h, pad = 230, 460, 26, 14
    width = label_w + bar_w + 170
    height = 58 + row_h * len(rows) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{pad}" y="22" font-size="14" font-weight="bold">{escape(spec["title"])}</text>',
           f'<text x="{pad}" y="40" fill="#555">{escape(note)}</text>']
    for i, (side, med, lo, hi, n) in enumerate(rows):
        y = 56 + i * row_h
        x0 = label_w
        w = bar_w * med / top
        out.append(f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end">{escape(side)}</text>')
        out.append(f'<rect x="{x0}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" fill="{colour(side)}"/>')
        wl, wh = x0 + bar_w * lo / top, x0 + bar_w * hi / top
        cy = y + row_h / 2
        out.append(f'<line x1="{wl:.1f}" y1="{cy}" x2="{wh:.1f}" y2="{cy}" stroke="black"/>')
        for wx in (wl, wh):
            out.append(f'<line x1="{wx:.1f}" y1="{cy - 5}" x2="{wx:.1f}" y2="{cy + 5}" stroke="black"/>')
        ratio = f"  {med / ref:.2f}×" if ref else ""
        value = f"{med:,.0f}" if med >= 100 else f"{med:.2f}"
        out.append(f'<text x="{x0 + bar_w + 8}" y="{y + 16}">{value} {spec["unit"]}{ratio}</text>')
    y = 56 + len(rows) * row_h + 22
    better = "higher is better" if spec["higher_is_better"] else "lower is better"
    rounds = spec.get("rounds", "interleaved rounds")
    out.append(f'<text x="{pad}" y="{y}" fill="#555">median of {rows[0][4]} {rounds}, '
               f'whiskers min–max, ratio to {escape(spec["reference"])}; {better}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "results")
    charts = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "charts")
    os.makedirs(charts, exist_ok=True)
    for name in sorted(os.listdir(results)):
        if not name.endswith(".txt"):
            continue
        path = os.path.join(results, name)
        note = ""
        with open(path) as f:
            for line in f:
                if line.startswith("# "):
                    note = line[2:].strip()
                    break
        for group, sides in read(path).items():
            stem = name[:-4] if len(read(path)) == 1 else f"{name[:-4]}-{group}"
            target = os.path.join(charts, stem + ".svg")
            with open(target, "w") as f:
                f.write(chart(group, sides, note))
            print(f"wrote {target}")


if __name__ == "__main__":
    main()
