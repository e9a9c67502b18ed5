// Dense stream-K's plan and its pieces (GemmConfig::stream_k): one definition for the FP8 tile
// kernel (gemm_fp8_sm90.cu), its launch and the CPU test that checks the plan covers every tile's
// K blocks once (fmt-free, so .cu files can include it).
//
// A launch of `tiles` tile units (clusters' worth) on a persistent grid of `ctas` CTAs (clusters)
// runs its whole waves as whole tiles: units [0, full). The K blocks of the `tiles - full` tiles
// left over, tile after tile, are cut into shares of `share` blocks, at most one per CTA, share c
// covering blocks [c · share, (c + 1) · share) of that sequence. A share is less than a tile's K
// (plan_stream_k), so it meets one tile or two, and runs as up to two pieces: units full + c
// (piece 0, its part of the later tile) and full + ctas + c (piece 1, its part of the earlier one,
// or all of it), so a CTA that starts at c reaches both after its whole tiles. A tile's shares
// reduce as split K's do: each but the last stores a partial in its slot (`split`), and the last —
// the one holding the tile's last K block — waits for them and adds them in split order. Piece 0
// starts at its tile's first K block, so it is the tile's last share only when it is the only one
// and waits for nobody; the shares a last one waits for are lower, run by CTAs that took their
// place in the grid earlier (the kernel's ticket), which run their piece 0 first.
#pragma once

#include "fanout/ops/fp8_constants.h"  // FANOUT_HOST_DEVICE

namespace fanout::ops {

struct StreamKPlan {
    int full = 0;   // units run as whole tiles (a multiple of ctas when tiles > 0)
    int tiles = 0;  // tile units dealt out in shares after them (0: no stream-K)
    int share = 0;  // K blocks per share (< nkb)
    int ctas = 0;   // shares: the grid's CTAs (clusters)
    int slots = 1;  // partial slots per tile: the most shares a tile meets, less its last
    int nkb = 0;    // K blocks per tile

    FANOUT_HOST_DEVICE constexpr int units() const { return tiles > 0 ? full + 2 * ctas : full; }
};

// The plan for `tiles` tile units of `nkb` K blocks on `ctas` CTAs: none when the tiles fill whole
// waves; with fewer tiles than CTAs every tile is dealt out. Shares hold at least `min_share` K
// blocks (the launch passes gemm.h's kMinStreamKShare), and there are none when that is a whole
// tile's (shallow K: the tiles run whole). A share's partial makes a round trip through L2 that
// costs about what a short share saves, and a small remainder dealt out to every CTA would make
// one-block shares: one tile left over on 132 CTAs, 56 K blocks deep, would have its last share add
// 55 partial tiles of 128 KB. So only the first ceil(tiles · nkb / share) CTAs get a share; the
// others' pieces are empty.
FANOUT_HOST_DEVICE constexpr StreamKPlan plan_stream_k(int tiles, int ctas, int nkb, int min_share) {
    StreamKPlan p;
    p.nkb = nkb;
    p.ctas = ctas;
    const int rest = ctas > 0 && nkb > 0 ? tiles % ctas : 0;
    p.full = tiles - rest;
    if (rest == 0) return p;
    p.tiles = rest;
    p.share = (rest * nkb + ctas - 1) / ctas;  // <= nkb, as rest < ctas
    if (p.share < min_share) p.share = min_share;
    if (p.share >= nkb) {  // shares of whole tiles: the tiles run whole, as they would without
        p.full = tiles;
        p.tiles = 0;
        p.share = 0;
        return p;
    }
    int most = 1;
    for (int i = 0; i < rest; ++i) {
        const int met = ((i + 1) * nkb - 1) / p.share - i * nkb / p.share + 1;
        most = met > most ? met : most;
    }
    p.slots = most > 1 ? most - 1 : 1;
    return p;
}

struct StreamKPiece {
    int tile;      // the tile unit (>= full)
    int kb0, kb1;  // its K blocks in this piece
    int split;     // the share's place among the tile's shares
    int splits;    // the tile's shares (the last, splits - 1, reduces)
};

// Unit t (full <= t < units()) of plan p: false when that piece holds no K block (a share inside
// one tile has no piece 0; shares past the last K block have none).
FANOUT_HOST_DEVICE constexpr bool stream_k_piece(const StreamKPlan& p, int t, StreamKPiece& out) {
    const int v = t - p.full, c = v % p.ctas, piece = v / p.ctas;
    const int a = c * p.share, end = p.tiles * p.nkb, b = a + p.share < end ? a + p.share : end;
    if (a >= b) return false;
    const int i0 = a / p.nkb, i1 = (b - 1) / p.nkb, i = piece == 0 ? i1 : i0;
    if (piece == 0 && i1 == i0) return false;
    out.tile = p.full + i;
    out.kb0 = a - i * p.nkb > 0 ? a - i * p.nkb : 0;
    out.kb1 = b - i * p.nkb < p.nkb ? b - i * p.nkb : p.nkb;
    const int first = i * p.nkb / p.share, last = ((i + 1) * p.nkb - 1) / p.share;  // the tile's shares
    out.split = c - first;
    out.splits = last - first + 1;
    return true;
}

}  // namespace fanout::ops
