// Tests of io::parse_model_config over the fixtures in tests/fixtures/configs/: every field of
// DeepSeek-V3's published config.json, the transformers-5 spelling, the direct-q variant; and
// each way a config can be wrong, whose Error must name the field and the value found.
#include "fanout/io/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "fanout/core/error.h"
#include "io_test_util.h"
#include "test_util.h"

namespace fanout::io {
namespace {

namespace fs = std::filesystem;
using ::fanout::testing::error_of;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kConfigs = std::string(FANOUT_SOURCE_DIR) + "/tests/fixtures/configs";

json load_fixture(const std::string& name) {
    return json::parse(fanout::testing::read_file(kConfigs + "/" + name + "/config.json"));
}

ModelConfig parse(const json& j) { return parse_model_config(j.dump(), "test/config.json"); }

// The message of the Error that parsing `j` raises; checks it names the source.
std::string parse_error(const json& j) {
    const std::string msg = error_of([&] { parse(j); });
    EXPECT_THAT(msg, HasSubstr("test/config.json"));
    return msg;
}

// DeepSeek-V3's config with one field replaced (or removed, for a discarded json).
json v3_with(const std::string& key, const json& value) {
    json j = load_fixture("deepseek_v3");
    if (value.is_discarded())
        j.erase(key);
    else
        j[key] = value;
    return j;
}

json v3_with_rope(const std::string& key, const json& value) {
    json j = load_fixture("deepseek_v3");
    if (value.is_discarded())
        j["rope_scaling"].erase(key);
    else
        j["rope_scaling"][key] = value;
    return j;
}

json v3_with_quant(const std::string& key, const json& value) {
    json j = load_fixture("deepseek_v3");
    j["quantization_config"][key] = value;
    return j;
}

const json kRemove = json::value_t::discarded;

// Checks every field of the DeepSeek-V3 (671B) configuration.
void expect_deepseek_v3(const ModelConfig& c) {
    EXPECT_EQ(c.vocab_size, 129280);
    EXPECT_EQ(c.hidden_size, 7168);
    EXPECT_EQ(c.intermediate_size, 18432);
    EXPECT_EQ(c.moe_intermediate_size, 2048);
    EXPECT_EQ(c.num_hidden_layers, 61);
    EXPECT_EQ(c.num_nextn_predict_layers, 1);
    EXPECT_EQ(c.num_attention_heads, 128);
    EXPECT_EQ(c.n_shared_experts, 1);
    EXPECT_EQ(c.n_routed_experts, 256);
    EXPECT_EQ(c.num_experts_per_tok, 8);
    EXPECT_EQ(c.n_group, 8);
    EXPECT_EQ(c.topk_group, 4);
    EXPECT_EQ(c.first_k_dense_replace, 3);
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_EQ(c.routed_scaling_factor, 2.5);
    EXPECT_EQ(c.q_lora_rank, 1536);
    EXPECT_EQ(c.kv_lora_rank, 512);
    EXPECT_EQ(c.qk_nope_head_dim, 128);
    EXPECT_EQ(c.qk_rope_head_dim, 64);
    EXPECT_EQ(c.v_head_dim, 128);
    EXPECT_EQ(c.max_position_embeddings, 163840);
    EXPECT_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_EQ(c.rope_theta, 10000.0);
    ASSERT_TRUE(c.yarn.has_value());
    EXPECT_EQ(c.yarn->factor, 40.0);
    EXPECT_EQ(c.yarn->original_max_position_embeddings, 4096);
    EXPECT_EQ(c.yarn->beta_fast, 32.0);
    EXPECT_EQ(c.yarn->beta_slow, 1.0);
    EXPECT_EQ(c.yarn->mscale, 1.0);
    EXPECT_EQ(c.yarn->mscale_all_dim, 1.0);
    EXPECT_TRUE(c.yarn->truncate);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_THAT(c.eos_token_ids, ElementsAre(1));
    EXPECT_EQ(c.bos_token_id, 0);
    ASSERT_TRUE(c.fp8.has_value());
    EXPECT_EQ(c.fp8->block_n, 128);
    EXPECT_EQ(c.fp8->block_k, 128);

    EXPECT_EQ(c.qk_head_dim(), 192);
    EXPECT_EQ(c.kv_entry_dim(), 576);
    for (int64_t layer = 0; layer < 3; ++layer) EXPECT_FALSE(c.is_moe_layer(layer)) << layer;
    for (int64_t layer = 3; layer < 61; ++layer) EXPECT_TRUE(c.is_moe_layer(layer)) << layer;
    // 192^-0.5 * (0.1 * ln 40 + 1)^2
    const double mscale = 0.1 * std::log(40.0) + 1.0;
    EXPECT_DOUBLE_EQ(c.softmax_scale(), mscale * mscale / std::sqrt(192.0));
    EXPECT_NEAR(c.softmax_scale(), 0.13523, 5e-6);
    EXPECT_DOUBLE_EQ(c.rope_attention_factor(), 1.0);  // mscale == mscale_all_dim
}

// ---------------------------------------------------------------------------------------------
// Valid configs

TEST(ModelConfigTest, DeepSeekV3EveryField) { expect_deepseek_v3(load_model_config(kConfigs + "/deepseek_v3")); }

TEST(ModelConfigTest, Transformers5RopeParameters) {
    expect_deepseek_v3(load_model_config(kConfigs + "/deepseek_v3_transformers5"));
}

TEST(ModelConfigTest, RopeThetaInsideRopeParametersWins) {
    json j = load_fixture("deepseek_v3_transformers5");
    j["rope_parameters"]["rope_theta"] = 50000.0;
    j["rope_theta"] = 123.0;
    EXPECT_EQ(parse(j).rope_theta, 50000.0);
    j["rope_parameters"].erase("rope_theta");
    EXPECT_EQ(parse(j).rope_theta, 123.0) << "beside rope_parameters, as some writers put it";
}

// Both spellings of the rope settings: the same is fine, different is refused (transformers 5
// takes rope_scaling, 4 reads only rope_scaling's scaling; before, fanout silently took
// rope_parameters).
TEST(ModelConfigTest, RopeParametersAndRopeScalingMustAgree) {
    json j = load_fixture("deepseek_v3_transformers5");
    j["rope_scaling"] = j["rope_parameters"];
    EXPECT_EQ(parse(j).yarn->factor, 40.0);
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
    EXPECT_THAT(parse_error(j), HasSubstr("'rope_parameters' ({"));
    EXPECT_THAT(parse_error(j), HasSubstr("disagree; keep the one meant"));
}

TEST(ModelConfigTest, DirectQWithoutRopeScalingOrQuantization) {
    const ModelConfig c = load_model_config(kConfigs + "/direct_q");
    EXPECT_EQ(c.q_lora_rank, 0);
    EXPECT_FALSE(c.yarn.has_value());
    EXPECT_FALSE(c.fp8.has_value());
    EXPECT_EQ(c.num_nextn_predict_layers, 0);
    EXPECT_EQ(c.n_group, 1);
    EXPECT_EQ(c.topk_group, 1);
    EXPECT_EQ(c.n_shared_experts, 2);
    EXPECT_EQ(c.num_experts_per_tok, 6);
    EXPECT_FALSE(c.norm_topk_prob);
    EXPECT_EQ(c.routed_scaling_factor, 1.0);
    EXPECT_THAT(c.eos_token_ids, ElementsAre(100001, 100008));
    EXPECT_EQ(c.bos_token_id, 100000);
    EXPECT_FALSE(c.is_moe_layer(0));
    EXPECT_TRUE(c.is_moe_layer(1));
    EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
    EXPECT_EQ(c.rope_attention_factor(), 1.0);
}

TEST(ModelConfigTest, QLoraRankNullOrAbsent) {
    EXPECT_EQ(parse(v3_with("q_lora_rank", nullptr)).q_lora_rank, 0);     // HF's None: the direct q projection
    EXPECT_EQ(parse(v3_with("q_lora_rank", kRemove)).q_lora_rank, 1536);  // HF's default
}

TEST(ModelConfigTest, DenseModelNeedsNoMoeFields) {
    json j = load_fixture("direct_q");
    for (const char* key :
         {"moe_intermediate_size", "num_experts_per_tok", "n_group", "topk_group", "n_shared_experts"})
        j.erase(key);
    j["n_routed_experts"] = nullptr;  // None in DeepSeek's model code: every layer dense
    const ModelConfig c = parse(j);
    EXPECT_EQ(c.n_routed_experts, 0);
    for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) EXPECT_FALSE(c.is_moe_layer(layer));
    EXPECT_EQ(parse(json::parse(model_config_to_json(c))).n_routed_experts, 0);  // written back: still dense
}

// A key left out takes HF DeepseekV3Config's default, as transformers would load the checkpoint
// (before, the MoE keys defaulted to other values: 0 dense layers, 1 group, scaling 1, no shared
// expert — the same checkpoint then gave other tokens than HF's, without a word).
TEST(ModelConfigTest, Defaults) {
    json j = load_fixture("direct_q");
    for (const char* key :
         {"hidden_act", "scoring_func", "topk_method", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
          "num_nextn_predict_layers", "first_k_dense_replace", "moe_layer_freq", "norm_topk_prob",
          "routed_scaling_factor", "bos_token_id", "eos_token_id", "n_group", "topk_group", "n_shared_experts",
          "moe_intermediate_size", "num_experts_per_tok", "attention_bias"})
        j.erase(key);
    const ModelConfig c = parse(j);
    EXPECT_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_EQ(c.rope_theta, 10000.0);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.first_k_dense_replace, 3);
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_EQ(c.routed_scaling_factor, 2.5);
    EXPECT_EQ(c.bos_token_id, -1);
    EXPECT_TRUE(c.eos_token_ids.empty());
    EXPECT_EQ(c.n_group, 8);
    EXPECT_EQ(c.topk_group, 4);
    EXPECT_EQ(c.n_shared_experts, 1);
    EXPECT_EQ(c.moe_intermediate_size, 2048);
    EXPECT_EQ(c.num_experts_per_tok, 8);
    j.erase("n_routed_experts");
    EXPECT_EQ(parse(j).n_routed_experts, 256);
}

