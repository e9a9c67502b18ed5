// Probe (not part of the build; written in the eighteenth session, first run in the nineteenth,
// run107, where the 4-consumer variant faulted and was dropped): does the decode GEMM at M = 64 go faster with more
// independent consumer chains per SM? PERF.md "The GEMM against K" found the tile kernel streaming W at 3.7 TB/s with
// two CTAs per SM and 2.9 with one, against 4.2 for a bare TMA stream: each 64 × 64 × 128 K block takes its CTA's one
// consumer warpgroup ~560 cycles (wait for the stage, four k32 wgmmas, wait for them, release, promote), four times the
// tensor cores' share.
//
// The kernel here is that pipeline reduced to its chain: a producer thread TMA-loads each K block's
// x [64 × 128] and W [64 × 128] boxes (128-byte swizzle) into a ring; CONSUMERS warpgroups take the
// stages in turn (consumer c the stages i ≡ c mod CONSUMERS, each into its own accumulators: K
// blocks of one tile split between them), run the four wgmmas, wait, release (one arrive per warp),
// and promote (acc += part · scale). Tiles as the GEMM's 64 × 64 split 2 (o_proj's N = 7168: 112
// tiles × 2 K halves); the results are not stored (only a sink no input reaches). W [7168, K]
// rotates over copies (no L2 reuse); a graph of 20 calls, best of 5, as `bench kernels` times.
//
// Variants: CONSUMERS 1 with 2 CTAs per SM (the GEMM today), 2 with 2 CTAs per SM, 2 / 3 with 1
// CTA per SM; and CONSUMERS 0 (the producer alone: the bare stream).
//
// Build here: nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I src \
//                docs/bench/tbl19/chain_probe.cu -lcuda -o chain_probe
// Run there:  ./chain_probe        (one line per variant and K: µs and GB/s of W)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "fanout/ops/sm90.cuh"
#include "probe_util.cuh"

using namespace fanout::ops::sm90;
using namespace probe;

constexpr int kBK = 128, kRows = 64, kStages = 6;
constexpr int kBox = kRows * kBK;      // one operand's bytes per stage
constexpr int kStageBytes = 2 * kBox;  // x, then W

// Consumer warpgroup c (of CONSUMERS) of the CTA: stages i ≡ c mod CONSUMERS of the CTA's sequence.
template <int CONSUMERS>
__device__ void consume(uint8_t* smem, uint64_t* full, uint64_t* empty, int units, int per_unit,
                        unsigned long long* sink) {
    const int c = static_cast<int>(threadIdx.x) / 128 - 1, lane = threadIdx.x % 32;
    float acc[32], part[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[j] = 0.0f;
    const uint32_t base = smem_addr(smem);
    int i = 0;  // this CTA's stage sequence, as the producer counts it
    for (int u = blockIdx.x; u < units; u += gridDim.x)
        for (int kb = 0; kb < per_unit; ++kb, ++i) {
            if (i % CONSUMERS != c) continue;
            const int s = i % kStages;
            mbar_wait(&full[s], (i / kStages) & 1);
            const uint32_t a_lo = desc_k_major_sw128_lo(base + s * kStageBytes);
            const uint32_t b_lo = desc_k_major_sw128_lo(base + s * kStageBytes + kBox);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < kBK / 32; ++k)
                Wgmma<64>::mma(part, desc_from_lo(a_lo + 2 * k), desc_from_lo(b_lo + 2 * k), k > 0 ? 1 : 0);
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(part);
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);
            const float scale = 1.0f + 1e-7f * kb;
#pragma unroll
            for (int j = 0; j < 32; ++j) acc[j] = fmaf(part[j], scale, acc[j]);
        }
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) v += acc[j];
    if (v == 1234.5f) *sink = 1;
}

