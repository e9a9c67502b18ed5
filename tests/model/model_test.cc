// Whole-model properties on synthetic checkpoints: incremental decode and chunked prefill equal
// the full-sequence forward, a mixed batch equals its requests run alone, sharded == single-file,
// fp8 w8a8 stays close to dequantized fp8, and bad checkpoints / token ids give clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fanout/model/generate.h"
#include "fanout/model/synthetic.h"
#include "test_util.h"

namespace fanout::model {
namespace {

namespace fs = std::filesystem;
using fanout::testing::max_abs_diff;
using fanout::testing::rel_error;

io::ModelConfig small_config() {
    io::ModelConfig c = preset_config("tiny");
    c.vocab_size = 1000;  // keeps the tests fast; the preset's real vocabulary is covered by e2e
    return c;
}

class ModelTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = new std::string(fanout::testing::temp_dir("model"));
        write_synthetic_model(*dir_ + "/bf16", small_config(), {});
        io::ModelConfig fp8 = small_config();
        fp8.fp8 = io::Fp8QuantConfig{};
        write_synthetic_model(*dir_ + "/fp8", fp8, {});
        // Dense-only twins: no routing decisions, so quantization error is not amplified by
        // near-tie expert choices flipping.
        io::ModelConfig dense = small_config();
        dense.first_k_dense_replace = dense.num_hidden_layers;
        write_synthetic_model(*dir_ + "/dense_bf16", dense, {});
        dense.fp8 = io::Fp8QuantConfig{};
        write_synthetic_model(*dir_ + "/dense_fp8", dense, {});
        MakeModelOptions sharded;
        sharded.max_shard_bytes = 1 << 20;
        write_synthetic_model(*dir_ + "/sharded", small_config(), sharded);
    }
    static void TearDownTestSuite() {
        fs::remove_all(*dir_);
        delete dir_;
    }

    // Logits of every position of `ids` in one step.
    static std::vector<float> score(const DeepseekV3& m, const std::vector<int32_t>& ids, ForwardOptions opts = {}) {
        kv::PagedKvCache cache(m.kv_cache_config(8));
        kv::SequenceBlocks seq;
        cache.reserve(seq, static_cast<int64_t>(ids.size()));
        auto batch = StepBatchBuilder(cache).add(ids, 0, seq, StepBatchBuilder::Logits::kAll).build();
        auto out = m.forward(batch, cache, opts, Stream{&pool()});
        return {out.logits.data_as<float>(), out.logits.data_as<float>() + out.logits.numel()};
    }
    static ThreadPool& pool() {
        static ThreadPool p(2);
        return p;
    }
    static std::vector<int32_t> ids(int n, int seed) {
        std::vector<int32_t> v;
        for (int i = 0; i < n; ++i) v.push_back((i * 7919 + seed * 104729) % 1000);
        return v;
    }
    static std::string* dir_;
};
std::string* ModelTest::dir_ = nullptr;

TEST_F(ModelTest, IncrementalDecodeAndChunkedPrefillEqualFullSequence) {
    auto m = DeepseekV3::load(*dir_ + "/bf16");
    const auto tokens = ids(70, 1);  // crosses a 64-token block boundary
    const int64_t V = m->config().vocab_size, T = 70;
    const auto full = score(*m, tokens);
    // Chunks of 13 (MHA form), then single tokens (absorbed form), through one cache.
    kv::PagedKvCache cache(m->kv_cache_config(4));
    kv::SequenceBlocks seq;
    cache.reserve(seq, T);
    std::vector<float> got;
    for (int64_t start = 0; start < T;) {
        const int64_t n = start < 40 ? std::min<int64_t>(13, 40 - start) : 1;
        auto b = StepBatchBuilder(cache).add(std::span(tokens).subspan(start, n), start, seq,
                                             StepBatchBuilder::Logits::kAll).build();
        auto out = m->forward(b, cache, {}, Stream{&pool()});
        got.insert(got.end(), out.logits.data_as<float>(), out.logits.data_as<float>() + out.logits.numel());
        start += n;
    }
    ASSERT_EQ(got.size(), size_t(T * V));
    EXPECT_LT(rel_error(got.data(), full.data(), full.size()), 1e-5);
}