// Null where HF gives it no meaning is an error naming the field, not a silent default.
TEST(ModelConfigErrorTest, NullWhereHfHasNoNone) {
    for (const char* key : {"moe_intermediate_size", "num_experts_per_tok", "n_group", "topk_group",
                            "routed_scaling_factor", "first_k_dense_replace"}) {
        SCOPED_TRACE(key);
        EXPECT_THAT(parse_error(v3_with(key, nullptr)),
                    HasSubstr(fmt::format("field '{}' is null; leave it out for HF's default", key)));
    }
    EXPECT_EQ(parse(v3_with("n_shared_experts", nullptr)).n_shared_experts, 0);  // DeepSeek's code: none
}

// Sizes each within range whose product would leave int64 (before: a wrapped shape in a later
// message, signed overflow on the way) are refused, naming the fields.
TEST(ModelConfigErrorTest, WeightElementCountsAreBounded) {
    json j = load_fixture("deepseek_v3");
    for (const char* key : {"num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim"}) j[key] = 2147483648LL;
    EXPECT_THAT(parse_error(j), HasSubstr("the query projection (num_attention_heads=2147483648 × qk_head_dim="));
    j = load_fixture("deepseek_v3");
    j["vocab_size"] = 2147483648LL;
    j["hidden_size"] = 1 << 20;
    EXPECT_THAT(parse_error(j),
                HasSubstr("the embedding (vocab_size=2147483648 × hidden_size=1048576) has more than 2^44 elements"));
}

