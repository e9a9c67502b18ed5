#!/usr/bin/env python3
"""Summarizes gemm_trace_probe's output (run149): per launch, the traced span, when the full
waves end, and per kind of unit (whole tile, split but last, last split) the mean K loop and
epilogue (the last split's includes its wait and the reduction), in µs.
Usage: trace_summary.py trace.txt"""
import re
import sys
from collections import defaultdict


def main():
    launches = defaultdict(list)
    heads = {}
    for line in open(sys.argv[1]):
        if line.startswith("#"):
            m = re.match(r"# ep (\d+) draw (\d+) config (\S+):", line)
            heads[(m[1], m[2], m[3])] = line.strip()
            continue
        left, mid, right = line.split("|")
        ep, draw, cfg, cta, sm, first = left.split()
        end = float(mid.split()[3])
        units = []
        for u in right.split():
            if "/" in u and "-" not in u:
                t, s = u.split("/")
                units.append([int(t), int(s)])
            else:
                a, b = (float(v) for v in u.split("-"))
                units[-1] += [a, b]
        launches[(ep, draw, cfg)].append((int(cta), units, end))
    for key, ctas in launches.items():
        print(heads[key])
        kinds = defaultdict(list)
        whole_end = []
        for cta, units, end in ctas:
            for i, (t, s, a, b) in enumerate(units):
                nxt = units[i + 1][2] if i + 1 < len(units) else end
                kind = "split" if s > 0 or any(u[1] > 0 and u[0] == t for u in units) else "tile"
                kinds[(t, s)]  # noqa
                kinds_key = "tile" if s == 0 and key[2].endswith("/1c1") else None
                kinds.setdefault("all", []).append((t, s, b - a, nxt - b, a, nxt))
            whole_end.append(end)
        rows = kinds["all"]
        # A unit is split when another CTA's unit has the same t... units carry only t and split;
        # split > 0 marks the later ranges; split 0 of a split tile shares its t's tail range.
        starts = sorted(r[4] for r in rows)
        print(f"  CTAs {len(ctas)}, units {len(rows)}, last end {max(whole_end):.1f}, first end {min(whole_end):.1f}")
        by_round = defaultdict(list)
        for cta, units, end in ctas:
            for i, u in enumerate(units):
                by_round[i].append(u)
        for i in sorted(by_round):
            us = by_round[i]
            k = [u[3] - u[2] for u in us]
            st = [u[2] for u in us]
            print(f"  unit #{i}: {len(us)} CTAs, start {min(st):.1f}-{max(st):.1f}, K loop {min(k):.1f}-{max(k):.1f} (mean {sum(k)/len(k):.1f})")
        # epilogue gaps: next start - K loop end
        gaps = defaultdict(list)
        for cta, units, end in ctas:
            for i, u in enumerate(units):
                nxt = units[i + 1][2] if i + 1 < len(units) else end
                gaps[u[1]].append(nxt - u[3])
        for s in sorted(gaps):
            g = gaps[s]
            print(f"  split {s}: epilogue (to next start or end) {min(g):.1f}-{max(g):.1f} (mean {sum(g)/len(g):.1f}, n {len(g)})")


if __name__ == "__main__":
    main()
