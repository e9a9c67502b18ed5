// `fanout bench mla`: see mla_bench.h. Each figure is the best of 5 replays of a CUDA graph of
// `calls` back-to-back launches (a captured graph is how the model runner calls the kernel). The
// cache holds random bf16 values (never zeros); each request owns its own blocks, in order.
#include "mla_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "fanout/core/cuda_check.h"
#include "fanout/core/dtype.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/mha_prefill_cuda.h"
#include "fanout/ops/mla_attention.h"
#include "fanout/ops/mla_attention_cuda.h"
#include "gpu_timing.h"
#include "kernels_bench.h"

namespace fanout::bench {
namespace {

// n random bf16 values in [-scale, scale) (never zero): a 16 MB random piece repeated.
void fill_random_bf16(uint16_t* dst, size_t n, uint64_t seed, float scale) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(0.05f * scale, scale);
    std::vector<uint16_t> piece(std::min(n, size_t{8} << 20));
    for (auto& v : piece) v = f32_to_bf16((rng() & 1) ? dist(rng) : -dist(rng));
    for (size_t off = 0; off < n; off += piece.size()) {
        const size_t len = std::min(piece.size(), n - off);
        FANOUT_CUDA_CHECK(cudaMemcpy(dst + off, piece.data(), len * sizeof(uint16_t), cudaMemcpyHostToDevice));
    }
}

// One MHA-form prefill point through launch_mha_prefill: `requests` chunks of `tokens` queries, each
// over its own prefix + tokens keys, in one launch; random bf16 q, k_nope, k_pe, v in the model's
// layout (kv_b's output interleaves k_nope and v per head).
nlohmann::json run_mha_prefill_point(ops::DeviceContext& dc, int heads, int tokens, int prefix, int requests,
                                     double peak_tflops, FILE* table_out) {
    constexpr int kNope = 128, kRope = 64, kV = 128;
    const int T = tokens * requests, ctx = (prefix + tokens) * requests;
    DevicePtr<uint16_t> q(size_t(T) * heads * (kNope + kRope)), kv(size_t(ctx) * heads * (kNope + kV)),
        kpe(size_t(ctx) * kRope), out(size_t(T) * heads * kV);
    fill_random_bf16(q.p, size_t(T) * heads * (kNope + kRope), 6, 1.0f);
    fill_random_bf16(kv.p, size_t(ctx) * heads * (kNope + kV), 7, 1.0f);
    fill_random_bf16(kpe.p, size_t(ctx) * kRope, 8, 1.0f);
    ops::MhaPrefillParams p;
    p.num_tokens = T, p.ctx_len = ctx, p.num_heads = heads, p.nope = kNope, p.rope = kRope, p.v_dim = kV;
    p.scale = 1.0f / 13.856f;
    p.q = q.p, p.q_stride_t = int64_t(heads) * (kNope + kRope), p.q_stride_h = kNope + kRope;
    p.k_nope = kv.p, p.k_stride_t = int64_t(heads) * (kNope + kV), p.k_stride_h = kNope + kV;
    p.v = kv.p + kNope, p.v_stride_t = p.k_stride_t, p.v_stride_h = p.k_stride_h;
    p.k_pe = kpe.p, p.k_pe_stride_t = kRope;
    p.out = out.p, p.out_stride_t = int64_t(heads) * kV, p.out_stride_h = kV;
    // Several requests: each `tokens` queries over its own prefix + tokens keys, back to back.
    std::vector<int32_t> qs(requests + 1), ks(requests + 1);
    for (int r = 0; r <= requests; ++r) qs[r] = r * tokens, ks[r] = r * (prefix + tokens);
    DevicePtr<int32_t> d_qs(qs.size()), d_ks(ks.size());
    FANOUT_CUDA_CHECK(cudaMemcpy(d_qs.p, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice));
    FANOUT_CUDA_CHECK(cudaMemcpy(d_ks.p, ks.data(), ks.size() * 4, cudaMemcpyHostToDevice));
    if (requests > 1) {
        p.num_requests = requests, p.max_query_len = tokens;
        p.query_start = d_qs.p, p.kv_start = d_ks.p;
    }
    const ops::MhaPrefillKernel kernel = ops::mha_prefill_kernel_for(p);
    const double us = time_graph_us(dc.stream(), 3, [&] { ops::launch_mha_prefill(dc, p); });
    const double pairs =
        requests * (double(tokens) * prefix + double(tokens) * (tokens + 1) / 2);  // visible (query, key)
    const double flops = 2.0 * (kNope + kRope + kV) * heads * pairs, tflops = flops / us / 1e6;
    const double pct = peak_tflops > 0 ? 100 * tflops / peak_tflops : 0.0;
    const char* name = ops::mha_prefill_kernel_name(kernel);
    if (table_out)
        std::fprintf(table_out, "%6d %8d %6d %6d  %-9s %10.1f %8.1f %7.0f%%\n", heads, requests, tokens,
                     prefix + tokens, name, us, tflops, pct);
    return {{"heads", heads},
            {"requests", requests},
            {"tokens_per_request", tokens},
            {"ctx_len_per_request", prefix + tokens},
            {"kernel", name},
            {"us", us},
            {"gflop", flops / 1e9},
            {"tflops", tflops},
            {"pct_bf16_peak", pct}};
}

// Relative L2 error of `got` against `want` (bf16 rows of `width`), overall and of the worst row.
std::pair<double, double> bf16_rel_error(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                                         size_t width) {
    double num = 0, den = 0, worst = 0;
    for (size_t r = 0; r < want.size() / width; ++r) {
        double rn = 0, rd = 0;
        for (size_t i = r * width; i < (r + 1) * width; ++i) {
            const double a = bf16_to_f32(got[i]), b = bf16_to_f32(want[i]);
            rn += (a - b) * (a - b);
            rd += b * b;
        }
        num += rn, den += rd;
        worst = std::max(worst, std::sqrt(rn / std::max(rd, 1e-30)));
    }
    return {std::sqrt(num / std::max(den, 1e-30)), worst};
}

}  // namespace

