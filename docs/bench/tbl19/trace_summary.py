#!/usr/bin/env python3
"""Summarizes gemm_trace_probe's output (run149), per launch (µs from its first CTA's start):
the traced span; per unit position in the CTAs' sequences, when those units start and how long
their K loops run; and per split index, the epilogue (K loop's end to the CTA's next unit or its
end: for a tile's last split its wait for the others plus the reduction and the store).
Usage: trace_summary.py trace.txt"""
import re
import sys
from collections import defaultdict


def parse(path):
    heads, launches = {}, defaultdict(list)
    for line in open(path):
        if line.startswith("#"):
            m = re.match(r"# ep (\d+) draw (\d+) config (\S+):", line)
            heads[m.groups()] = line.strip()
            continue
        left, mid, right = line.split("|")
        ep, draw, cfg, cta, _sm, _first = left.split()
        end = float(mid.split()[3])
        units, toks = [], right.split()
        for tu, span in zip(toks[0::2], toks[1::2]):
            t, s = (int(v) for v in tu.split("/"))
            a, b = (float(v) for v in span.split("-"))
            units.append((t, s, a, b))
        launches[(ep, draw, cfg)].append((int(cta), units, end))
    return heads, launches


def rng(v):
    return f"{min(v):6.1f}-{max(v):6.1f} (mean {sum(v) / len(v):5.1f})" if v else "-"


def main():
    heads, launches = parse(sys.argv[1])
    for key, ctas in launches.items():
        print(heads[key])
        ends = [e for _, _, e in ctas]
        print(f"  {len(ctas)} CTAs end {rng(ends)}")
        by_pos = defaultdict(list)
        epi = defaultdict(list)
        for _, units, end in ctas:
            for i, (t, s, a, b) in enumerate(units):
                by_pos[(i, s)].append((a, b - a))
                nxt = units[i + 1][2] if i + 1 < len(units) else end
                epi[s].append(nxt - b)
        for (i, s), v in sorted(by_pos.items()):
            print(f"  unit #{i} split {s}: {len(v):3} CTAs, start {rng([a for a, _ in v])}, K loop {rng([d for _, d in v])}")
        for s, v in sorted(epi.items()):
            print(f"  split {s} epilogue: {rng(v)}")


if __name__ == "__main__":
    main()
