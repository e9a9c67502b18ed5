// Probe (not part of the build; written in the seventeenth session, run in the eighteenth: PERF.md
// "The W stream without the GEMM"): how fast can TMA stream a K-major FP8 weight matrix into
// shared memory when nothing consumes it?
// The decode GEMMs stream W at ~3.2 TB/s where 16-byte loads reach 4.48 (PERF.md, seventeenth
// session); ring depth, x, the scale loader, W's pitch and layout were ruled out. This times the
// TMA stream alone: CTAs walk tiles of ROWS rows of W [N, K] like the GEMM (each tile's K blocks
// in order, 128-byte swizzled boxes of ROWS x 128 bytes, BOXES boxes per stage), a producer thread
// keeps STAGES stages in flight, one consumer warp waits on each stage and frees it. Grid: every
// SM, CTAS per SM. Also the plain 16-byte read on the same buffer.
//
// Build here:  nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I src \
//                 docs/bench/tbl19/tma_read_probe.cu bench/copy_kernel.cu -o tma_read_probe
// Run there:   ./tma_read_probe            (prints one line per variant: GB/s)
//              ./tma_read_probe sized      (read16 and the TMA stream at the GEMMs' W sizes, one
//                                          launch and a graph of 20 as `bench kernels` times)
//              ./tma_read_probe kscan      (the GEMM at M = 64 over K against the streams; build
//                 with -DWITH_GEMM -DFANOUT_WITH_CUDA=1 and build/src/fanout/libfanout_{ops,core}.a)
// Ran as `run97` (single launches), `run98` (sized, TMA and read16) and `run100` (sized, with the
// cp.async stream); the two consumers' identical loops were folded into consume() afterwards.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#ifdef WITH_GEMM
#include "fanout/ops/gemm.h"
#endif

#include "fanout/ops/sm90.cuh"
#include "probe_util.cuh"

using namespace fanout::ops::sm90;
using namespace probe;

constexpr int kBK = 128;

// A stream's consumer: waits for each stage of this CTA's units in turn (unit u = tile u / splits,
// its K share; units blockIdx.x, + gridDim.x, ...), touches one byte of it and frees it.
template <int STAGES>
__device__ void consume(const uint8_t* smem, int stage_bytes, uint64_t* full, uint64_t* empty, int tiles, int nkb,
                        int splits, unsigned long long* sink) {
    int s = 0;
    uint32_t phase = 0;
    unsigned long long acc = 0;
    for (int u = blockIdx.x; u < tiles * splits; u += gridDim.x)
        for (int kb = (u % splits) * (nkb / splits); kb < (u % splits + 1) * (nkb / splits); ++kb) {
            mbar_wait(&full[s], phase);
            acc += smem[s * stage_bytes];
            mbar_arrive(&empty[s]);
            if (++s == STAGES) s = 0, phase ^= 1;
        }
    if (acc == 0x5a5a5a5a5a5aULL) *sink = acc;
}

template <int ROWS, int BOXES, int STAGES>
__global__ void tma_stream(const __grid_constant__ CUtensorMap tm, int tiles, int nkb, int splits,
                           unsigned long long* sink) {
    extern __shared__ uint8_t raw[];
    uint8_t* smem = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
    constexpr int kStage = ROWS * BOXES * kBK;
    __shared__ uint64_t full[STAGES], empty[STAGES];
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 1);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // producer
        int s = 0;
        uint32_t phase = 0;
        for (int u = blockIdx.x; u < tiles * splits; u += gridDim.x)  // unit u: tile u / splits, its K share
            for (int kb = (u % splits) * (nkb / splits); kb < (u % splits + 1) * (nkb / splits); ++kb) {
                const int t = u / splits;
                mbar_wait(&empty[s], phase ^ 1);
                mbar_arrive_expect_tx(&full[s], kStage);
                for (int b = 0; b < BOXES; ++b)
                    tma_load_2d(smem + s * kStage + b * ROWS * kBK, &tm, &full[s], kb * kBK, (t * BOXES + b) * ROWS);
                if (++s == STAGES) s = 0, phase ^= 1;
            }
    } else if (threadIdx.x == 32) {  // consumer: wait, touch one byte, free
        consume<STAGES>(smem, kStage, full, empty, tiles, nkb, splits, sink);
    }
}

