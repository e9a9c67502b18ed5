// The cost model against the seed's claims (REFERENCE.md §1), with the H100/H200 presets and the
// default profile (the seed's kernels: DeepGEMM, FlashMLA and pplx-kernels anchors). Tolerances are
// the issue's; where the model disagrees with the seed the test pins what the model predicts and
// docs/PERF.md ("Deployment planner (issue 8)") says why.
#include "fanout/plan/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "fanout/plan/seed_reference.h"
#include "fanout/plan/sweep.h"
#include "test_util.h"

namespace fanout::plan {
namespace {

Deployment deployment(int ep, int tp, int batch, Schedule s = Schedule::kDispatchOverlap) {
    Deployment d;
    d.ep = ep;
    d.tp = tp;
    d.batch = batch;
    d.schedule = s;
    return d;
}

TEST(PlanCostModel, Ep8Tp8Batch1OnOneH200NodeExceeds100TokPerSecond) {
    const Prediction p = predict(deployment(8, 8, 1), h200_sxm(), default_profile());
    EXPECT_GT(p.speed, 100.0) << "step " << p.step_us << " us";
    EXPECT_TRUE(p.fits);
    // 2 tokens → ~2 active experts per GPU (the seed: "2·8/8 = 2").
    const auto ks = layer_kernels(p.d, h200_sxm(), default_profile(), 1);
    for (const auto& k : ks)
        if (k.name == "grouped_gate_up") {
            EXPECT_NEAR(k.bytes / (4096.0 * 7168), 2.0, 0.1);
        }
}

TEST(PlanCostModel, SeedBreakdownTotalsWithin20Percent) {
    for (const auto& row : kSeedBreakdown) {
        const LayerTime lt = moe_layer_time(seed_breakdown_deployment(row), h100_sxm(), default_profile());
        EXPECT_NEAR(lt.total_us / row.total_us, 1.0, 0.20) << row.label << ": model " << lt.total_us;
    }
}

TEST(PlanCostModel, SeedBreakdownColumns) {
    auto time = [](int ep, Schedule s) {
        SeedBreakdownRow row{"", ep, s, 0, 0, 0, 0};
        return moe_layer_time(seed_breakdown_deployment(row), h100_sxm(), default_profile());
    };
    const LayerTime no = time(128, Schedule::kNoOverlap), mb = time(128, Schedule::kMicroBatch);
    const LayerTime ep8 = time(8, Schedule::kDispatchOverlap);
    EXPECT_NEAR(no.dispatch_us / 593, 1.0, 0.20) << no.dispatch_us;
    EXPECT_NEAR(no.combine_us / 1012, 1.0, 0.20) << no.combine_us;
    EXPECT_NEAR(ep8.grouped_gemm_us / 555, 1.0, 0.20) << ep8.grouped_gemm_us;
    // Microbatch: the seed cut communication by 1001 µs and the total by 771 µs.
    const double comm_cut = (no.dispatch_us + no.combine_us) - (mb.dispatch_us + mb.combine_us);
    EXPECT_NEAR(comm_cut / 1001, 1.0, 0.20) << comm_cut;
    EXPECT_NEAR((no.total_us - mb.total_us) / 771, 1.0, 0.20) << no.total_us - mb.total_us;
    // Disagreement (docs/PERF.md): EP128's GroupGEMM is compute-bound here, and DeepGEMM's measured
    // rate at this point (178 µs on an H200, REFERENCE §3) puts it near 180 µs, not the seed's 270.
    EXPECT_GT(no.grouped_gemm_us, 150.0);
    EXPECT_LT(no.grouped_gemm_us, 0.8 * 270);
}

TEST(PlanCostModel, MicrobatchLosesBelowBatch32AndWinsFrom32) {
    for (int b : {4, 8, 16, 32, 64, 128}) {
        const double overlap = moe_layer_time(deployment(128, 1, b), h100_sxm(), default_profile()).total_us;
        const double micro =
            moe_layer_time(deployment(128, 1, b, Schedule::kMicroBatch), h100_sxm(), default_profile()).total_us;
        if (b < 32)
            EXPECT_GT(micro, overlap) << "batch " << b;
        else
            EXPECT_LT(micro, overlap) << "batch " << b;
    }
}

TEST(PlanCostModel, Ep8Dp8CannotReachBatch128PerGpu) {
    const Prediction b128 = predict(deployment(8, 1, 128), h200_sxm(), default_profile());
    EXPECT_FALSE(b128.fits) << b128.memory_total / 1e9 << " GB";
    EXPECT_GE(b128.max_batch, 70);  // "~100 requests per GPU"
    EXPECT_LT(b128.max_batch, 128);
    EXPECT_TRUE(predict(deployment(8, 1, 64), h200_sxm(), default_profile()).fits);
    EXPECT_TRUE(predict(deployment(128, 1, 128), h100_sxm(), default_profile()).fits);
}

TEST(PlanCostModel, Ep128HasSeveralTimesEp8ThroughputAt40To80TokPerSecond) {
    const auto points = run_sweep(SweepOptions{}, default_profile());
    const auto ep8 = pareto_frontier(points, 8), ep128 = pareto_frontier(points, 128);
    double log_sum = 0;
    for (double s : {40.0, 50.0, 60.0, 70.0, 80.0}) {
        const double lo = frontier_throughput_at(ep8, s), hi = frontier_throughput_at(ep128, s);
        ASSERT_GT(lo, 0) << s;
        ASSERT_GT(hi, 0) << s;
        EXPECT_GT(hi, lo) << "EP128 ahead at " << s << " tok/s";
        log_sum += std::log(hi / lo);
    }
    // The seed: "~5×". Here: the geometric mean over 40..80 tok/s within a factor 1.6 of 5. (At
    // 40 tok/s alone the model gives only ~1.3×: docs/PERF.md.)
    const double geo = std::exp(log_sum / 5);
    EXPECT_GT(geo, 3.0);
    EXPECT_LT(geo, 8.0);
}

TEST(PlanCostModel, MtpAndTpEffects) {
    // One draft token at 60%: 1.6 tokens per step; no drafts: 1 token and a cheaper step.
    const Prediction mtp = predict(deployment(64, 1, 16), h100_sxm(), default_profile());
    EXPECT_DOUBLE_EQ(mtp.tokens_per_step, 1.6);
    Deployment plain = deployment(64, 1, 16);
    plain.draft_tokens = 0;
    const Prediction p0 = predict(plain, h100_sxm(), default_profile());
    EXPECT_DOUBLE_EQ(p0.tokens_per_step, 1.0);
    EXPECT_LT(p0.step_us, mtp.step_us);
    // Each draft past the first runs the MTP layer again (one token per request), as the engine
    // does: three drafts cost at least two more MoE layers at query 1 than one draft (before, the
    // model priced one pass whatever the count, so 7 drafts looked 6x faster than 1).
    Deployment three = deployment(64, 1, 16);
    three.draft_tokens = 3;
    const Prediction p3 = predict(three, h100_sxm(), default_profile());
    const double layer_q1 = p0.moe_layer_us;  // plain: query 1
    EXPECT_GT(p3.mtp_us - mtp.mtp_us, 2 * layer_q1);
    EXPECT_GT(p3.step_us, mtp.step_us + 2 * layer_q1);
    // TP replicates the latent: qkv_a costs the same on every rank; q_b shrinks with TP.
    auto kernel = [](const Deployment& d, const std::string& name) {
        for (const auto& k : layer_kernels(d, h100_sxm(), default_profile(), d.batch))
            if (k.name == name) return k;
        return KernelCost{};
    };
    EXPECT_DOUBLE_EQ(kernel(deployment(64, 4, 16), "qkv_a").bytes, kernel(deployment(64, 1, 16), "qkv_a").bytes);
    EXPECT_LT(kernel(deployment(64, 4, 16), "q_b").bytes, kernel(deployment(64, 1, 16), "q_b").bytes / 3);
}

TEST(PlanCostModel, BadDeploymentsAreClearErrors) {
    const Profile prof = default_profile();
    EXPECT_NE(testing::error_of([&] { predict(deployment(3, 1, 1), h100_sxm(), prof); }).find("EP 3 must divide"),
              std::string::npos);
    EXPECT_NE(testing::error_of([&] { predict(deployment(8, 3, 1), h100_sxm(), prof); }).find("TP 3 must be"),
              std::string::npos);
    EXPECT_NE(testing::error_of([&] { predict(deployment(4, 8, 1), h100_sxm(), prof); }).find("TP 8 must divide EP 4"),
              std::string::npos);
    EXPECT_NE(testing::error_of([&] { predict(deployment(8, 1, 0), h100_sxm(), prof); }).find("batch 0"),
              std::string::npos);
    EXPECT_NE(testing::error_of([&] {
                  predict(deployment(8, 1, 1, Schedule::kMicroBatch), h100_sxm(), prof);
              }).find("needs batch >= 2"),
              std::string::npos);
    EXPECT_NE(testing::error_of([] { parse_schedule("pipelined"); }).find("unknown schedule 'pipelined'"),
              std::string::npos);
    Deployment f32 = deployment(8, 1, 1);
    f32.kv_dtype = DType::kF32;
    EXPECT_NE(testing::error_of([&] { predict(f32, h100_sxm(), prof); }).find("bf16 or fp8, not F32"),
              std::string::npos);
}

// An FP8 KV cache in the default profile (no FP8 measurement): the same weights, 1.76× the
// requests in memory, and attention no slower (fewer bytes at the bf16 kernel's rates).
TEST(PlanCostModel, Fp8KvCacheFitsMoreRequests) {
    const Profile prof = default_profile();
    Deployment d = deployment(8, 1, 64);
    const Prediction bf16 = predict(d, h200_sxm(), prof);
    d.kv_dtype = DType::kFP8E4M3;
    const Prediction fp8 = predict(d, h200_sxm(), prof);
    EXPECT_DOUBLE_EQ(fp8.memory.weights, bf16.memory.weights);
    EXPECT_LT(fp8.memory.kv, 0.6 * bf16.memory.kv);
    EXPECT_GT(fp8.max_batch, 1.7 * bf16.max_batch);
    EXPECT_LE(fp8.moe_layer_us, bf16.moe_layer_us);
    auto attention = [&](const Deployment& dep) {
        for (const KernelCost& k : layer_kernels(dep, h200_sxm(), prof, 64))
            if (k.name == "attention") return k;
        ADD_FAILURE() << "no attention kernel";
        return KernelCost{};
    };
    EXPECT_NEAR(attention(deployment(8, 1, 64)).bytes - attention(d).bytes, 64 * 5000 * (1152.0 - 656.0), 1.0);
    EXPECT_LE(attention(d).us, attention(deployment(8, 1, 64)).us);
}

TEST(PlanEfficiency, FitRecoversAKnownRoofline) {
    const Roofline truth{4.0, 0.7, 0.5, 0, ""};
    std::vector<RooflineSample> s;
    for (double m : {16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0}) {
        const double bytes = gemm_bytes(m, 4096, 7168), flops = 2 * m * 4096 * 7168;
        s.push_back({bytes, flops, truth.time_us(bytes, flops, 3.35e12, 1979e12)});
    }
    const RooflineFit fit = fit_roofline(s, 3.35e12, 1979e12);
    EXPECT_LT(fit.max_rel_error, 0.01);
    EXPECT_NEAR(fit.roofline.bw_eff, 0.7, 0.011);
    EXPECT_NEAR(fit.roofline.flop_eff, 0.5, 0.011);
    EXPECT_NEAR(fit.roofline.fixed_us, 4.0, 0.3);
    EXPECT_NE(testing::error_of([] { fit_roofline({{1, 1, 1}}, 1, 1); }).find("at least 3"), std::string::npos);
}

TEST(PlanEfficiency, DefaultProfileFitsItsAnchors) {
    const Profile p = default_profile();
    const Hardware h200 = h200_sxm();
    // The fitted rooflines reproduce DeepGEMM's decode points (M ≤ 256) and grouped points.
    for (const auto& s : deepgemm_grouped_anchor_samples())
        EXPECT_NEAR(p.grouped.time_us(s.bytes, s.flops, h200.hbm_bw, h200.fp8_flops) / s.us, 1.0, 0.15) << s.us;
    double dense_sum = 0, model_sum = 0;
    const auto dense = deepgemm_dense_anchor_samples();
    for (size_t i = 0; i < dense.size(); i += 5) {  // M = 64 of each shape
        dense_sum += dense[i].us;
        model_sum += p.gemm.time_us(dense[i].bytes, dense[i].flops, h200.hbm_bw, h200.fp8_flops);
    }
    EXPECT_NEAR(model_sum / dense_sum, 1.0, 0.15);  // the six at M = 64: 86.0 µs
}

}  // namespace
}  // namespace fanout::plan
