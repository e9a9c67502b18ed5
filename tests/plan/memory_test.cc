// The planner's memory model against the seed's statements (REFERENCE.md §1): EP8 DP8 TP1 on an
// 8×H200 node holds ~100 GB of weights per GPU and ~100 requests of 5,000 tokens — not 128; an
// 8×H100 node cannot hold the model; at EP128 the H100s have room for batch 128.
#include "fanout/plan/memory.h"

#include <gtest/gtest.h>

#include "fanout/plan/hardware.h"
#include "test_util.h"

namespace fanout::plan {
namespace {

TEST(PlanMemory, TheSeedsSingleNodeStatements) {
    const MemoryPlan ep8 = plan_memory(8, 1, 0, 5000);
    EXPECT_GT(ep8.weights, 95e9);
    EXPECT_LT(ep8.weights, 110e9);  // "~100 GB weights per GPU"
    EXPECT_NEAR(ep8.kv_per_request, 5000 * 70272.0, 1.0);
    const int h200 = max_requests_per_gpu(h200_sxm(), 8, 1, 5000);
    EXPECT_GE(h200, 70);                                         // "~100 requests per GPU"
    EXPECT_LT(h200, 128);                                        // "EP8 cannot reach batch 128 per GPU"
    EXPECT_EQ(max_requests_per_gpu(h100_sxm(), 8, 1, 5000), 0);  // "H100×8 cannot hold the model"
}

TEST(PlanMemory, LargerEpFreesRoomAndTpReplicatesTheLatent) {
    EXPECT_GE(max_requests_per_gpu(h100_sxm(), 128, 1, 5000), 128);
    const MemoryPlan tp1 = plan_memory(64, 1, 10, 5000), tp4 = plan_memory(64, 4, 10, 5000);
    EXPECT_LT(tp4.weights, tp1.weights);   // q_b, kv_b, o_proj, dense MLPs, embeddings sharded
    EXPECT_DOUBLE_EQ(tp4.kv, 4 * tp1.kv);  // each rank stores the group's whole latent KV
    EXPECT_LT(max_requests_per_gpu(h200_sxm(), 64, 4, 5000), max_requests_per_gpu(h200_sxm(), 64, 1, 5000));
}

// The FP8 KV cache (`--kv-dtype fp8`): 656-byte entries (e4m3 latent, a scale per 128, bf16
// rope) instead of 1,152, so the same memory holds 1.76× the tokens; weights do not change.
TEST(PlanMemory, Fp8KvEntriesHoldMoreRequests) {
    EXPECT_DOUBLE_EQ(kv_bytes_per_token(DType::kBF16), 61 * 1152.0);
    EXPECT_DOUBLE_EQ(kv_bytes_per_token(DType::kFP8E4M3), 61 * 656.0);
    const MemoryPlan bf16 = plan_memory(8, 1, 10, 5000), fp8 = plan_memory(8, 1, 10, 5000, DType::kFP8E4M3);
    EXPECT_DOUBLE_EQ(fp8.weights, bf16.weights);
    EXPECT_DOUBLE_EQ(fp8.kv_per_request, 5000 * 61 * 656.0);
    const int b = max_requests_per_gpu(h200_sxm(), 8, 1, 5000),
              f = max_requests_per_gpu(h200_sxm(), 8, 1, 5000, DType::kFP8E4M3);
    EXPECT_NEAR(double(f) / b, 1152.0 / 656.0, 0.03) << b << " vs " << f;
    // An instance of two TP ranks: each stores its whole batch's latent KV.
    EXPECT_NEAR(max_batch_per_instance(h200_sxm(), 8, 2, 5000, DType::kFP8E4M3),
                2 * max_requests_per_gpu(h200_sxm(), 8, 2, 5000, DType::kFP8E4M3), 1);
    EXPECT_NE(testing::error_of([] { plan_memory(8, 1, 1, 10, DType::kF32); }).find("bf16 or fp8, not F32"),
              std::string::npos);
}

TEST(PlanMemory, BadLayoutsAreClearErrors) {
    EXPECT_NE(testing::error_of([] { plan_memory(3, 1, 1, 10); }).find("EP 3 must divide"), std::string::npos);
    EXPECT_NE(testing::error_of([] { plan_memory(8, 3, 1, 10); }).find("TP 3 must divide"), std::string::npos);
    EXPECT_NE(testing::error_of([] { hardware_preset("a100"); }).find("unknown hardware preset 'a100'"),
              std::string::npos);
}

}  // namespace
}  // namespace fanout::plan
