// model::step_flops and attention_cost_per_pair against hand counts for the tiny preset and
// DeepSeek-V3's own config (tests/fixtures/configs).
#include "fanout/model/step_cost.h"

#include <gtest/gtest.h>

#include "fanout/model/synthetic.h"
#include "test_util.h"

namespace fanout::model {
namespace {

TEST(StepCost, TinyPresetByHand) {
    const io::ModelConfig c = preset_config("tiny");  // 3 layers (1 dense), 4 heads, hidden 256
    const StepFlops f = step_flops(c);
    EXPECT_DOUBLE_EQ(f.attention_per_pair, 3.0 * 4 * (32 + 16 + 32) * 2);
    const double attn =
        256.0 * 96 + 96.0 * 4 * 48 + 256.0 * 80 + 64.0 * 4 * 64 + 4.0 * 32 * 256;  // q_a q_b kv_a kv_b o
    const double dense = 3.0 * 256 * 320;
    const double moe = 16.0 * 256 + (1 + 4) * 3.0 * 256 * 96;  // router, shared + top-4 experts
    EXPECT_DOUBLE_EQ(f.layers_per_token, 2.0 * (3 * attn + dense + 2 * moe));
    EXPECT_DOUBLE_EQ(f.lm_head_per_token, 2.0 * 129280 * 256);
    EXPECT_DOUBLE_EQ(f.latent_expansion_per_context_token, 3 * 2.0 * 64 * 4 * (32 + 32));
    EXPECT_NEAR(f.latent_expansion_per_context_token / f.layers_per_token, 0.037, 0.001);
    EXPECT_DOUBLE_EQ(attention_cost_per_pair(c), f.attention_per_pair / f.layers_per_token);
    EXPECT_NEAR(attention_cost_per_pair(c), 7.22e-4, 1e-6);
    EXPECT_NEAR(attention_cost_per_pair(c, true), 2.79e-5, 1e-7);
    // Absorbed: (2·64 + 16)·2 per head-layer against the MHA form's 160; expansion 2·64·64.
    EXPECT_DOUBLE_EQ(f.absorbed_attention_per_pair, 3.0 * 4 * (2 * 64 + 16) * 2);
    EXPECT_EQ(absorbed_form_max_query(c), 64);  // 8192 / (288 − 160)
}

TEST(StepCost, DeepSeekV3Config) {
    const io::ModelConfig c =
        io::load_model_config(std::string(FANOUT_SOURCE_DIR) + "/tests/fixtures/configs/deepseek_v3");
    const StepFlops f = step_flops(c);
    EXPECT_DOUBLE_EQ(f.attention_per_pair, 61.0 * 128 * (128 + 64 + 128) * 2);
    EXPECT_NEAR(f.layers_per_token / 2, 35.7e9, 0.1e9);  // 37B active, less embedding and lm_head
    EXPECT_NEAR(attention_cost_per_pair(c), 7.0e-5, 0.01e-5);
    EXPECT_NEAR(f.latent_expansion_per_context_token / f.layers_per_token, 0.0287, 0.0005);
    EXPECT_NEAR(attention_cost_per_pair(c, true), 6.82e-5, 0.01e-5);
    EXPECT_EQ(absorbed_form_max_query(c), 170);  // 2·512·256 / ((2·512 + 64)·2 − 640)
}

}  // namespace
}  // namespace fanout::model
