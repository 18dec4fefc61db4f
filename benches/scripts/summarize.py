#!/usr/bin/env python3
"""Summarises interleaved criterion rounds: median (min-max) across rounds, and ratios.

Bench ids are `<group>/<side>/<scenario>/r<round>`. For each side and scenario this prints the
median of the rounds' median times with the min and max, and the ratio to the reference side
of the same scenario (the first side named in REFERENCE that is present).

    python3 benches/scripts/summarize.py memory_decision
    python3 benches/scripts/summarize.py layer
    python3 benches/scripts/summarize.py fixed_costs
    python3 benches/scripts/summarize.py key_cap

Criterion's output folder is `$CARGO_TARGET_DIR/criterion` (default `target/criterion`).
"""

import json
import os
import re
import statistics
import sys
from collections import defaultdict

REFERENCE = {
    "memory_decision": ["governor_gcra"],
    "layer": ["bare"],
    "fixed_costs": ["governor_check"],
    "key_cap": ["insert_below_cap"],
}


def main():
    group = sys.argv[1] if len(sys.argv) > 1 else "memory_decision"
    root = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "criterion", group)
    times = defaultdict(list)
    for dirpath, _, files in os.walk(root):
        if os.path.basename(dirpath) != "new" or "benchmark.json" not in files:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            full_id = json.load(f)["full_id"]
        m = re.fullmatch(re.escape(group) + r"/([^/]+)/(.+)/r\d+", full_id)
        if not m:
            continue
        with open(os.path.join(dirpath, "estimates.json")) as f:
            ns = json.load(f)["median"]["point_estimate"]
        times[(m.group(2), m.group(1))].append(ns)
    if not times:
        sys.exit(f"no results under {root}")
    refs = REFERENCE.get(group, [])
    for scenario in sorted({s for s, _ in times}):
        sides = sorted(side for s, side in times if s == scenario)
        ref = next((r for r in refs if (scenario, r) in times), None)
        ref_median = statistics.median(times[(scenario, ref)]) if ref else None
        print(f"\n{scenario}")
        print(f"  {'side':<34} {'median ns':>10} {'min-max':>17} {'rounds':>6}  ratio")
        for side in sides:
            v = times[(scenario, side)]
            med = statistics.median(v)
            ratio = f"{med / ref_median:.3f}x {ref}" if ref_median else ""
            span = f"{min(v):.1f}-{max(v):.1f}"
            print(f"  {side:<34} {med:>10.1f} {span:>17} {len(v):>6}  {ratio}")


if __name__ == "__main__":
    main()