TEST(ModelConfigErrorTest, AttentionBiasIsRefused) {
    EXPECT_THAT(parse_error(v3_with("attention_bias", true)), HasSubstr("attention_bias true is not supported"));
    EXPECT_EQ(parse(v3_with("attention_bias", false)).hidden_size, 7168);
}

TEST(ModelConfigTest, YarnDefaultsAndMscaleVariants) {
    json j = v3_with_rope("original_max_position_embeddings", kRemove);
    for (const char* key : {"beta_fast", "beta_slow", "mscale", "mscale_all_dim"}) j["rope_scaling"].erase(key);
    const ModelConfig c = parse(j);
    ASSERT_TRUE(c.yarn.has_value());
    EXPECT_EQ(c.yarn->original_max_position_embeddings, 163840) << "falls back to max_position_embeddings";
    EXPECT_EQ(c.yarn->beta_fast, 32.0);
    EXPECT_EQ(c.yarn->beta_slow, 1.0);
    // Without mscale_all_dim the softmax scale is plain and cos/sin carry mscale(factor).
    EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
    EXPECT_DOUBLE_EQ(c.rope_attention_factor(), 0.1 * std::log(40.0) + 1.0);

    j = v3_with_rope("mscale", 0.707);
    const ModelConfig d = parse(j);
    EXPECT_DOUBLE_EQ(d.rope_attention_factor(), (0.0707 * std::log(40.0) + 1.0) / (0.1 * std::log(40.0) + 1.0));

    j = v3_with_rope("mscale", kRemove);  // mscale_all_dim alone: cos/sin carry mscale(factor, 1)
    EXPECT_DOUBLE_EQ(parse(j).rope_attention_factor(), 0.1 * std::log(40.0) + 1.0);

    j = v3_with_rope("attention_factor", 1.25);  // given explicitly: used as is
    EXPECT_DOUBLE_EQ(parse(j).rope_attention_factor(), 1.25);

    j = v3_with_rope("truncate", false);
    EXPECT_FALSE(parse(j).yarn->truncate);
}

