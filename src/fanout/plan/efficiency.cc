#include "fanout/plan/efficiency.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "fanout/core/error.h"
#include "fanout/plan/v3_shape.h"

namespace fanout::plan {

double Roofline::time_us(double bytes, double flops, double hbm_bw, double flop_rate) const {
    const double m = bytes / (bw_eff * hbm_bw) * 1e6, c = flops / (flop_eff * flop_rate) * 1e6;
    const double bound = p <= 0 ? std::max(m, c) : std::pow(std::pow(m, p) + std::pow(c, p), 1.0 / p);
    return fixed_us + bound;
}

double interpolate_efficiency(const std::vector<EfficiencyPoint>& curve, double rows) {
    FANOUT_CHECK(!curve.empty(), "plan: interpolating an empty efficiency curve");
    if (rows <= curve.front().rows) return curve.front().eff;
    if (rows >= curve.back().rows) return curve.back().eff;
    size_t i = 1;
    while (curve[i].rows < rows) ++i;
    const EfficiencyPoint &a = curve[i - 1], &b = curve[i];
    const double t = std::log(rows / a.rows) / std::log(b.rows / a.rows);
    return a.eff + t * (b.eff - a.eff);
}

double gemm_bytes(double m, double n, double k, bool weights_in_l2) {
    return m * k * v3::kFp8 + (weights_in_l2 ? 0.0 : n * k * v3::kFp8) + 2 * m * n;
}

double grouped_gemm_bytes(double experts, double tokens, double n, double k) {
    return experts * n * k * v3::kFp8 + tokens * k * v3::kFp8 + 2 * tokens * n;
}

RooflineFit fit_roofline(const std::vector<RooflineSample>& samples, double hbm_bw, double flop_rate) {
    FANOUT_CHECK(samples.size() >= 3, "plan: a roofline fit needs at least 3 measured points, got {}", samples.size());
    for (const auto& s : samples)
        FANOUT_CHECK(s.us > 0 && s.bytes >= 0 && s.flops >= 0, "plan: bad sample (bytes {}, flops {}, us {})", s.bytes,
                     s.flops, s.us);
    RooflineFit best;
    double best_err = std::numeric_limits<double>::infinity();
    std::vector<double> g(samples.size());
    for (const double p : {0.0, 1.0, 2.0, 3.0, 4.0, 6.0}) {
        for (int bi = 20; bi <= 120; ++bi) {
            for (int fi = 10; fi <= 100; ++fi) {
                Roofline r{0, bi / 100.0, fi / 100.0, p, ""};
                // The fixed cost that minimizes Σ((f + g_i)/t_i − 1)² for these efficiencies.
                double num = 0, den = 0;
                for (size_t i = 0; i < samples.size(); ++i) {
                    g[i] = r.time_us(samples[i].bytes, samples[i].flops, hbm_bw, flop_rate);
                    const double t = samples[i].us;
                    num += (t - g[i]) / (t * t);
                    den += 1 / (t * t);
                }
                r.fixed_us = std::max(0.0, num / den);
                double err = 0;
                for (size_t i = 0; i < samples.size(); ++i) {
                    const double e = (r.fixed_us + g[i]) / samples[i].us - 1;
                    err += e * e;
                }
                if (err < best_err) {
                    best_err = err;
                    best.roofline = r;
                }
            }
        }
    }
    double max_e = 0;
    for (const auto& s : samples)
        max_e = std::max(max_e, std::fabs(best.roofline.time_us(s.bytes, s.flops, hbm_bw, flop_rate) / s.us - 1));
    best.max_rel_error = max_e;
    best.rms_rel_error = std::sqrt(best_err / samples.size());
    return best;
}

std::vector<RooflineSample> deepgemm_dense_anchor_samples() {
    // REFERENCE.md §3, DeepGEMM sm90_fp8_gemm_1d2d on one H200, µs at M = 64, 128, 256, 1024, 4096.
    struct Row {
        double n, k, us[5];
    };
    const Row rows[] = {
        {2112, 7168, {10.5, 11.3, 13.4, 32.5, 95.7}},     // fused qkv_a
        {24576, 1536, {11.3, 12.0, 21.4, 64.7, 239.2}},   // q_b
        {32768, 512, {7.2, 9.2, 13.0, 37.9, 130.9}},      // kv_b
        {7168, 16384, {38.4, 46.3, 61.6, 201.7, 672.2}},  // o_proj
        {4096, 7168, {12.0, 13.2, 17.7, 45.7, 171.7}},    // shared gate+up
        {7168, 2048, {6.6, 8.8, 11.1, 30.2, 93.8}},       // shared down
    };
    const double ms[5] = {64, 128, 256, 1024, 4096};
    std::vector<RooflineSample> out;
    for (const Row& r : rows)
        for (int i = 0; i < 5; ++i)
            out.push_back({gemm_bytes(ms[i], r.n, r.k, r.n * r.k <= kL2Bytes), 2 * ms[i] * r.n * r.k, r.us[i]});
    return out;
}

std::vector<RooflineSample> deepgemm_grouped_anchor_samples() {
    // REFERENCE.md §3, DeepGEMM masked grouped GEMM on one H200: (experts, tokens per expert),
    // gate/up 4096×7168 µs, down 7168×2048 µs.
    struct Row {
        double experts, m, gate_up_us, down_us;
    };
    const Row rows[] = {{32, 64, 263.2, 144.5},
                        {16, 128, 154.6, 87.4},
                        {8, 256, 133.7, 68.2},
                        {4, 512, 113.0, 63.0},
                        {2, 1024, 114.5, 63.6}};
    std::vector<RooflineSample> out;
    for (const Row& r : rows) {
        const double tokens = r.experts * r.m;
        out.push_back({grouped_gemm_bytes(r.experts, tokens, 4096, 7168), 2 * tokens * 4096 * 7168, r.gate_up_us});
        out.push_back({grouped_gemm_bytes(r.experts, tokens, 7168, 2048), 2 * tokens * 7168 * 2048, r.down_us});
    }
    return out;
}

Profile default_profile() {
    static const Profile cached = [] {
        Profile p;
        const Hardware h200 = h200_sxm();  // the anchors' machine
        const RooflineFit dense = fit_roofline(deepgemm_dense_anchor_samples(), h200.hbm_bw, h200.fp8_flops);
        p.gemm = dense.roofline;
        p.gemm.source = fmt::format("fit on DeepGEMM dense anchors, H200 (REFERENCE §3; max error {:.0f}%)",
                                    100 * dense.max_rel_error);
        const RooflineFit grouped = fit_roofline(deepgemm_grouped_anchor_samples(), h200.hbm_bw, h200.fp8_flops);
        p.grouped = grouped.roofline;
        p.grouped.source = fmt::format("fit on DeepGEMM grouped anchors, H200 (REFERENCE §3; max error {:.0f}%)",
                                       100 * grouped.max_rel_error);
        // FlashMLA on an H800 (REFERENCE §3): up to 3000 GB/s of its 3.35 TB/s HBM, 660 of its 989
        // dense BF16 TFLOP/s; the fixed cost is the GEMM fit's (no small-batch anchor).
        p.attention = {p.gemm.fixed_us, 3000.0 / 3350.0, 660.0 / 989.0, 0, "FlashMLA anchors (REFERENCE §3)"};
        // No anchor for prefill attention in REFERENCE: half the BF16 rate (FlashAttention-3's
        // class on Hopper) until `bench mla`'s prefill rows calibrate it. Stated assumption.
        p.mha_attention = {p.gemm.fixed_us, 3000.0 / 3350.0, 0.5, 0,
                           "assumption: half the BF16 rate (no REFERENCE anchor)"};
        // No anchor: ~2 µs per small kernel in a CUDA graph and half the HBM bandwidth. Stated
        // assumption; at decode sizes these kernels are a few % of a layer.
        p.elementwise = {2.0, 0.5, 1.0, 0, "assumption: 2 us fixed, 50% of HBM bandwidth"};
        // pplx-kernels (REFERENCE §3): latency from 1 token per rank on 2 ranks (20.9 / 19.8 µs),
        // bandwidth from 128 tokens per rank at EP8 over NVLink (83.6 / 102.3 µs).
        const double ep8_remote = 128 * v3::kTopK * 7.0 / 8.0;
        const double nv = h200.nvlink_bw;
        p.dispatch_nvlink = {20.9, ep8_remote * v3::kDispatchBytesPerCopy / ((83.6 - 20.9) * 1e-6) / nv,
                             "pplx-kernels NVLink anchors (REFERENCE §3)"};
        p.combine_nvlink = {19.8, ep8_remote * v3::kCombineBytesPerCopy / ((102.3 - 19.8) * 1e-6) / nv,
                            "pplx-kernels NVLink anchors (REFERENCE §3)"};
        // The seed: "our AllToAll reaches only half of InfiniBand's bandwidth" (REFERENCE §1: 1/3–1/2);
        // latency as over NVLink (no inter-node small-message anchor).
        p.dispatch_ib = {p.dispatch_nvlink.latency_us, 0.5, "seed: half of IB bandwidth; NVLink latency"};
        p.combine_ib = {p.combine_nvlink.latency_us, 0.5, "seed: half of IB bandwidth; NVLink latency"};
        // Peer copy measured 394 of 450 GB/s on 2×H200 (REFERENCE §3); 10 µs latency is an
        // assumption (an NCCL collective in a graph on one node).
        p.tp_collective = {10.0, 394.0 / 450.0, "peer copy 394/450 GB/s (REFERENCE §3); 10 us assumed"};
        p.notes.push_back(
            "defaults: the seed's kernels (DeepGEMM, FlashMLA, pplx-kernels anchors; seed IB efficiency)");
        return p;
    }();
    return cached;
}

}  // namespace fanout::plan