template <int CONSUMERS, int CTAS>
__global__ void __launch_bounds__((CONSUMERS + 1) * 128, CTAS)
    chain(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw, int tiles, int nkb,
          unsigned long long* sink) {
    extern __shared__ uint8_t raw[];
    uint8_t* smem = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
    __shared__ uint64_t full[kStages], empty[kStages];
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 4);
        mbar_fence_init();
    }
    __syncthreads();
    const int units = tiles * 2, per_unit = nkb / 2;  // K split in two halves, as o_proj's 64 × 64 / 2
    if (threadIdx.x == 0) {                           // the producer
        int i = 0;
        for (int u = blockIdx.x; u < units; u += gridDim.x)
            for (int kb = (u % 2) * per_unit; kb < (u % 2 + 1) * per_unit; ++kb, ++i) {
                const int s = i % kStages;
                // The stage's previous fill: consumed (freed on `empty`), or with no consumers landed.
                if (i >= kStages) mbar_wait(CONSUMERS > 0 ? &empty[s] : &full[s], ((i / kStages) & 1) ^ 1);
                mbar_arrive_expect_tx(&full[s], kStageBytes);
                tma_load_2d(smem + s * kStageBytes, &tx, &full[s], kb * kBK, 0);
                tma_load_2d(smem + s * kStageBytes + kBox, &tw, &full[s], kb * kBK, (u / 2) * kRows);
            }
        if (CONSUMERS == 0)  // no copy may still be landing when the CTA ends
            for (int j = max(0, i - kStages); j < i; ++j) mbar_wait(&full[j % kStages], (j / kStages) & 1);
        return;
    }
    if constexpr (CONSUMERS > 0)
        if (threadIdx.x >= 128) consume<CONSUMERS>(smem, full, empty, units, per_unit, sink);
}

template <int CONSUMERS, int CTAS>
static int run(const uint8_t* w, const uint8_t* x, int K, int sms, cudaStream_t st, unsigned long long* sink) {
    const int N = 7168;
    const uint64_t bytes = uint64_t(N) * K;
    const int copies = int(std::min<uint64_t>(8, (1ull << 30) / bytes));
    CUtensorMap tx, tw[8];
    if (!make_map(&tx, x, kRows, K, kRows)) return 1;
    for (int c = 0; c < copies; ++c)
        if (!make_map(&tw[c], w + c * bytes, N, K, kRows)) return 1;
    // One CTA per SM: more shared memory than two could share, so none doubles up.
    constexpr int smem = CTAS == 1 ? 120 * 1024 : kStages * kStageBytes + 1024;
    auto* k = chain<CONSUMERS, CTAS>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int grid = sms * CTAS, threads = (CONSUMERS + 1) * 128;
    const auto launch = [&](int i) { k<<<grid, threads, smem, st>>>(tx, tw[i % copies], N / kRows, K / kBK, sink); };
    const double us = time_us(st, 20, launch);
    CK(cudaGetLastError());
    std::printf("K %5d  consumers %d x %d CTAs/SM: %7.1f us  %5.0f GB/s of W\n", K, CONSUMERS, CTAS, us,
                bytes / (us * 1e3));
    return 0;
}

int main() {
    if (!init_encode()) return 1;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    uint8_t *w = nullptr, *x = nullptr;
    unsigned long long* sink = nullptr;
    CK(cudaMalloc(&w, size_t{1} << 30));
    CK(cudaMalloc(&x, size_t{kRows} * 32768));
    CK(cudaMalloc(&sink, 64));
    CK(cudaMemset(w, 0x38, size_t{1} << 30));  // e4m3 1.0
    CK(cudaMemset(x, 0x38, size_t{kRows} * 32768));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int K : {8192, 16384, 32768}) {
        int rc = 0;
        rc |= run<0, 2>(w, x, K, sms, st, sink);
        rc |= run<1, 2>(w, x, K, sms, st, sink);
        rc |= run<2, 2>(w, x, K, sms, st, sink);
        rc |= run<1, 1>(w, x, K, sms, st, sink);
        rc |= run<2, 1>(w, x, K, sms, st, sink);
        rc |= run<3, 1>(w, x, K, sms, st, sink);
        if (rc) return 1;
    }
    return 0;
}