TEST(ModelConfigTest, RopeTypeDefaultMeansNoYarn) {
    json j = load_fixture("deepseek_v3_transformers5");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 20000.0}};
    const ModelConfig c = parse(j);
    EXPECT_FALSE(c.yarn.has_value());
    EXPECT_EQ(c.rope_theta, 20000.0);
    EXPECT_FALSE(parse(v3_with("rope_scaling", nullptr)).yarn.has_value());
}

TEST(ModelConfigTest, IgnoresUnknownKeys) {
    json j = load_fixture("deepseek_v3");
    j["some_future_field"] = {{"nested", {1, 2, 3}}};
    j["num_key_value_heads"] = "unused, so not checked";
    expect_deepseek_v3(parse(j));
}

// The fields model_config_to_json writes, compared after a parse round trip.
void expect_same(const ModelConfig& a, const ModelConfig& b) {
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.hidden_size, b.hidden_size);
    EXPECT_EQ(a.intermediate_size, b.intermediate_size);
    EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
    EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
    EXPECT_EQ(a.num_nextn_predict_layers, b.num_nextn_predict_layers);
    EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
    EXPECT_EQ(a.n_shared_experts, b.n_shared_experts);
    EXPECT_EQ(a.n_routed_experts, b.n_routed_experts);
    EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
    EXPECT_EQ(a.n_group, b.n_group);
    EXPECT_EQ(a.topk_group, b.topk_group);
    EXPECT_EQ(a.first_k_dense_replace, b.first_k_dense_replace);
    EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
    EXPECT_EQ(a.routed_scaling_factor, b.routed_scaling_factor);
    EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
    EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
    EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
    EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
    EXPECT_EQ(a.v_head_dim, b.v_head_dim);
    EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
    EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
    EXPECT_EQ(a.rope_theta, b.rope_theta);
    ASSERT_EQ(a.yarn.has_value(), b.yarn.has_value());
    if (a.yarn) {
        EXPECT_EQ(a.yarn->factor, b.yarn->factor);
        EXPECT_EQ(a.yarn->original_max_position_embeddings, b.yarn->original_max_position_embeddings);
        EXPECT_EQ(a.yarn->beta_fast, b.yarn->beta_fast);
        EXPECT_EQ(a.yarn->beta_slow, b.yarn->beta_slow);
        EXPECT_EQ(a.yarn->mscale, b.yarn->mscale);
        EXPECT_EQ(a.yarn->mscale_all_dim, b.yarn->mscale_all_dim);
        EXPECT_EQ(a.yarn->attention_factor, b.yarn->attention_factor);
        EXPECT_EQ(a.yarn->truncate, b.yarn->truncate);
    }
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
    EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
    EXPECT_EQ(a.bos_token_id, b.bos_token_id);
    ASSERT_EQ(a.fp8.has_value(), b.fp8.has_value());
    if (a.fp8) {
        EXPECT_EQ(a.fp8->block_n, b.fp8->block_n);
        EXPECT_EQ(a.fp8->block_k, b.fp8->block_k);
    }
}

TEST(ModelConfigTest, ToJsonRoundTripsEveryFixture) {
    for (const char* name : {"deepseek_v3", "deepseek_v3_transformers5", "direct_q"}) {
        SCOPED_TRACE(name);
        const ModelConfig c = load_model_config(kConfigs + "/" + name);
        expect_same(parse_model_config(model_config_to_json(c), "round-trip"), c);
    }
}

// Regression (was a bug): model_config_to_json writes neither YarnConfig::truncate nor
// YarnConfig::attention_factor, so "truncate": false comes back true and an explicit
// attention_factor is lost (changing rope_attention_factor()).
TEST(ModelConfigTest, ToJsonKeepsEveryYarnField) {
    for (const auto& [key, value] : {std::pair<std::string, json>{"truncate", false}, {"attention_factor", 1.25}}) {
        SCOPED_TRACE(key);
        const ModelConfig c = parse(v3_with_rope(key, value));
        const ModelConfig back = parse_model_config(model_config_to_json(c), "round-trip");
        expect_same(back, c);
        EXPECT_DOUBLE_EQ(back.rope_attention_factor(), c.rope_attention_factor());
    }
}

TEST(ModelConfigTest, MissingConfigFile) {
    const std::string dir = fanout::testing::temp_dir("model_config_missing");
    const std::string msg = error_of([&] { load_model_config(dir); });
    EXPECT_THAT(msg, HasSubstr(dir + "/config.json"));
    EXPECT_THAT(msg, HasSubstr("no config.json"));
    fs::remove_all(dir);
}

