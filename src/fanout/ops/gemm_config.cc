// The tile table of the FP8 GEMM (gemm.h): which block shape and K split each dense shape runs
// with. Measured on H200 with `fanout bench kernels --sweep` (docs/PERF.md has the sweep).
#include <algorithm>

#include "fanout/ops/gemm.h"

namespace fanout::ops {

GemmConfig pick_gemm_config(int M, int N, int K, int num_sms, bool split_k_allowed) {
    GemmConfig c;
    c.block_m = M <= 64 ? 64 : 128;
    c.block_n = 128;
    const int nkb = (K + 127) / 128;
    const int tiles = ((M + c.block_m - 1) / c.block_m) * ((N + c.block_n - 1) / c.block_n);
    // Too few tiles to cover the multiprocessors: split K, keeping at least 4 K blocks per split.
    if (split_k_allowed && 2 * tiles <= num_sms) c.splits = std::max(1, std::min(nkb / 4, num_sms / tiles));
    return c;
}

}  // namespace fanout::ops