// The same stream through cp.async (16-byte LDGSTS, L1 bypassed) instead of TMA: PRODUCERS threads
// copy each stage's ROWS x 128-byte box into the 128-byte swizzled layout wgmma reads, each
// arriving on `full` when its copies have landed (cp.async.mbarrier.arrive.noinc); the next thread
// consumes as above.
template <int ROWS, int STAGES, int PRODUCERS>
__global__ void cpasync_stream(const uint8_t* __restrict__ w, uint64_t K, int tiles, int nkb, int splits,
                               unsigned long long* sink) {
    extern __shared__ uint8_t raw[];
    uint8_t* smem = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
    constexpr int kStage = ROWS * kBK, kChunks = kStage / 16;
    static_assert(kChunks % PRODUCERS == 0, "whole chunks per producer");
    __shared__ uint64_t full[STAGES], empty[STAGES];
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&full[s], PRODUCERS), mbar_init(&empty[s], 1);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x < PRODUCERS) {
        int s = 0;
        uint32_t phase = 0;
        for (int u = blockIdx.x; u < tiles * splits; u += gridDim.x)
            for (int kb = (u % splits) * (nkb / splits); kb < (u % splits + 1) * (nkb / splits); ++kb) {
                const int t = u / splits;
                mbar_wait(&empty[s], phase ^ 1);
#pragma unroll
                for (int j = 0; j < kChunks / PRODUCERS; ++j) {
                    const int c = threadIdx.x + j * PRODUCERS, row = c / 8, col = c % 8;
                    const uint8_t* src = w + (uint64_t(t) * ROWS + row) * K + uint64_t(kb) * kBK + col * 16;
                    const uint32_t dst = smem_addr(smem + s * kStage + row * kBK + ((col ^ (row % 8)) * 16));
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
                }
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(&full[s]))
                             : "memory");
                if (++s == STAGES) s = 0, phase ^= 1;
            }
        asm volatile("cp.async.wait_all;" ::: "memory");
    } else if (threadIdx.x == PRODUCERS) {
        consume<STAGES>(smem, kStage, full, empty, tiles, nkb, splits, sink);
    }
}

// bench/copy_kernel.cu's read ceiling (built with this file).
void launch_read16(const void* src, size_t bytes, int* sink, cudaStream_t stream);

template <int ROWS, int BOXES, int STAGES>
static int run(const char* what, const uint8_t* w, uint64_t N, uint64_t K, int ctas_per_sm, int splits, int sms,
               unsigned long long* sink) {
    CUtensorMap m;
    if (!make_map(&m, w, N, K, ROWS)) {
        std::printf("%s: tensor map refused\n", what);
        return 1;
    }
    constexpr int smem = STAGES * ROWS * BOXES * kBK + 1024;
    auto* k = tma_stream<ROWS, BOXES, STAGES>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int tiles = int(N / (ROWS * BOXES)), nkb = int(K / kBK);
    const int grid = sms * ctas_per_sm;
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float best = 1e30f;
    for (int rep = 0; rep < 6; ++rep) {
        cudaEventRecord(a);
        k<<<grid, 64, smem>>>(m, tiles, nkb, splits, sink);
        cudaEventRecord(b);
        CK(cudaEventSynchronize(b));
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        if (rep > 0 && ms < best) best = ms;
    }
    CK(cudaGetLastError());
    std::printf("%-34s %2d CTAs/SM, split %d, %3d KB in flight per CTA: %7.0f GB/s\n", what, ctas_per_sm, splits,
                STAGES * ROWS * BOXES * kBK / 1024, double(N) * K / (best * 1e-3) / 1e9);
    return 0;
}