// One decode point, twice: the bf16 cache, then the same values in the FP8 cache (quantized on the
// device); the FP8 row's error is its output against the bf16 cache's.
nlohmann::json run_mla_bench_point(int batch, int query_len, int kv_len, int heads, int calls, bool head_major,
                                   double peak_tflops, FILE* table_out) {
    constexpr int kLora = 512, kRope = 64, kBlock = 64, kEntry = kLora + kRope;
    const int T = batch * query_len, blocks_per_req = (kv_len + kBlock - 1) / kBlock;
    std::vector<int32_t> query_start(batch + 1), kv(batch, kv_len), positions(T), table(size_t(batch) * blocks_per_req);
    for (int r = 0; r < batch; ++r) {
        query_start[r + 1] = (r + 1) * query_len;
        for (int i = 0; i < query_len; ++i) positions[r * query_len + i] = kv_len - query_len + i;
        for (int b = 0; b < blocks_per_req; ++b) table[size_t(r) * blocks_per_req + b] = r * blocks_per_req + b;
    }
    DevicePtr<int32_t> d_qs(query_start.size()), d_kv(kv.size()), d_pos(positions.size()), d_table(table.size());
    FANOUT_CUDA_CHECK(cudaMemcpy(d_qs.p, query_start.data(), query_start.size() * 4, cudaMemcpyHostToDevice));
    FANOUT_CUDA_CHECK(cudaMemcpy(d_kv.p, kv.data(), kv.size() * 4, cudaMemcpyHostToDevice));
    FANOUT_CUDA_CHECK(cudaMemcpy(d_pos.p, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice));
    FANOUT_CUDA_CHECK(cudaMemcpy(d_table.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    const size_t cache_elems = size_t(batch) * blocks_per_req * kBlock * kEntry;
    DevicePtr<uint16_t> cache(cache_elems), q_lat(size_t(T) * heads * kLora), q_pe(size_t(T) * heads * kRope),
        out(size_t(T) * heads * kLora);
    fill_random_bf16(cache.p, cache_elems, 3, 1.0f);
    fill_random_bf16(q_lat.p, size_t(T) * heads * kLora, 4, 1.0f);
    fill_random_bf16(q_pe.p, size_t(T) * heads * kRope, 5, 1.0f);

    ops::MlaAttentionParams p;
    p.num_tokens = T;
    p.num_requests = batch;
    p.num_heads = heads;
    p.kv_lora = kLora;
    p.rope_dim = kRope;
    p.block_size = kBlock;
    p.max_blocks = blocks_per_req;
    p.max_query_len = query_len;
    p.scale = 1.0f / 13.856f;  // 1/√192
    p.query_start = d_qs.p;
    p.kv_len = d_kv.p;
    p.positions = d_pos.p;
    p.block_table = d_table.p;
    p.cache = cache.p;
    // Token-major [T, H, 512], or head-major [H, T, 512] as the layer's k_b GEMM writes q_lat and
    // its v_b GEMM reads the output; q_pe is [T, H, 64] in both.
    const int64_t lat_t = head_major ? kLora : int64_t(heads) * kLora, lat_h = head_major ? int64_t(T) * kLora : kLora;
    p.q_lat = q_lat.p, p.q_lat_stride_t = lat_t, p.q_lat_stride_h = lat_h;
    p.q_pe = q_pe.p, p.q_pe_stride_t = int64_t(heads) * kRope, p.q_pe_stride_h = kRope;
    p.out = out.p, p.out_stride_t = lat_t, p.out_stride_h = lat_h;

    ops::MlaWorkspace ws;
    cudaStream_t stream;
    FANOUT_CUDA_CHECK(cudaStreamCreate(&stream));
    const char* kernel = ops::mla_attention_kernel_for(p) == ops::MlaKernel::kTensorCore ? "tensor-core" : "generic";
    // The count: every query row against all kv_len positions, 2·(576 + 512) flops each.
    const double flops = 2.0 * T * heads * double(kv_len) * (kEntry + kLora);
    nlohmann::json rows = nlohmann::json::array();
    std::vector<uint16_t> out_bf16;
    DevicePtr<uint8_t> cache_fp8(cache_elems / kEntry * ops::kMlaFp8EntryBytes);
    for (const bool fp8 : {false, true}) {
        if (fp8) {
            ops::launch_quantize_latent_fp8(cache.p, int64_t(cache_elems / kEntry), cache_fp8.p, stream);
            p.cache = nullptr, p.cache_fp8 = cache_fp8.p;
        }
        const double us = time_graph_us(stream, calls, [&] { ops::launch_mla_attention(p, &ws, stream); });
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<uint16_t> got(size_t(T) * heads * kLora);
        FANOUT_CUDA_CHECK(cudaMemcpy(got.data(), out.p, got.size() * 2, cudaMemcpyDeviceToHost));
        const auto [err, worst_err] = fp8 ? bf16_rel_error(got, out_bf16, kLora) : std::pair<double, double>{0, 0};
        if (!fp8) out_bf16 = std::move(got);
        // The cache, read once. (From HBM only when it is far larger than the L2: at batch 8 and below
        // the 20 back-to-back calls find it there, so GB/s is not the HBM rate.)
        const double bytes = double(batch) * kv_len * (fp8 ? ops::kMlaFp8EntryBytes : kEntry * 2);
        const double tflops = flops / us / 1e6, gbs = bytes / us / 1e3;
        if (table_out) {
            std::fprintf(table_out, "%6d %5d %6d %5d  %-11s %5s %9.1f %8.1f %7.0f %7.0f%%", batch, query_len, kv_len,
                         heads, kernel, fp8 ? "fp8" : "bf16", us, tflops, gbs,
                         peak_tflops > 0 ? 100 * tflops / peak_tflops : 0.0);
            if (fp8) std::fprintf(table_out, "  %.2e / %.2e", err, worst_err);
            std::fprintf(table_out, "\n");
        }
        nlohmann::json row = {{"batch", batch},
                              {"query_len", query_len},
                              {"kv_len", kv_len},
                              {"heads", heads},
                              {"kernel", kernel},
                              {"cache", fp8 ? "fp8" : "bf16"},
                              {"layout", head_major ? "head_major" : "token_major"},
                              {"us", us},
                              {"gflop", flops / 1e9},
                              {"tflops", tflops},
                              {"cache_gbs", gbs},
                              {"pct_bf16_peak", peak_tflops > 0 ? 100 * tflops / peak_tflops : 0.0}};
        if (fp8) row["rel_error_vs_bf16_cache"] = err, row["worst_row_rel_error_vs_bf16_cache"] = worst_err;
        rows.push_back(row);
    }
    FANOUT_CUDA_CHECK(cudaStreamDestroy(stream));
    return rows;
}

nlohmann::json run_mla_bench(const MlaBenchOptions& opts, FILE* table_out) {
    require_gpu("fanout bench mla");
    cudaDeviceProp prop{};
    int dev = 0;
    FANOUT_CUDA_CHECK(cudaGetDevice(&dev));
    FANOUT_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    const double peak = measure_gpu_ceilings().bf16_tflops;
    if (table_out) {
        std::fprintf(table_out, "%s, %d SMs: bf16 GEMM ceiling (cuBLASLt 8192^3) %.0f TFLOP/s\n", prop.name,
                     prop.multiProcessorCount, peak);
        std::fprintf(table_out,
                     "MLA absorbed decode attention, kv_lora 512 + rope 64, block 64; cache bf16, then the same "
                     "values in FP8 (e4m3 + a scale per 128, rope bf16: 656 bytes per entry); q_lat and output %s\n",
                     opts.head_major ? "head-major [H, T, 512] (the layer's)" : "token-major [T, H, 512]");
        std::fprintf(table_out, "%6s %5s %6s %5s  %-11s %5s %9s %8s %7s %8s  %s\n", "batch", "query", "kv", "heads",
                     "kernel", "cache", "us", "TFLOP/s", "GB/s", "%bf16",
                     "fp8 rel. error vs bf16 cache: all / worst row");
    }
    nlohmann::json rows = nlohmann::json::array();
    for (int batch : opts.batches)
        for (auto& row : run_mla_bench_point(batch, opts.query_len, opts.kv_len, opts.heads, opts.calls,
                                             opts.head_major, peak, table_out))
            rows.push_back(row);
    nlohmann::json prefill = nlohmann::json::array();
    if (table_out && std::any_of(opts.prefill_shapes.begin(), opts.prefill_shapes.end(),
                                 [](const std::string& s) { return !s.empty(); })) {
        std::fprintf(table_out,
                     "\nMLA prefill attention, MHA form (nope 128 + rope 64, v 128, causal; target >= 450 "
                     "TFLOP/s at 128 heads x 4096 tokens)\n");
        std::fprintf(table_out, "%6s %8s %6s %6s  %-9s %10s %8s %8s\n", "heads", "requests", "tokens", "ctx", "kernel",
                     "us", "TFLOP/s", "%bf16");
    }
    std::unique_ptr<ops::DeviceContext> dc;  // the prefill points' stream and work counters, made once
    for (const std::string& shape : opts.prefill_shapes) {
        if (shape.empty()) continue;
        int heads = 0, T = 0, prefix = 0, requests = 1;
        char tail = 0;
        const int n = std::sscanf(shape.c_str(), "%d:%d:%d:%d%c", &heads, &T, &prefix, &requests, &tail);
        FANOUT_CHECK((n == 3 || n == 4) && heads > 0 && T > 0 && prefix >= 0 && requests >= 1,
                     "prefill shape '{}': expected heads:tokens:prefix[:requests], e.g. 128:4096:0 or 128:1024:0:4",
                     shape);
        if (!dc) dc = std::make_unique<ops::DeviceContext>();
        prefill.push_back(run_mha_prefill_point(*dc, heads, T, prefix, requests, peak, table_out));
    }
    nlohmann::json out = {{"benchmark", "mla"},
                          {"gpu", prop.name},
                          {"sms", prop.multiProcessorCount},
                          {"bf16_gemm_8192_tflops", peak},
                          {"flashmla_h800_tflops_reference", 660},
                          {"rows", rows},
                          {"prefill_target_tflops", 450},
                          {"prefill", prefill}};
    if (!opts.json_out.empty()) {
        std::ofstream(opts.json_out) << out.dump(2) << "\n";
        if (table_out) std::fprintf(table_out, "wrote %s\n", opts.json_out.c_str());
    }
    return out;
}

}  // namespace fanout::bench
