// Probe (not built by CMake): the masked grouped GEMM's per-CTA timeline at the seed's EP32..EP128
// gate+up points (N 4,096, K 7,168), on the routing draws `bench kernels --draws 4` uses, for the
// table's config and the unsplit 128 x 256/1. Built against gemm_fp8_sm90.cu with
// gemm_trace.patch applied (docs/bench/tbl19/run149.sh's build notes); prints one line per CTA and
// unit: "ep draw config cta sm first | t split start kloop_end" (ns from the launch's first CTA).
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/grouped_gemm_cuda.h"
#include "kernels_bench.h"

namespace fanout::ops {
void gemm_trace_clear();
void gemm_trace_read(unsigned long long* out);
}  // namespace fanout::ops

int main() {
    using namespace fanout;
    const int N = 4096, K = 7168;
    struct Point {
        int ep, valid;
    };
    const Point points[] = {{32, 2086}, {64, 2132}, {128, 2417}};
    std::mt19937_64 rng(5);
    auto upload = [&](size_t n, bool scales) {
        void* d = nullptr;
        FANOUT_CUDA_CHECK(cudaMalloc(&d, n * (scales ? 4 : 1)));
        if (scales) {
            std::vector<float> h(n);
            for (auto& v : h) v = (0.5f + (rng() % 1000) / 1000.0f) / 448.0f;
            FANOUT_CUDA_CHECK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
        } else {
            std::vector<uint8_t> h(n);
            for (auto& v : h) v = static_cast<uint8_t>(rng() & 0x77);  // finite e4m3, |v| < 448
            FANOUT_CUDA_CHECK(cudaMemcpy(d, h.data(), n, cudaMemcpyHostToDevice));
        }
        return d;
    };
    ops::GemmWorkspace ws;
    std::vector<unsigned long long> tr(1024 * 24);
    for (const Point& pt : points) {
        const int E = 256 / pt.ep, expected = 8 * pt.ep, max_m = bench::anchor_count_max(expected);
        auto* x = static_cast<uint8_t*>(upload(size_t(E) * max_m * K, false));
        auto* sx = static_cast<float*>(upload(size_t(E) * max_m * (K / 128), true));
        auto* w = static_cast<uint8_t*>(upload(size_t(E) * N * K, false));
        auto* sw = static_cast<float*>(upload(size_t(E) * (N / 128) * (K / 128), true));
        uint16_t* y = nullptr;
        int32_t* dc = nullptr;
        FANOUT_CUDA_CHECK(cudaMalloc(&y, size_t(E) * max_m * N * 2));
        FANOUT_CUDA_CHECK(cudaMalloc(&dc, E * 4));
        for (int draw = 0; draw < 4; ++draw) {
            const std::vector<int32_t> counts =
                bench::anchor_counts(E, expected, pt.valid, static_cast<uint32_t>(pt.ep + 1000 * draw));
            FANOUT_CUDA_CHECK(cudaMemcpy(dc, counts.data(), E * 4, cudaMemcpyHostToDevice));
            const ops::GemmConfig table =
                ops::pick_grouped_masked_config(expected, E, N, K, ops::device_sm_count(), true);
            for (const ops::GemmConfig cfg : {table, ops::GemmConfig{128, 256, 1, 1}}) {
                auto launch = [&] {
                    ops::launch_grouped_gemm_fp8_masked(x, sx, dc, E, max_m, w, sw, N, K, y, expected, nullptr, &ws,
                                                        cfg);
                };
                for (int i = 0; i < 20; ++i) launch();
                cudaEvent_t a, b;
                cudaEventCreate(&a);
                cudaEventCreate(&b);
                cudaEventRecord(a);
                for (int i = 0; i < 20; ++i) launch();
                cudaEventRecord(b);
                FANOUT_CUDA_CHECK(cudaEventSynchronize(b));
                float ms = 0;
                cudaEventElapsedTime(&ms, a, b);
                ops::gemm_trace_clear();
                launch();
                FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
                ops::gemm_trace_read(tr.data());
                unsigned long long t0 = ~0ull, t_end = 0;
                for (int c = 0; c < 1024; ++c)
                    if (tr[c * 24] != 0) t0 = std::min(t0, tr[c * 24]), t_end = std::max(t_end, tr[c * 24 + 2]);
                std::printf("# ep %d draw %d config %dx%d/%dc%d: %.1f us per launch (events), traced %.1f us\n", pt.ep,
                            draw, cfg.block_m, cfg.block_n, cfg.splits, cfg.cluster, ms * 1000 / 20,
                            (t_end - t0) / 1e3);
                for (int c = 0; c < 1024; ++c) {
                    const unsigned long long* r = &tr[c * 24];
                    if (r[0] == 0) continue;
                    std::printf("%d %d %dx%d/%dc%d %d %llu %llu | start %.2f end %.2f |", pt.ep, draw, cfg.block_m,
                                cfg.block_n, cfg.splits, cfg.cluster, c, r[1] >> 32, r[1] & 0xffffffffu,
                                (r[0] - t0) / 1e3, (r[2] - t0) / 1e3);
                    for (int u = 0; u < 7 && r[4 + 3 * u] != 0; ++u)
                        std::printf(" %llu/%llu %.2f-%.2f", r[3 + 3 * u] & 0xffffff, r[3 + 3 * u] >> 24,
                                    (r[4 + 3 * u] - t0) / 1e3, (r[5 + 3 * u] - t0) / 1e3);
                    std::printf("\n");
                }
            }
        }
        for (void* p : {static_cast<void*>(x), static_cast<void*>(sx), static_cast<void*>(w), static_cast<void*>(sw),
                        static_cast<void*>(y), static_cast<void*>(dc)})
            cudaFree(p);
    }
    return 0;
}
