// How fast kernels and links run relative to the datasheet: the planner's efficiency profile.
//
// A kernel's time is a roofline with an efficiency curve:
//     t = fixed_us + combine(bytes / (bw_eff · HBM bandwidth), flops / (flop_eff · peak rate))
// where combine is max() when `p` is 0 and the p-norm (m^p + c^p)^(1/p) otherwise (a kernel near
// the ridge point runs slower than either bound alone; the p-norm is that curve). A link's time is
//     t = latency_us + bytes / (eff · link bandwidth).
//
// The default profile is fitted on anchors measured with the seed's own kernels (REFERENCE.md §3:
// DeepGEMM dense and grouped on an H200, FlashMLA, pplx-kernels) plus the seed's statement that
// its AllToAll reaches half of InfiniBand's bandwidth. Calibration (calibration.h) replaces parts
// of it with fits on fanout's own benchmark JSON.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fanout/plan/hardware.h"

namespace fanout::plan {

struct Roofline {
    double fixed_us = 0;
    double bw_eff = 1;    // fraction of the datasheet HBM bandwidth
    double flop_eff = 1;  // fraction of the datasheet rate (FP8 or BF16, per kernel)
    double p = 0;         // 0: max(); otherwise the p-norm of the two bounds
    std::string source;

    double time_us(double bytes, double flops, double hbm_bw, double flop_rate) const;
};

struct EfficiencyPoint {
    double rows = 0;  // the measured kernel's work size (for attention: query rows)
    double eff = 0;   // fraction of the datasheet rate
};
// eff at `rows`: piecewise linear in log(rows) through `curve` (sorted by rows), constant outside.
double interpolate_efficiency(const std::vector<EfficiencyPoint>& curve, double rows);

struct LinkModel {
    double latency_us = 0;
    double eff = 1;  // fraction of the datasheet link bandwidth
    std::string source;

    double time_us(double bytes, double link_bw) const { return latency_us + bytes / (eff * link_bw) * 1e6; }
};

struct Profile {
    Roofline gemm;           // dense FP8 GEMMs and the MLA BMMs (block-scaled)
    Roofline grouped;        // the routed experts' grouped GEMM (masked layout)
    Roofline attention;      // MLA decode (absorbed form), BF16 math
    Roofline mha_attention;  // MLA prefill in the MHA form (causal flash attention), BF16 math
    Roofline elementwise;    // norms, RoPE + KV append, activation quant, silu·mul, top-k
    LinkModel dispatch_nvlink, combine_nvlink, dispatch_ib, combine_ib;
    LinkModel tp_collective;  // reduce-scatter / all-gather inside a TP group (NVLink)
    // MLA decode measured as a whole kernel (`bench mla`): its fraction of the BF16 datasheet rate
    // against the query rows it runs (requests × query × heads), interpolated in log(rows) and held
    // at the ends; the time is max(FLOPs / (eff · rate), bytes / the attention roofline's bandwidth).
    // Empty: the `attention` roofline.
    std::vector<EfficiencyPoint> attention_curve;
    // The same kernel over the FP8 KV cache (`bench mla`'s rows with "cache": "fp8"), used when a
    // deployment stores FP8 entries. Empty: the BF16 cache's curve, with the FP8 entries' bytes.
    std::vector<EfficiencyPoint> attention_fp8_curve;
    // The MHA-form prefill kernel measured by `bench mla` (its "prefill" rows): its fraction of the
    // BF16 datasheet rate against the query tokens per request, interpolated the same way. Empty:
    // the `mha_attention` roofline.
    std::vector<EfficiencyPoint> mha_attention_curve;
    // Per named kernel, µs added to the class model: what our runner's kernel costs beyond what a
    // kernel benchmark runs (the activation-quant launch before each FP8 GEMM, small kernels'
    // launch and setup), from a `bench layer` JSON's smallest-batch points (calibration.h).
    std::map<std::string, double> kernel_extra_us;
    std::vector<std::string> notes;  // where each part came from, for `fanout plan` to print
};

// The default profile (see the file comment); the same for every hardware preset, as fractions of
// that preset's datasheet figures.
Profile default_profile();

// One measured kernel: its bytes moved, FLOPs and time.
struct RooflineSample {
    double bytes = 0, flops = 0, us = 0;
};

struct RooflineFit {
    Roofline roofline;
    double max_rel_error = 0;  // over the samples
    double rms_rel_error = 0;
};

// Least relative squared error fit of (fixed_us, bw_eff, flop_eff, p) over a grid, on hardware
// with `hbm_bw` bytes/s and `flop_rate` FLOP/s. Needs at least 3 samples.
RooflineFit fit_roofline(const std::vector<RooflineSample>& samples, double hbm_bw, double flop_rate);

// The samples behind the default profile (REFERENCE.md §3, DeepGEMM on one H200), built with the
// same byte/FLOP accounting as the cost model; exposed for tests and `fanout plan calibrate`.
std::vector<RooflineSample> deepgemm_dense_anchor_samples();
std::vector<RooflineSample> deepgemm_grouped_anchor_samples();

// Bytes a dense FP8 GEMM [m, k] × [k, n] moves: FP8 A and B (+ scales), BF16 C. When
// `weights_in_l2`, B is not counted (a benchmark replaying one small weight keeps it in L2).
double gemm_bytes(double m, double n, double k, bool weights_in_l2 = false);
// A grouped GEMM over `experts` experts with `tokens` rows in all.
double grouped_gemm_bytes(double experts, double tokens, double n, double k);
// L2 of an H100/H200 (50 MB, datasheet); benchmark weights below it stay cached between calls.
constexpr double kL2Bytes = 50e6;

}  // namespace fanout::plan
