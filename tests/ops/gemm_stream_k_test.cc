// Dense stream-K's plan (gemm_stream_k.h), the one the FP8 tile kernel runs: over grids, tile
// counts and least shares of every kind, the pieces cover each tile's K blocks exactly once, a
// tile's shares are numbered in K order with the last one holding its last K block, the partial
// slots hold every share but the last, and only a CTA's second piece ever waits — for shares of
// lower CTAs.
#include "fanout/ops/gemm_stream_k.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace fanout::ops {
namespace {

// The plan's fields, in one line per test.
void expect_plan(const StreamKPlan& p, int full, int tiles, int share, int slots, int units) {
    EXPECT_EQ(p.full, full);
    EXPECT_EQ(p.tiles, tiles);
    EXPECT_EQ(p.share, share);
    EXPECT_EQ(p.slots, slots);
    EXPECT_EQ(p.units(), units);
}

TEST(GemmStreamK, WholeWavesNeedNoShares) { expect_plan(plan_stream_k(264, 132, 56, 8), 264, 0, 0, 1, 264); }

// o_proj at M = 1,024 in 128 × 256 pairs on an H200's 66: 112 pair units, 46 past the whole wave,
// 128 K blocks each in shares of 90 — a tile meets two or three shares.
TEST(GemmStreamK, TheDeepSeekOProjAtOneThousandRows) {
    expect_plan(plan_stream_k(112, 66, 128, 8), 66, 46, 90, 2, 66 + 132);
}

// Plan p of `tiles` units on `ctas` CTAs, `nkb` K blocks deep, shares of at least `least`: sound.
void check_plan(const StreamKPlan& p, int tiles, int ctas, int nkb, int least, const std::string& what) {
    ASSERT_EQ(p.full + p.tiles, tiles) << what;
    ASSERT_LT(p.tiles, ctas) << what;
    if (p.tiles == 0) {
        // Whole waves, or shares that would be whole tiles: every tile runs whole.
        const int rest = tiles % ctas, share = (rest * nkb + ctas - 1) / ctas;
        ASSERT_TRUE(rest == 0 || std::max(share, least) >= nkb) << what;
        ASSERT_EQ(p.units(), tiles) << what;
        return;
    }
    ASSERT_EQ(p.full % ctas, 0) << what;
    ASSERT_GE(p.share, least) << what;
    ASSERT_LT(p.share, nkb) << what;
    ASSERT_GE(int64_t(p.share) * ctas, int64_t(p.tiles) * nkb) << what;

    // Per tile: which K blocks were covered, and by which split.
    std::vector<std::vector<int>> owner(p.tiles, std::vector<int>(nkb, -1)), share = owner;
    std::vector<int> splits(p.tiles, 0);
    for (int t = p.full; t < p.units(); ++t) {
        StreamKPiece piece{};
        if (!stream_k_piece(p, t, piece)) continue;
        const int i = piece.tile - p.full, c = (t - p.full) % ctas;
        const bool second = t >= p.full + ctas;
        ASSERT_TRUE(i >= 0 && i < p.tiles) << what << " unit " << t;
        ASSERT_TRUE(piece.kb0 >= 0 && piece.kb0 < piece.kb1 && piece.kb1 <= nkb) << what << " unit " << t;
        ASSERT_TRUE(piece.split >= 0 && piece.split < piece.splits) << what << " unit " << t;
        ASSERT_TRUE(splits[i] == 0 || splits[i] == piece.splits) << what << " tile " << i;
        splits[i] = piece.splits;
        const bool last = piece.split == piece.splits - 1;
        if (!last) {
            ASSERT_LT(piece.split, p.slots) << what << " unit " << t << ": no slot for its partial";
        } else {
            ASSERT_EQ(piece.kb1, nkb) << what << " unit " << t;
        }
        // A last share with others waits: only ever in a CTA's second piece, and its
        // others are lower shares.
        if (last && piece.splits > 1) {
            ASSERT_TRUE(second) << what << " unit " << t;
        }
        for (int kb = piece.kb0; kb < piece.kb1; ++kb) {
            ASSERT_EQ(owner[i][kb], -1) << what << " tile " << i << " K block " << kb << " twice";
            owner[i][kb] = piece.split;
            share[i][kb] = c;
        }
    }
    // Every K block covered; the splits 0, 1, ..., splits - 1 in K order with none
    // missing (a missing one would leave the last share waiting for ever), each from
    // share first + split, so the last one's others are lower shares.
    for (int i = 0; i < p.tiles; ++i) {
        ASSERT_EQ(owner[i][0], 0) << what << " tile " << i;
        for (int kb = 1; kb < nkb; ++kb) {
            const int step = owner[i][kb] - owner[i][kb - 1];
            ASSERT_TRUE(step == 0 || step == 1) << what << " tile " << i << " K block " << kb;
        }
        ASSERT_EQ(owner[i][nkb - 1], splits[i] - 1) << what << " tile " << i;
        for (int kb = 0; kb < nkb; ++kb) ASSERT_EQ(share[i][kb] - owner[i][kb], share[i][0]) << what << " tile " << i;
    }
}

// A small remainder is not cut into one-block shares: one 128 × 256 tile left over on 132 CTAs, 56
// K blocks deep (V3's gate+up), goes to seven CTAs in shares of 8 (kMinStreamKShare), its last
// share adding six partials instead of 55; with K no deeper than the least share the tiles run
// whole.
TEST(GemmStreamK, ShareHoldsAtLeastTheLeastShare) {
    const StreamKPlan p = plan_stream_k(133, 132, 56, 8);
    expect_plan(p, 132, 1, 8, 6, 132 + 264);
    int pieces = 0;
    for (int t = p.full; t < p.units(); ++t) {
        StreamKPiece piece{};
        if (!stream_k_piece(p, t, piece)) continue;
        ++pieces;
        EXPECT_EQ(piece.splits, 7);
        EXPECT_EQ(piece.kb0, 8 * piece.split);
    }
    EXPECT_EQ(pieces, 7);
    expect_plan(plan_stream_k(133, 132, 8, 8), 133, 0, 0, 1, 133);  // K = 1,024
}

TEST(GemmStreamK, PiecesCoverEveryTileOnceAndOnlySecondPiecesWait) {
    for (int least : {1, 3, 8, 16})
        for (int ctas : {1, 7, 66, 132, 264})
            for (int nkb : {1, 2, 4, 9, 16, 56, 128})
                for (int tiles = 1; tiles <= 3 * ctas + 5; tiles += (tiles < 40 ? 1 : 7)) {
                    const std::string what = "tiles " + std::to_string(tiles) + " ctas " + std::to_string(ctas) +
                                             " nkb " + std::to_string(nkb) + " least " + std::to_string(least);
                    check_plan(plan_stream_k(tiles, ctas, nkb, least), tiles, ctas, nkb, least, what);
                    if (::testing::Test::HasFatalFailure()) return;
                }
}

}  // namespace
}  // namespace fanout::ops
