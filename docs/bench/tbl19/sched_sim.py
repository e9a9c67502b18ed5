#!/usr/bin/env python3
"""A model of the masked grouped GEMM's tile schedule (gemm_fp8_sm90.cu), not a measurement.

It asks whether a different schedule of the same tiles could shorten the gate+up GEMM (N 4096,
K 7168) at the seed's EP32..EP128 points, before anyone writes one into the kernel. Counts are
drawn as `bench kernels` draws them (each expert uniform in [0.7, 1.3] x expected, adjusted to
the anchor's total; not the same generator, so not the same draws). A tile's cost is in units of
one full 128 x 256 tile; a tile whose rows fill only its first 64-row warpgroup costs HALF (its
other warpgroup skips the MMAs, but it still streams the whole W tile). Schedules:
  static  the kernel's: CTA c runs units c, c + G, ...; a last partial wave of R <= G/2 tiles is
          split s = min(8, G/R, 56/16) ways in K, each split unit costing 1/s of its tile plus OVH.
  dynamic the same units, each taken by whichever CTA is free first (an atomic tile counter).
  always  dynamic, and the last wave split at least 2 ways even when R > G/2.
  aware   static full waves, then the last wave's full tiles split so that every unit is at most
          half a tile, placed on the least-loaded CTAs (a weight-aware tail).
  ideal   total cost / G (no granularity).
Usage: sched_sim.py [draws]
"""
import heapq
import random
import sys

HALF, OVH, G = 0.6, 0.04, 132
NKB = 7168 // 128


def counts(experts, expected, total, seed):
    lo, hi = expected * 7 // 10, expected * 13 // 10
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


def tiles(cs, bm=128, bn=256, n=4096):
    """Tile costs in the kernel's order: per expert, per column block, the row blocks fastest."""
    out = []
    for cnt in cs:
        blocks = (cnt + bm - 1) // bm
        for _ in range(n // bn):
            for b in range(blocks):
                rows = min(bm, cnt - b * bm)
                out.append(1.0 if rows > 64 else HALF)
    return out


def units_of(ws, always):
    r = len(ws) % G
    s = 1
    if r and (r <= G // 2 or always):
        s = min(8, max(G // r, 2 if always else 1), NKB // 16)
    if s == 1:
        return list(ws)
    full = len(ws) - r
    return ws[:full] + [w / s + OVH for _ in range(s) for w in ws[full:]]


def static(ws):
    loads = [0.0] * G
    for i, u in enumerate(units_of(ws, False)):
        loads[i % G] += u
    return max(loads)


def dynamic(ws, always=False):
    free = [0.0] * G
    for u in units_of(ws, always):
        heapq.heappush(free, heapq.heappop(free) + u)
    return max(free)


def aware(ws):
    r = len(ws) % G
    full = len(ws) - r
    loads = [0.0] * G
    for i, w in enumerate(ws[:full]):
        loads[i % G] += w
    tail = []
    for w in ws[full:]:
        tail += [w / 2 + OVH] * 2 if w == 1.0 else [w]
    if len(tail) > G:
        return static(ws)
    for u, c in zip(sorted(tail, reverse=True), sorted(range(G), key=lambda c: loads[c])):
        loads[c] += u
    return max(loads)


def main():
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    print(f"gate+up 128 x 256 tiles, {G} CTAs, {draws} draws: mean (min-max) in full-tile units")
    print("point  static            dynamic           always            aware             ideal")
    for ep, experts, total in ((32, 8, 2086), (64, 4, 2132), (128, 2, 2417)):
        rows = {k: [] for k in ("static", "dynamic", "always", "aware", "ideal")}
        for d in range(draws):
            ws = tiles(counts(experts, total // experts, total, ep + 1000 * d))
            rows["static"].append(static(ws))
            rows["dynamic"].append(dynamic(ws))
            rows["always"].append(dynamic(ws, True))
            rows["aware"].append(aware(ws))
            rows["ideal"].append(sum(ws) / G)
        cells = [f"{sum(v) / len(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in rows.values()]
        print(f"EP{ep:<4} " + "  ".join(f"{c:16}" for c in cells))


if __name__ == "__main__":
    main()