TEST(ModelConfigTest, LoadNamesTheFileInErrors) {
    const std::string dir = fanout::testing::temp_dir("model_config_bad");
    fanout::testing::write_file(dir + "/config.json", v3_with("hidden_size", kRemove).dump());
    const std::string msg = error_of([&] { load_model_config(dir); });
    EXPECT_THAT(msg, HasSubstr(dir + "/config.json"));
    EXPECT_THAT(msg, HasSubstr("'hidden_size'"));
    fs::remove_all(dir);
}

TEST(ModelConfigTest, ConfigJsonThatIsAFifoOrFolderIsRefused) {
    const std::string dir = fanout::testing::temp_dir("model_config_fifo");
    const std::string path = dir + "/config.json";
    fanout::testing::make_fifo(path);
    std::string msg = fanout::testing::error_of_without_blocking([&] { load_model_config(dir); }, path);
    EXPECT_THAT(msg, HasSubstr(path + " is not a regular file (a FIFO)"));
    fs::remove(path);
    fs::create_directories(path);
    msg = error_of([&] { load_model_config(dir); });
    EXPECT_THAT(msg, HasSubstr(path + " is not a regular file (a folder)"));
    fs::remove_all(dir);
}

TEST(ModelConfigTest, SpecialTokenIdsAtTheVocabularyEdgesOrAbsent) {
    EXPECT_THAT(parse(v3_with("eos_token_id", 129279)).eos_token_ids, ElementsAre(129279));
    EXPECT_THAT(parse(v3_with("eos_token_id", json::array({0, 129279}))).eos_token_ids, ElementsAre(0, 129279));
    EXPECT_TRUE(parse(v3_with("eos_token_id", nullptr)).eos_token_ids.empty());
    EXPECT_EQ(parse(v3_with("bos_token_id", 129279)).bos_token_id, 129279);
    EXPECT_EQ(parse(v3_with("bos_token_id", nullptr)).bos_token_id, -1);
    // No eos round-trips as null, not as the [] a config may not hold.
    ModelConfig c = parse(v3_with("eos_token_id", kRemove));
    expect_same(parse_model_config(model_config_to_json(c), "round-trip"), c);
}

// ---------------------------------------------------------------------------------------------
// Errors: each names the field and the value found.

TEST(ModelConfigErrorTest, SpecialTokenIdsOutsideTheVocabulary) {
    EXPECT_THAT(parse_error(v3_with("eos_token_id", -1)),
                HasSubstr("field 'eos_token_id' is -1, outside the vocabulary [0, vocab_size=129280)"));
    EXPECT_THAT(parse_error(v3_with("eos_token_id", 129280)),
                HasSubstr("field 'eos_token_id' is 129280, outside the vocabulary [0, vocab_size=129280)"));
    EXPECT_THAT(parse_error(v3_with("eos_token_id", json(18446744073709551615ull))),
                HasSubstr("field 'eos_token_id' is 18446744073709551615, outside the vocabulary"));
    EXPECT_THAT(parse_error(v3_with("eos_token_id", json::array({1, -5}))),
                HasSubstr("field 'eos_token_id[1]' is -5, outside the vocabulary [0, vocab_size=129280)"));
    EXPECT_THAT(parse_error(v3_with("eos_token_id", json::array({200000, 1}))),
                HasSubstr("field 'eos_token_id[0]' is 200000, outside the vocabulary"));
    EXPECT_THAT(parse_error(v3_with("eos_token_id", json::array())),
                HasSubstr("field 'eos_token_id' is [], an empty list"));
    EXPECT_THAT(parse_error(v3_with("bos_token_id", -3)),
                HasSubstr("field 'bos_token_id' is -3, outside the vocabulary [0, vocab_size=129280)"));
    EXPECT_THAT(parse_error(v3_with("bos_token_id", 129280)),
                HasSubstr("field 'bos_token_id' is 129280, outside the vocabulary [0, vocab_size=129280)"));
    EXPECT_THAT(parse_error(v3_with("bos_token_id", json::array({0}))),
                HasSubstr("field 'bos_token_id' must be an integer, found [0]"));
}

TEST(ModelConfigErrorTest, NotJson) {
    for (const char* text : {"", "{", "{\"model_type\": deepseek_v3}", "{} {}"}) {
        const std::string msg = error_of([&] { parse_model_config(text, "test/config.json"); });
        EXPECT_THAT(msg, HasSubstr("test/config.json"));
        EXPECT_THAT(msg, HasSubstr("not valid JSON"));
    }
}

