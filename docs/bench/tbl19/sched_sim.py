#!/usr/bin/env python3
"""A model of the masked grouped GEMM's tile schedule (gemm_fp8_sm90.cu), not a measurement.

It asks whether a different schedule of the same tiles could shorten the gate+up GEMM (N 4096,
K 7168) at the seed's EP32..EP128 points, before anyone writes one into the kernel. Counts are
drawn like `bench kernels`' (each expert uniform in [0.7, 1.3] x 8·EP tokens, then adjusted to the
anchor's total; another generator, so not the same draws). The tiles are the table's picks:
128 x 256 with the last wave split in K, unpaired at EP32 and EP64, in cluster pairs at EP128
(G = 66 pairs; a pair unit is two row blocks sharing a W tile and costs its slower CTA's tile, so
an odd last block leaves its peer idle). A tile's cost is in units of one full 128 x 256 tile; a
tile whose rows fill only its first 64-row warpgroup costs HALF (its other warpgroup skips the
MMAs, but it still streams the whole W tile). Schedules:
  static  the kernel's: CTA (pair) c runs units c, c + G, ...; a last partial wave of R <= G/2
          units is split s = min(8, G/R, 56/16) ways in K into ranges of ceil(56/s) K blocks, the
          last one the rest (plan_tail), each split unit costing its range's share plus OVH.
  dynamic the same units, each taken by whichever CTA is free first (an atomic unit counter).
  always  dynamic, and the last wave split at least 2 ways even when R > G/2.
  aware   static full waves, then the last wave's full units split in two (half units whole),
          placed largest first on the least-loaded CTAs (a weight-aware tail).
  ideal   total cost / G (no granularity).
Usage: sched_sim.py [draws]
"""
import heapq
import random
import sys

HALF, OVH = 0.6, 0.04
NKB = 7168 // 128


def counts(experts, expected, total, seed):
    lo, hi = expected * 7 // 10, expected * 13 // 10
    if not experts * lo <= total <= experts * hi:
        raise ValueError(f"{total} rows cannot be {experts} groups of {lo}..{hi}")
    rng = random.Random(seed)
    c = [rng.randint(lo, hi) for _ in range(experts)]
    t, e = sum(c), 0
    while t != total:
        step = 1 if t < total else -1
        if lo <= c[e] + step <= hi:
            c[e] += step
            t += step
        e = (e + 1) % experts
    return c


def units(cs, pairs, bm=128, bn=256, n=4096):
    """Unit costs in the kernel's order: per expert, per column block, the row units fastest."""
    out = []
    for cnt in cs:
        blocks = [1.0 if min(bm, cnt - b * bm) > 64 else HALF for b in range((cnt + bm - 1) // bm)]
        if pairs:
            blocks = [max(blocks[i:i + 2]) for i in range(0, len(blocks), 2)]
        for _ in range(n // bn):
            out += blocks
    return out


def split_units(ws, g, always):
    """The units with the last wave split in K (plan_tail), and the split count."""
    r = len(ws) % g
    s = 1
    if r and (r <= g // 2 or always):
        s = min(8, max(g // r, 2 if always else 1), NKB // 16)
    if s == 1:
        return list(ws)
    kb = (NKB + s - 1) // s
    s = (NKB + kb - 1) // kb
    full = len(ws) - r
    return ws[:full] + [w * min(kb, NKB - i * kb) / NKB + OVH for i in range(s) for w in ws[full:]]


def static(ws, g):
    loads = [0.0] * g
    for i, u in enumerate(split_units(ws, g, False)):
        loads[i % g] += u
    return max(loads)


def dynamic(ws, g, always=False):
    free = [0.0] * g
    for u in split_units(ws, g, always):
        heapq.heappush(free, heapq.heappop(free) + u)
    return max(free)


def aware(ws, g):
    r = len(ws) % g
    full = len(ws) - r
    loads = [0.0] * g
    for i, w in enumerate(ws[:full]):
        loads[i % g] += w
    tail = []
    for w in ws[full:]:
        tail += [w / 2 + OVH] * 2 if w == 1.0 else [w]
    if len(tail) > g:
        return static(ws, g)
    for u, c in zip(sorted(tail, reverse=True), sorted(range(g), key=lambda c: loads[c])):
        loads[c] += u
    return max(loads)


def main():
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    print(f"gate+up 128 x 256, {draws} draws: mean (min-max) in full-tile units")
    print("point          static            dynamic           always            aware             ideal")
    for ep, experts, total, pairs in ((32, 8, 2086, False), (64, 4, 2132, False), (128, 2, 2417, True)):
        g = 66 if pairs else 132
        rows = {k: [] for k in ("static", "dynamic", "always", "aware", "ideal")}
        for d in range(draws):
            ws = units(counts(experts, 8 * ep, total, ep + 1000 * d), pairs)
            rows["static"].append(static(ws, g))
            rows["dynamic"].append(dynamic(ws, g))
            rows["always"].append(dynamic(ws, g, True))
            rows["aware"].append(aware(ws, g))
            rows["ideal"].append(sum(ws) / g)
        cells = [f"{sum(v) / len(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in rows.values()]
        name = f"EP{ep}" + (" (pairs)" if pairs else "")
        print(f"{name:14} " + "  ".join(f"{c:16}" for c in cells))


if __name__ == "__main__":
    main()