// The second question (eighteenth session): at a decode GEMM's own W size, timed as the benchmark
// times it, how fast do read16 and the TMA stream go? `copies` > 1 rotates over that many copies of
// W (no L2 reuse between calls, as in a layer).
static int sized(const char* what, const uint8_t* w, uint64_t N, uint64_t K, int copies, int sms, cudaStream_t st,
                 unsigned long long* sink) {
    const uint64_t bytes = N * K;
    CUtensorMap maps[8];
    for (int c = 0; c < copies; ++c)
        if (!make_map(&maps[c], w + c * bytes, N, K, 64)) return 1;
    constexpr int smem = 6 * 64 * kBK + 1024;
    auto* k = tma_stream<64, 1, 6>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int tiles = int(N / 64), nkb = int(K / kBK);
    const int splits = tiles >= 2 * sms ? 1 : 2;
    auto* ca = cpasync_stream<64, 6, 128>;
    auto* cb = cpasync_stream<64, 6, 64>;
    CK(cudaFuncSetAttribute(ca, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(cb, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    for (int calls : {1, 20}) {
        const float r = time_us(st, calls, [&](int i) {
            launch_read16(w + (i % copies) * bytes, bytes, reinterpret_cast<int*>(sink), st);
        });
        const float t = time_us(
            st, calls, [&](int i) { k<<<2 * sms, 64, smem, st>>>(maps[i % copies], tiles, nkb, splits, sink); });
        const float a = time_us(st, calls, [&](int i) {
            ca<<<2 * sms, 160, smem, st>>>(w + (i % copies) * bytes, K, tiles, nkb, splits, sink);
        });
        const float c = time_us(st, calls, [&](int i) {
            cb<<<2 * sms, 96, smem, st>>>(w + (i % copies) * bytes, K, tiles, nkb, splits, sink);
        });
        CK(cudaGetLastError());
        std::printf(
            "%-14s %6.1f MB x%d %-11s read16 %6.1f us %5.0f GB/s | TMA split %d %6.1f us %5.0f | cp.async x128 "
            "%6.1f us %5.0f | x64 %6.1f us %5.0f GB/s\n",
            what, bytes / 1e6, copies, calls == 1 ? "one launch" : "graph of 20", r, bytes / (r * 1e3), splits, t,
            bytes / (t * 1e3), a, bytes / (a * 1e3), c, bytes / (c * 1e3));
    }
    return 0;
}

#ifdef WITH_GEMM
// The third question: how the GEMM's time at M = 64 grows with K against the bare streams' — the
// intercept is what a launch costs besides its bytes, the slope its rate. W [7168, K] (o_proj's N),
// 64 × 64 tiles split 2 and unsplit, a graph of 20 calls rotating over copies of W (no L2 reuse).
static int kscan(uint8_t* w, int sms, cudaStream_t st, unsigned long long* sink) {
    const int M = 64, N = 7168;
    fanout::ops::GemmWorkspace ws;
    uint8_t* x = nullptr;
    float *sx = nullptr, *sw = nullptr;
    uint16_t* y = nullptr;
    CK(cudaMalloc(&x, size_t(M) * 65536));
    CK(cudaMalloc(&sx, sizeof(float) * M * 512));
    CK(cudaMalloc(&sw, sizeof(float) * 56 * 512 * 8));
    CK(cudaMalloc(&y, sizeof(uint16_t) * M * N));
    CK(cudaMemset(x, 0x38, size_t(M) * 65536));  // e4m3 1.0
    std::vector<float> ones(56 * 512 * 8, 1.0f);
    CK(cudaMemcpy(sw, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sx, ones.data(), sizeof(float) * M * 512, cudaMemcpyHostToDevice));
    constexpr int smem = 6 * 64 * kBK + 1024;
    auto* k = tma_stream<64, 1, 6>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    for (int K : {2048, 4096, 8192, 16384, 32768}) {
        const uint64_t bytes = uint64_t(N) * K;
        const int copies = int(std::min<uint64_t>(8, (1ull << 30) / bytes));
        CUtensorMap maps[8];
        for (int c = 0; c < copies; ++c)
            if (!make_map(&maps[c], w + c * bytes, N, K, 64)) return 1;
        const int tiles = N / 64, nkb = K / kBK;
        const float r = time_us(
            st, 20, [&](int i) { launch_read16(w + (i % copies) * bytes, bytes, reinterpret_cast<int*>(sink), st); });
        const float t =
            time_us(st, 20, [&](int i) { k<<<2 * sms, 64, smem, st>>>(maps[i % copies], tiles, nkb, 2, sink); });
        float g[2];
        for (int sp = 1; sp <= 2; ++sp)
            g[sp - 1] = time_us(st, 20, [&](int i) {
                fanout::ops::launch_gemm_fp8(x, sx, w + (i % copies) * bytes, sw, y, M, N, K, st, nullptr, &ws,
                                             fanout::ops::GemmConfig{64, 64, sp, 1});
            });
        CK(cudaGetLastError());
        std::printf(
            "K %5d  W %6.1f MB x%d: read16 %6.1f us | TMA stream (split 2) %6.1f us | GEMM 64x64/1 %6.1f us, "
            "64x64/2 %6.1f us\n",
            K, bytes / 1e6, copies, r, t, g[0], g[1]);
    }
    return 0;
}
#endif

int main(int argc, char** argv) {
    if (!init_encode()) return 1;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // o_proj's W (7,168 x 16,384 bytes, 117 MB) and a 1 GiB one (65,536 x 16,384).
    const uint64_t K = 16384, n_small = 7168, n_big = 65536;
    uint8_t* w = nullptr;
    unsigned long long* sink = nullptr;
    CK(cudaMalloc(&w, n_big * K));
    CK(cudaMalloc(&sink, 64));
    CK(cudaMemset(w, 1, n_big * K));
    {
        float best = 1e30f;
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        for (int rep = 0; rep < 6; ++rep) {
            cudaEventRecord(a);
            launch_read16(w, n_big * K, reinterpret_cast<int*>(sink), nullptr);
            cudaEventRecord(b);
            CK(cudaEventSynchronize(b));
            float ms = 0;
            cudaEventElapsedTime(&ms, a, b);
            if (rep > 0 && ms < best) best = ms;
        }
        std::printf("%-34s %7.0f GB/s\n", "read16, 1 GiB", double(n_big) * K / (best * 1e-3) / 1e9);
    }
#ifdef WITH_GEMM
    if (argc > 1 && std::string(argv[1]) == "kscan") {
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        return kscan(w, sms, st, sink);
    }
#endif
    if (argc > 1 && std::string(argv[1]) == "sized") {
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        int rc = 0;
        rc |= sized("shared down", w, 7168, 2048, 1, sms, st, sink);
        rc |= sized("o_proj", w, 7168, 16384, 1, sms, st, sink);
        rc |= sized("o_proj", w, 7168, 16384, 8, sms, st, sink);
        rc |= sized("dense down", w, 7168, 18432, 1, sms, st, sink);
        rc |= sized("dense gate+up", w, 36864, 7168, 1, sms, st, sink);
        rc |= sized("dense gate+up", w, 36864, 7168, 4, sms, st, sink);
        rc |= sized("1 GiB", w, 65536, 16384, 1, sms, st, sink);
        return rc;
    }
    for (uint64_t N : {n_small, n_big}) {
        std::printf("-- W %llu x %llu bytes\n", (unsigned long long)N, (unsigned long long)K);
        int rc = 0;
        const int sp = N == n_small ? 2 : 1;  // o_proj's GEMM: 112 tiles of 64 rows, K split in 2
        rc |= run<64, 1, 6>("64-row boxes x1, 6 stages", w, N, K, 2, sp, sms, sink);  // the o_proj GEMM's W stream
        rc |= run<64, 1, 12>("64-row boxes x1, 12 stages", w, N, K, 1, sp, sms, sink);
        rc |= run<64, 1, 12>("64-row boxes x1, 12 stages", w, N, K, 2, sp, sms, sink);
        rc |= run<128, 1, 6>("128-row boxes x1, 6 stages", w, N, K, 2, sp, sms, sink);
        rc |= run<256, 1, 6>("256-row boxes x1, 6 stages", w, N, K, 1, sp, sms, sink);
        rc |= run<64, 4, 6>("64-row boxes x4, 6 stages", w, N, K, 1, sp, sms, sink);
        rc |= run<64, 1, 24>("64-row boxes x1, 24 stages", w, N, K, 1, sp, sms, sink);
        rc |= run<64, 1, 6>("64-row boxes x1, 6 stages, split 4", w, N, K, 2, 2 * sp, sms, sink);
        rc |= run<64, 1, 6>("64-row boxes x1, 6 stages", w, N, K, 3, sp, sms, sink);
        rc |= run<64, 1, 6>("64-row boxes x1, 6 stages, split 4", w, N, K, 4, 2 * sp, sms, sink);
        rc |= run<64, 2, 6>("64-row boxes x2, 6 stages", w, N, K, 2, sp, sms, sink);
        rc |= run<32, 1, 12>("32-row boxes x1, 12 stages", w, N, K, 2, sp, sms, sink);
        if (rc) return 1;
    }
    return 0;
}