TEST(ModelConfigErrorTest, NotAnObject) {
    EXPECT_THAT(parse_error(json::array({1, 2})), HasSubstr("must be a JSON object"));
    EXPECT_THAT(parse_error(json("deepseek_v3")), HasSubstr("must be a JSON object"));
}

TEST(ModelConfigErrorTest, MissingRequiredField) {
    for (const char* key :
         {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "kv_lora_rank",
          "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "max_position_embeddings"}) {
        SCOPED_TRACE(key);
        EXPECT_THAT(parse_error(v3_with(key, kRemove)), HasSubstr(fmt::format("required field '{}' is missing", key)));
        EXPECT_THAT(parse_error(v3_with(key, nullptr)), HasSubstr(fmt::format("required field '{}' is missing", key)));
    }
    EXPECT_THAT(parse_error(v3_with_rope("factor", kRemove)), HasSubstr("required field 'factor' is missing"));
    EXPECT_THAT(parse_error(v3_with_rope("factor", kRemove)), HasSubstr("rope_scaling"));
}

TEST(ModelConfigErrorTest, MissingModelType) {
    const std::string msg = parse_error(v3_with("model_type", kRemove));
    EXPECT_THAT(msg, HasSubstr("'model_type'"));
}

TEST(ModelConfigErrorTest, WrongTypes) {
    EXPECT_THAT(parse_error(v3_with("hidden_size", "7168")),
                HasSubstr("field 'hidden_size' must be an integer, found \"7168\""));
    EXPECT_THAT(parse_error(v3_with("hidden_size", 7168.5)),
                HasSubstr("field 'hidden_size' must be an integer, found 7168.5"));
    EXPECT_THAT(parse_error(v3_with("num_hidden_layers", true)),
                HasSubstr("field 'num_hidden_layers' must be an integer, found true"));
    EXPECT_THAT(parse_error(v3_with("n_group", json::array({8}))),
                HasSubstr("field 'n_group' must be an integer, found [8]"));
    EXPECT_THAT(parse_error(v3_with("rms_norm_eps", "1e-6")),
                HasSubstr("field 'rms_norm_eps' must be a number, found \"1e-6\""));
    EXPECT_THAT(parse_error(v3_with("norm_topk_prob", 1)),
                HasSubstr("field 'norm_topk_prob' must be true or false, found 1"));
    EXPECT_THAT(parse_error(v3_with("model_type", 3)), HasSubstr("field 'model_type' must be a string, found 3"));
    EXPECT_THAT(parse_error(v3_with("rope_scaling", "yarn")),
                HasSubstr("field 'rope_scaling' must be an object, found \"yarn\""));
    EXPECT_THAT(parse_error(v3_with_rope("factor", "40")), HasSubstr("field 'factor' must be a number, found \"40\""));
    EXPECT_THAT(parse_error(v3_with("eos_token_id", json::array({"</s>"}))), HasSubstr("eos_token_id"));
    EXPECT_THAT(parse_error(v3_with("eos_token_id", "</s>")), HasSubstr("field 'eos_token_id' must be an integer"));
    EXPECT_THAT(parse_error(v3_with("quantization_config", "fp8")), HasSubstr("quantization_config must be an object"));
}

TEST(ModelConfigErrorTest, NonPositiveSizes) {
    EXPECT_THAT(parse_error(v3_with("hidden_size", 0)), HasSubstr("field 'hidden_size' must be positive, found 0"));
    EXPECT_THAT(parse_error(v3_with("vocab_size", -1)), HasSubstr("field 'vocab_size' must be positive, found -1"));
    EXPECT_THAT(parse_error(v3_with("q_lora_rank", 0)), HasSubstr("field 'q_lora_rank' must be positive, found 0"));
    EXPECT_THAT(parse_error(v3_with("n_shared_experts", -1)), HasSubstr("'n_shared_experts' must be >= 0, found -1"));
    EXPECT_THAT(parse_error(v3_with("first_k_dense_replace", -2)),
                HasSubstr("'first_k_dense_replace' must be >= 0, found -2"));
    EXPECT_THAT(parse_error(v3_with_rope("original_max_position_embeddings", 0)),
                HasSubstr("field 'original_max_position_embeddings' must be positive, found 0"));
}

// YaRN's correction range divides by log(rope_theta): a base of 1 would make every frequency NaN.
TEST(ModelConfigErrorTest, RopeThetaOfOneWithYarn) {
    EXPECT_THAT(parse_error(v3_with("rope_theta", 1.0)), HasSubstr("rope_theta must be > 1 with YaRN, found 1"));
    json j = load_fixture("direct_q");  // no YaRN: a base of 1 is degenerate but finite
    j["rope_theta"] = 1.0;
    EXPECT_EQ(parse(j).rope_theta, 1.0);
}

TEST(ModelConfigErrorTest, NumberTooLargeForADouble) {
    // nlohmann rejects 1e999 while parsing, so it never reaches the field's finiteness check.
    const std::string text = R"({"rms_norm_eps": 1e999, )" + v3_with("rms_norm_eps", kRemove).dump().substr(1);
    const std::string msg = error_of([&] { parse_model_config(text, "test/config.json"); });
    EXPECT_THAT(msg, HasSubstr("test/config.json"));
    EXPECT_THAT(msg, HasSubstr("1e999"));
}

TEST(ModelConfigErrorTest, UnsupportedModelType) {
    EXPECT_THAT(parse_error(v3_with("model_type", "llama")),
                HasSubstr("field 'model_type' is 'llama'; fanout implements only deepseek_v3"));
    EXPECT_THAT(parse_error(v3_with("model_type", "deepseek_v2")), HasSubstr("'deepseek_v2'"));
}

TEST(ModelConfigErrorTest, UnsupportedFunctions) {
    EXPECT_THAT(parse_error(v3_with("scoring_func", "softmax")), HasSubstr("field 'scoring_func' is 'softmax'"));
    EXPECT_THAT(parse_error(v3_with("hidden_act", "gelu")), HasSubstr("field 'hidden_act' is 'gelu'"));
    EXPECT_THAT(parse_error(v3_with("topk_method", "greedy")), HasSubstr("field 'topk_method' is 'greedy'"));
}

TEST(ModelConfigErrorTest, UnsupportedRopeType) {
    std::string msg = parse_error(v3_with_rope("type", "dynamic"));
    EXPECT_THAT(msg, HasSubstr("rope_scaling"));
    EXPECT_THAT(msg, HasSubstr("rope type 'dynamic' is not supported"));
    json j = load_fixture("deepseek_v3_transformers5");
    j["rope_parameters"]["rope_type"] = "linear";
    msg = parse_error(j);
    EXPECT_THAT(msg, HasSubstr("rope_parameters"));
    EXPECT_THAT(msg, HasSubstr("rope type 'linear'"));
}

TEST(ModelConfigErrorTest, YarnFactorBelowOne) {
    const std::string msg = parse_error(v3_with_rope("factor", 0.5));
    EXPECT_THAT(msg, HasSubstr("field 'factor' must be >= 1, found 0.5"));
}

TEST(ModelConfigErrorTest, UnsupportedQuantization) {
    EXPECT_THAT(parse_error(v3_with_quant("quant_method", "awq")),
                HasSubstr("field 'quant_method' is 'awq'; fanout implements only fp8"));
    EXPECT_THAT(parse_error(v3_with_quant("fmt", "e5m2")), HasSubstr("field 'fmt' is 'e5m2'"));
    EXPECT_THAT(parse_error(v3_with_quant("activation_scheme", "static")),
                HasSubstr("field 'activation_scheme' is 'static'"));
    json no_method = load_fixture("deepseek_v3");
    no_method["quantization_config"].erase("quant_method");
    EXPECT_THAT(parse_error(no_method), HasSubstr("'quant_method'"));
}

TEST(ModelConfigErrorTest, UnsupportedWeightBlockSize) {
    EXPECT_THAT(parse_error(v3_with_quant("weight_block_size", json::array({64, 64}))),
                HasSubstr("weight_block_size [64, 64] is not supported"));
    EXPECT_THAT(parse_error(v3_with_quant("weight_block_size", json::array({128, 64}))),
                HasSubstr("weight_block_size [128, 64]"));
    EXPECT_THAT(parse_error(v3_with_quant("weight_block_size", json::array({128}))),
                HasSubstr("weight_block_size must be [rows, cols], found [128]"));
    EXPECT_THAT(parse_error(v3_with_quant("weight_block_size", "128x128")),
                HasSubstr("weight_block_size must be [rows, cols], found \"128x128\""));
}

TEST(ModelConfigErrorTest, RoutedExpertsNotDivisibleByGroups) {
    EXPECT_THAT(parse_error(v3_with("n_routed_experts", 250)),
                HasSubstr("n_routed_experts=250 must be a multiple of n_group=8"));
    EXPECT_THAT(parse_error(v3_with("n_group", 0)), HasSubstr("n_group=0"));
}

TEST(ModelConfigErrorTest, TopkGroupLargerThanGroups) {
    EXPECT_THAT(parse_error(v3_with("topk_group", 9)), HasSubstr("topk_group=9 must be in [1, n_group=8]"));
    EXPECT_THAT(parse_error(v3_with("topk_group", 0)), HasSubstr("topk_group=0"));
}

TEST(ModelConfigErrorTest, GroupsOfOneExpert) {
    json j = v3_with("n_routed_experts", 8);
    EXPECT_THAT(parse_error(j), HasSubstr("n_group=8 groups needs at least 2 experts"));
}

TEST(ModelConfigErrorTest, TooManyExpertsPerToken) {
    // topk_group=4 groups of 256/8 = 32 experts: at most 128.
    EXPECT_NO_THROW(parse(v3_with("num_experts_per_tok", 128)));
    EXPECT_THAT(parse_error(v3_with("num_experts_per_tok", 129)),
                HasSubstr("num_experts_per_tok=129 exceeds the 128 experts in topk_group=4 groups"));
    EXPECT_THAT(parse_error(v3_with("num_experts_per_tok", 0)),
                HasSubstr("field 'num_experts_per_tok' must be positive, found 0"));
}

TEST(ModelConfigErrorTest, MoeLayerFreq) {
    EXPECT_NO_THROW(parse(v3_with("moe_layer_freq", 1)));
    EXPECT_THAT(parse_error(v3_with("moe_layer_freq", 2)), HasSubstr("moe_layer_freq is 2; fanout implements 1"));
}

TEST(ModelConfigErrorTest, RopeInterleaveFalse) {
    EXPECT_NO_THROW(parse(v3_with("rope_interleave", true)));
    EXPECT_THAT(parse_error(v3_with("rope_interleave", false)), HasSubstr("rope_interleave false is not supported"));
}

TEST(ModelConfigErrorTest, NextnLayersAndOddRopeDim) {
    EXPECT_THAT(parse_error(v3_with("num_nextn_predict_layers", 2)), HasSubstr("num_nextn_predict_layers is 2"));
    EXPECT_THAT(parse_error(v3_with("qk_rope_head_dim", 63)), HasSubstr("qk_rope_head_dim must be even, found 63"));
}

// Regression (was a bug): n_routed_experts is read with integer(), never checked to be >= 0, so
// a negative count (or 2^64-1, which wraps to -1) silently makes every layer dense.
TEST(ModelConfigErrorTest, NegativeRoutedExperts) {
    EXPECT_THAT(parse_error(v3_with("n_routed_experts", -256)), HasSubstr("n_routed_experts"));
    EXPECT_THAT(parse_error(v3_with("n_routed_experts", json(18446744073709551615ull))), HasSubstr("n_routed_experts"));
}

// Regression (was a bug): integer() accepts unsigned JSON numbers above INT64_MAX and wraps them,
// so "bos_token_id": 18446744073709551615 parses as -1 (no bos) instead of being an error.
TEST(ModelConfigErrorTest, IntegerAboveInt64MaxIsAnError) {
    EXPECT_THAT(parse_error(v3_with("bos_token_id", json(18446744073709551615ull))), HasSubstr("bos_token_id"));
}

// Regression (was a bug): sizes are checked to be positive but not bounded, so
// qk_nope_head_dim = INT64_MAX parses and qk_head_dim() then overflows int64 (undefined
// behaviour; UBSan reports it in config_fuzz), and an mscale_all_dim of 1e300 gives an infinite
// softmax_scale().
TEST(ModelConfigErrorTest, AbsurdSizesAndScalesAreRejected) {
    EXPECT_THAT(parse_error(v3_with("qk_nope_head_dim", INT64_MAX)), HasSubstr("qk_nope_head_dim"));
    EXPECT_THAT(parse_error(v3_with_rope("mscale_all_dim", 1e300)), HasSubstr("mscale_all_dim"));
}

// A value nested ~100k deep is refused while parsing (config.json is a few levels deep), so no
// recursive walk of it — an error message's dump, comparing rope_parameters with rope_scaling —
// can overflow the stack.
TEST(ModelConfigErrorTest, DeeplyNestedValueIsAnErrorNotACrash) {
    constexpr int kDepth = 200000;
    const std::string text =
        R"({"model_type": "deepseek_v3", "vocab_size": )" + std::string(kDepth, '[') + std::string(kDepth, ']') + "}";
    const std::string msg = error_of([&] { parse_model_config(text, "test/config.json"); });
    EXPECT_THAT(msg, HasSubstr("test/config.json: JSON nested deeper than 64 levels"));
}

}  // namespace
}  // namespace fanout::io