TEST_F(ModelTest, MixedBatchEqualsRequestsRunAlone) {
    auto m = DeepseekV3::load(*dir_ + "/bf16");
    const int64_t V = m->config().vocab_size;
    const auto a = ids(20, 2), b = ids(9, 3);
    kv::PagedKvCache cache(m->kv_cache_config(8));
    kv::SequenceBlocks sa, sb;
    cache.reserve(sa, 21);
    cache.reserve(sb, 9);
    // Step 1: a's first 20 tokens prefill while b prefills 8; step 2: a decodes 1 token (a[0] again)
    // beside b's last prompt token.
    auto s1 = StepBatchBuilder(cache).add(a, 0, sa).add(std::span(b).first(8), 0, sb).build();
    m->forward(s1, cache, {}, Stream{&pool()});
    const int32_t next[1] = {a[0]};
    auto s2 = StepBatchBuilder(cache).add(next, 20, sa).add(std::span(b).subspan(8, 1), 8, sb).build();
    auto out = m->forward(s2, cache, {}, Stream{&pool()});
    std::vector<int32_t> a21 = a;
    a21.push_back(a[0]);
    const auto ra = score(*m, a21), rb = score(*m, b);
    EXPECT_LT(rel_error(out.logits.data_as<float>(), ra.data() + 20 * V, size_t(V)), 1e-5);
    EXPECT_LT(rel_error(out.logits.data_as<float>() + V, rb.data() + 8 * V, size_t(V)), 1e-5);
}

TEST_F(ModelTest, ShardedCheckpointEqualsSingleFile) {
    ASSERT_TRUE(fs::exists(*dir_ + "/sharded/model.safetensors.index.json"));
    auto single = DeepseekV3::load(*dir_ + "/bf16");
    auto sharded = DeepseekV3::load(*dir_ + "/sharded");
    EXPECT_GT(sharded->weights().checkpoint.num_shards(), 3);
    const auto t = ids(11, 4);
    const auto x = score(*single, t), y = score(*sharded, t);
    EXPECT_EQ(max_abs_diff(x.data(), y.data(), x.size()), 0.0);
}

TEST_F(ModelTest, Fp8W8A8StaysCloseToDequantized) {
    ForwardOptions w8a8;
    w8a8.fp8_mode = ops::Fp8Mode::kW8A8;
    const auto t = ids(24, 5);
    for (const char* name : {"dense", "moe"}) {
        const bool dense = std::string(name) == "dense";
        auto m = DeepseekV3::load(*dir_ + (dense ? "/dense_fp8" : "/fp8"));
        auto bf16 = DeepseekV3::load(*dir_ + (dense ? "/dense_bf16" : "/bf16"));
        ASSERT_TRUE(m->config().fp8.has_value());
        const auto ref = score(*m, t), got = score(*m, t, w8a8), b = score(*bf16, t);
        const double e_act = rel_error(got.data(), ref.data(), ref.size());
        const double e_weight = rel_error(ref.data(), b.data(), b.size());
        std::printf("%s model, 24 tokens x 3 layers: w8a8 vs dequantized fp8 %.4f; dequantized fp8 vs bf16 %.4f\n",
                    name, e_act, e_weight);
        EXPECT_GT(e_act, 0.0);  // activations really were quantized
        // e4m3 keeps 3 mantissa bits (~2.5% rms per weight or activation); through 3 random
        // layers (chained projections, softmax) that compounds to ~10%. A wrong scale gives ~100%.
        if (dense) {
            EXPECT_LT(e_act, 0.2);
            EXPECT_LT(e_weight, 0.2);
        } else {
            // Quantization flips near-tie expert choices of a random router; bounded, not small.
            EXPECT_LT(e_act, 0.5);
            EXPECT_LT(e_weight, 0.5);
        }
    }
}

TEST_F(ModelTest, MtpHeadIsConsistentAcrossSteps) {
    auto m = DeepseekV3::load(*dir_ + "/bf16");
    ASSERT_TRUE(m->weights().mtp.has_value());
    const auto t = ids(12, 6);
    const int64_t V = m->config().vocab_size, D = m->config().hidden_size;
    // Main model over t[0..10]; MTP at position i sees hidden(i) and token t[i+1].
    kv::PagedKvCache cache(m->kv_cache_config(4));
    kv::SequenceBlocks seq;
    cache.reserve(seq, 11);
    auto main = m->forward(StepBatchBuilder(cache).add(std::span(t).first(11), 0, seq, StepBatchBuilder::Logits::kAll).build(),
                           cache, {}, Stream{&pool()});
    auto mtp_batch = StepBatchBuilder(cache).add(std::span(t).subspan(1, 11), 0, seq, StepBatchBuilder::Logits::kAll).build();
    auto full = m->forward_mtp(mtp_batch, main.hidden, cache, {}, Stream{&pool()});
    ASSERT_EQ(full.logits.numel(), 11 * V);
    // The same MTP predictions one position at a time, through the MTP layer's own cache.
    kv::PagedKvCache cache2(m->kv_cache_config(4));
    kv::SequenceBlocks seq2;
    cache2.reserve(seq2, 11);
    for (int64_t i = 0; i < 11; ++i) {
        auto step = StepBatchBuilder(cache2).add(std::span(t).subspan(1 + i, 1), i, seq2).build();
        Tensor h = main.hidden.slice_rows(i, i + 1);
        auto o = m->forward_mtp(step, h, cache2, {}, Stream{&pool()});
        EXPECT_LT(rel_error(o.logits.data_as<float>(), full.logits.data_as<float>() + i * V, size_t(V)), 1e-5) << i;
    }
    // It is a different head from the main model's.
    EXPECT_GT(rel_error(full.logits.data_as<float>(), main.logits.data_as<float>(), size_t(V)), 0.1);
    EXPECT_EQ(full.hidden.dim(1), D);
}

