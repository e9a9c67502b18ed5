// The memory plan: what fits, and refusals that name the flag to change.
#include "fanout/engine/memory_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "engine_test_util.h"
#include "fanout/model/synthetic.h"
#include "test_util.h"

namespace fanout::engine {
namespace {

using ::testing::HasSubstr;

MemoryRequest request() {
    MemoryRequest r;
    r.where = "GPU 0";
    r.total_bytes = 100e9;
    r.utilization = 0.9;
    r.weight_bytes = 30e9;
    r.workspace_bytes = 5e9;
    r.graph_bytes = 1e9;
    r.kv_block_bytes = 1e6;
    return r;
}

std::string refusal(const MemoryRequest& r) {
    try {
        plan_memory(r);
    } catch (const Error& e) {
        return e.what();
    }
    return "(accepted)";
}

TEST(MemoryPlan, KvTakesWhatIsLeftOrWhatIsAsked) {
    MemoryRequest r = request();
    MemoryPlan p = plan_memory(r);
    EXPECT_DOUBLE_EQ(p.budget_bytes, 90e9);
    EXPECT_DOUBLE_EQ(p.fixed_bytes, 36e9);
    EXPECT_EQ(p.kv_blocks, 54000);  // (90 − 36) GB / 1 MB
    r.kv_bytes = 8e9;
    p = plan_memory(r);
    EXPECT_EQ(p.kv_blocks, 8000);
    EXPECT_THAT(p.summary, HasSubstr("KV cache 8.00 GB = 8000 blocks"));
}

TEST(MemoryPlan, RefusesWithWhatWasAskedWhatFitsAndTheFlag) {
    MemoryRequest r = request();
    r.kv_bytes = 100000e9;
    EXPECT_THAT(refusal(r), HasSubstr("--kv-memory-gb 100000.00 does not fit"));
    EXPECT_THAT(refusal(r), HasSubstr("at most --kv-memory-gb 54.00 fits"));
    r = request();
    r.workspace_bytes = 80e9;  // the step buffers at the configured limits
    EXPECT_THAT(refusal(r), HasSubstr("lower --max-num-seqs / --max-batched-tokens"));
    EXPECT_THAT(refusal(r), HasSubstr("GPU 0 has 100.00 GB × 0.90 = 90.00 GB"));
    r = request();
    r.weight_bytes = 95e9;
    EXPECT_THAT(refusal(r), HasSubstr("a smaller model"));
    r = request();
    r.utilization = 1.5;
    EXPECT_THAT(refusal(r), HasSubstr("utilization must be in (0, 1]"));
}

TEST(MemoryPlan, CpuWorkspaceGrowsWithTheLimits) {
    const io::ModelConfig c = model::preset_config("tiny", 1);
    const double base = cpu_step_workspace_bytes(c, 64, 2048);
    EXPECT_GT(base, 0);
    EXPECT_LT(base, 2e9);  // the tiny model's defaults fit any machine
    // One f32 logits row per sequence: 1e8 sequences of a 129,280-token vocabulary is 51.7 TB.
    EXPECT_GT(cpu_step_workspace_bytes(c, 100000000, 2048), 5e13);
    EXPECT_GT(cpu_step_workspace_bytes(c, 64, 4096), base);
    EXPECT_DOUBLE_EQ(kv_block_bytes(c, false, 64, DType::kF32), static_cast<double>(c.num_hidden_layers) * 64 * 80 * 4);
}

// With MTP drafting the GPU holds the MTP layer too — but not its embedding and head when they are
// copies of the model's (DeepSeek-V3's are), which the weight plan shares.
TEST(MemoryPlan, MtpWeightsCountTheLayerAndOnlyOwnEmbeddingAndHead) {
    const std::string copies = fanout::testing::temp_dir("memory_plan_mtp_copies"),
                      own = fanout::testing::temp_dir("memory_plan_mtp_own");
    io::ModelConfig c = model::preset_config("tiny", 2);
    c.vocab_size = 300;
    model::write_synthetic_model(copies, c, {});
    model::MakeModelOptions o;
    o.mtp_copies_embed_and_head = false;
    model::write_synthetic_model(own, c, o);
    const double plain = checkpoint_weight_bytes(copies, c), with_copies = checkpoint_weight_bytes(copies, c, {}, true),
                 with_own = checkpoint_weight_bytes(own, c, {}, true);
    const double table = static_cast<double>(c.vocab_size * c.hidden_size * 2);  // bf16
    EXPECT_GT(with_copies, plain);                                               // the MTP layer itself
    EXPECT_DOUBLE_EQ(with_own - with_copies, 2 * table);                         // its own embedding and head
    EXPECT_DOUBLE_EQ(checkpoint_weight_bytes(own, c), plain);
    std::filesystem::remove_all(copies);
    std::filesystem::remove_all(own);
}

// Tensor-parallel attention's copies: the plan's bytes are what a TP group's ranks hold.
TEST(MemoryPlan, TpAttentionCopiesAreWhatTheRanksHold) {
    const std::string dir = testing::write_tiny_model("memory_plan_tp", 300);
    const io::ModelConfig c = io::load_model_config(dir);
    double held = 0;
    for (int r = 0; r < 2; ++r) {
        const auto m = model::DeepseekV3::load(dir, ParallelConfig{r, 2, 2});
        for (const Tensor& t : m->weights().owned) held += static_cast<double>(t.nbytes());
    }
    EXPECT_DOUBLE_EQ(tp_attention_copy_bytes(c, 2, 1), held);
    EXPECT_DOUBLE_EQ(tp_attention_copy_bytes(c, 2, 3), 3 * held);
    EXPECT_EQ(tp_attention_copy_bytes(c, 1, 4), 0);
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fanout::engine