TEST_F(ModelTest, BadTokenIdsAndOversizedRequestsAreClearErrors) {
    auto m = DeepseekV3::load(*dir_ + "/bf16");
    kv::PagedKvCache cache(m->kv_cache_config(2));
    GenerateRequest req;
    req.prompt = {5, 1000, 7};
    try {
        generate(*m, cache, req, {}, Stream{});
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("prompt token 1000 (index 1) is outside the vocabulary [0, 1000)"),
                  std::string::npos) << e.what();
    }
    req.prompt = {5, -2};
    EXPECT_THROW(generate(*m, cache, req, {}, Stream{}), Error);
    req.prompt = {};
    EXPECT_THROW(generate(*m, cache, req, {}, Stream{}), Error);
    req.prompt = ids(100, 7);
    req.max_tokens = 100;  // 200 tokens > the cache's 128
    try {
        generate(*m, cache, req, {}, Stream{});
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("need 4 blocks but only 2 of 2 are free"), std::string::npos) << e.what();
    }
    EXPECT_EQ(cache.allocator().num_free(), 2);  // nothing leaked
}

TEST_F(ModelTest, CheckpointThatDisagreesWithConfigNamesTheTensor) {
    const std::string bad = *dir_ + "/bad";
    fs::create_directories(bad);
    fs::copy_file(*dir_ + "/bf16/model.safetensors", bad + "/model.safetensors", fs::copy_options::overwrite_existing);
    io::ModelConfig c = small_config();
    c.kv_lora_rank = 48;  // the checkpoint has 64
    std::ofstream(bad + "/config.json") << io::model_config_to_json(c);
    try {
        DeepseekV3::load(bad);
        FAIL();
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("model.layers.0.self_attn.kv_a_proj_with_mqa.weight' has shape [80, 256], expected [64, 256]"),
                  std::string::npos) << msg;
    }
    c = small_config();
    c.num_hidden_layers = 5;  // layers 3 and 4 are not in the checkpoint... layer 3 is the MTP layer
    std::ofstream(bad + "/config.json") << io::model_config_to_json(c);
    try {
        DeepseekV3::load(bad);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("model.layers.4."), std::string::npos) << e.what();
    }
}

TEST(Synthetic, SameSeedSameBytesOtherSeedOtherBytes) {
    const std::string d = fanout::testing::temp_dir("synthetic");
    io::ModelConfig c = preset_config("tiny", 1);
    c.vocab_size = 300;
    MakeModelOptions o;
    write_synthetic_model(d + "/a", c, o);
    write_synthetic_model(d + "/b", c, o);
    o.seed = 1;
    write_synthetic_model(d + "/c", c, o);
    auto read = [](const std::string& p) {
        std::ifstream f(p, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(f), {});
    };
    EXPECT_EQ(read(d + "/a/model.safetensors"), read(d + "/b/model.safetensors"));
    EXPECT_NE(read(d + "/a/model.safetensors"), read(d + "/c/model.safetensors"));
    // The file has exactly the tensors of a DeepSeek-V3 checkpoint.
    const auto st = io::SafetensorsFile::open(d + "/a/model.safetensors");
    EXPECT_EQ(st.names().size(), checkpoint_tensors(c).size());
    EXPECT_TRUE(st.has("model.layers.1.eh_proj.weight"));
    EXPECT_TRUE(st.has("model.layers.1.shared_head.head.weight"));
    fs::remove_all(d);
}

TEST(Synthetic, FullLayersPresetHasV3Widths) {
    const io::ModelConfig c = preset_config("full-layers", 2);
    EXPECT_EQ(c.hidden_size, 7168);
    EXPECT_EQ(c.first_k_dense_replace, 1);
    EXPECT_EQ(c.n_routed_experts, 256);
    EXPECT_EQ(c.kv_entry_dim(), 576);
    EXPECT_NEAR(c.softmax_scale(), 0.13523, 1e-5);
    EXPECT_THROW(preset_config("full-layers", 0), Error);
    EXPECT_THROW(preset_config("huge", 2), Error);
}

}  // namespace
}  // namespace fanout::model
