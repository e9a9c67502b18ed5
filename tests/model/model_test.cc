// Whole-model properties on synthetic checkpoints: incremental decode and chunked prefill equal
// the full-sequence forward, a mixed batch equals its requests run alone, sharded == single-file,
// fp8 w8a8 stays close to dequantized fp8, and bad checkpoints / token ids give clear errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "fanout/model/generate.h"
#include "fanout/model/synthetic.h"
#include "test_util.h"

namespace fanout::model {
namespace {

namespace fs = std::filesystem;
using fanout::testing::error_of;
using fanout::testing::max_abs_diff;
using fanout::testing::rel_error;
using ::testing::HasSubstr;
using ::testing::Not;

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
    static std::vector<float> score(const DeepseekV3& m, const std::vector<int32_t>& ids, ForwardOptions opts = {},
                                    DType kv_dtype = DType::kF32) {
        kv::PagedKvCache cache(m.kv_cache_config(8, kv_dtype));
        kv::SequenceBlocks seq;
        cache.reserve(seq, static_cast<int64_t>(ids.size()));
        auto batch = StepBatchBuilder(cache).add(ids, 0, seq, StepBatchBuilder::Logits::kAll).build();
        auto out = m.forward(batch, cache, opts, Stream{&pool()});
        return {out.logits.data_as<float>(), out.logits.data_as<float>() + out.logits.numel()};
    }
    // Logits of every position of `ids` (at most 4 blocks) through one cache of `kv_dtype` entries:
    // chunks of 13 up to position 40 (the MHA form), then single tokens (the absorbed form).
    static std::vector<float> chunked(const DeepseekV3& m, const std::vector<int32_t>& ids,
                                      DType kv_dtype = DType::kF32) {
        const int64_t T = static_cast<int64_t>(ids.size());
        kv::PagedKvCache cache(m.kv_cache_config(4, kv_dtype));
        kv::SequenceBlocks seq;
        cache.reserve(seq, T);
        std::vector<float> got;
        for (int64_t start = 0; start < T;) {
            const int64_t n = start < 40 ? std::min<int64_t>(13, 40 - start) : 1;
            auto b = StepBatchBuilder(cache)
                         .add(std::span(ids).subspan(start, n), start, seq, StepBatchBuilder::Logits::kAll)
                         .build();
            auto out = m.forward(b, cache, {}, Stream{&pool()});
            got.insert(got.end(), out.logits.data_as<float>(), out.logits.data_as<float>() + out.logits.numel());
            start += n;
        }
        return got;
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
    // Edits one tensor's bytes on the way; returning false drops the tensor.
    using TensorEdit = std::function<bool(const std::string& name, std::vector<uint8_t>& bytes)>;

    // A copy of the model in folder `from` (under dir_) as the fresh folder `to` (under dir_): with
    // `config` when given (else the same config.json), each tensor passed through `edit`, and
    // `extra` tensors (f32 ones) added. Returns the new folder.
    static std::string copy_model(const std::string& from, const std::string& to,
                                  const std::optional<io::ModelConfig>& config, const TensorEdit& edit = {},
                                  const std::vector<std::string>& extra = {}) {
        const std::string src = *dir_ + "/" + from, dst = *dir_ + "/" + to;
        fs::remove_all(dst);
        fs::create_directories(dst);
        if (config)
            std::ofstream(dst + "/config.json") << io::model_config_to_json(*config);
        else
            fs::copy_file(src + "/config.json", dst + "/config.json");
        const auto in = io::SafetensorsFile::open(src + "/model.safetensors");
        std::vector<io::TensorSpec> specs;
        std::map<std::string, std::vector<uint8_t>> data;
        for (const auto& name : in.names()) {
            const Tensor t = in.tensor(name);
            std::vector<uint8_t> bytes(static_cast<const uint8_t*>(t.data()),
                                       static_cast<const uint8_t*>(t.data()) + t.nbytes());
            if (edit && !edit(name, bytes)) continue;
            specs.push_back({name, t.dtype(), t.shape()});
            data[name] = std::move(bytes);
        }
        for (const auto& name : extra) {
            specs.push_back({name, DType::kF32, {4}});
            const float ones[4] = {1, 1, 1, 1};
            data[name].assign(reinterpret_cast<const uint8_t*>(ones), reinterpret_cast<const uint8_t*>(ones + 4));
        }
        io::SafetensorsWriter w(dst + "/model.safetensors", specs, {{"format", "pt"}});
        for (const auto& [name, bytes] : data) w.write(name, bytes.data(), bytes.size());
        w.finish();
        return dst;
    }

    // An edit that sets element `index` of tensor `name` to the little-endian bytes `value`.
    static TensorEdit set_element(const std::string& name, int64_t index, const std::string& value) {
        return [=](const std::string& n, std::vector<uint8_t>& bytes) {
            if (n == name) {
                EXPECT_LE((index + 1) * static_cast<int64_t>(value.size()), static_cast<int64_t>(bytes.size())) << n;
                std::memcpy(bytes.data() + index * static_cast<int64_t>(value.size()), value.data(), value.size());
            }
            return true;
        };
    }

    static std::string* dir_;
};
std::string* ModelTest::dir_ = nullptr;

template <typename T>
std::string le_bytes(T v) {
    std::string s(sizeof(T), '\0');
    std::memcpy(s.data(), &v, sizeof(T));
    return s;
}
std::string bf16_bits(uint16_t bits) { return le_bytes(bits); }
std::string f32_value(float v) { return le_bytes(v); }
std::string fp8_byte(uint8_t b) { return le_bytes(b); }

TEST_F(ModelTest, IncrementalDecodeAndChunkedPrefillEqualFullSequence) {
    auto m = DeepseekV3::load(*dir_ + "/bf16");
    const auto tokens = ids(70, 1);  // crosses a 64-token block boundary
    const int64_t V = m->config().vocab_size, T = 70;
    const auto full = score(*m, tokens);
    const auto got = chunked(*m, tokens);
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

// The FP8 KV cache (each entry's latent in e4m3 with a scale per 128 values, rope in bf16): logits
// stay close to the f32 cache's — e4m3's 3 mantissa bits on the keys and values only, through 3
// random layers — and the cache holds each entry as it was appended, so chunked prefill (the MHA
// form) and single-token decode (the absorbed form) over it give the full sequence's logits.
TEST_F(ModelTest, Fp8KvCacheStaysCloseAndChunkingDoesNotChangeIt) {
    auto m = DeepseekV3::load(*dir_ + "/dense_bf16");
    const auto tokens = ids(70, 6);  // crosses a 64-token block boundary
    const int64_t V = m->config().vocab_size, T = 70;
    const auto f32 = score(*m, tokens), bf16 = score(*m, tokens, {}, DType::kBF16),
               fp8 = score(*m, tokens, {}, DType::kFP8E4M3);
    const double e_bf16 = rel_error(bf16.data(), f32.data(), f32.size()),
                 e_fp8 = rel_error(fp8.data(), f32.data(), f32.size());
    std::printf("dense model, 70 tokens x 3 layers: logits vs the f32 cache: bf16 cache %.4f, fp8 cache %.4f\n", e_bf16,
                e_fp8);
    EXPECT_GT(e_fp8, e_bf16);  // the entries really were quantized
    EXPECT_LT(e_fp8, 0.1);     // a wrong scale or layout gives ~100%
    EXPECT_EQ(m->kv_cache_config(4, DType::kFP8E4M3).entry_bytes(), 64 + 4 + 2 * 16);
    const auto got = chunked(*m, tokens, DType::kFP8E4M3);
    ASSERT_EQ(got.size(), size_t(T * V));
    EXPECT_LT(rel_error(got.data(), fp8.data(), fp8.size()), 1e-5);
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
    auto main =
        m->forward(StepBatchBuilder(cache).add(std::span(t).first(11), 0, seq, StepBatchBuilder::Logits::kAll).build(),
                   cache, {}, Stream{&pool()});
    auto mtp_batch =
        StepBatchBuilder(cache).add(std::span(t).subspan(1, 11), 0, seq, StepBatchBuilder::Logits::kAll).build();
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

// all_hidden (MTP drafting): every token's final-normed hidden state, the logits only for the
// logit rows — the same values as asking every row's logits.
TEST_F(ModelTest, AllHiddenGivesEveryRowsHiddenStateAndOnlyTheAskedLogits) {
    auto m = DeepseekV3::load(*dir_ + "/bf16");
    const auto t = ids(9, 7);
    const int64_t V = m->config().vocab_size, D = m->config().hidden_size;
    const auto run = [&](StepBatchBuilder::Logits which, bool all_hidden) {
        kv::PagedKvCache cache(m->kv_cache_config(4));
        kv::SequenceBlocks seq;
        cache.reserve(seq, 9);
        StepBatch b = StepBatchBuilder(cache).add(t, 0, seq, which).build();
        b.all_hidden = all_hidden;
        return m->forward(b, cache, {}, Stream{&pool()});
    };
    const auto every = run(StepBatchBuilder::Logits::kAll, false);
    const auto last = run(StepBatchBuilder::Logits::kLast, true);
    ASSERT_EQ(last.hidden.dim(0), 9);
    ASSERT_EQ(last.logits.dim(0), 1);
    EXPECT_EQ(rel_error(last.hidden.data_as<float>(), every.hidden.data_as<float>(), size_t(9 * D)), 0.0);
    EXPECT_EQ(rel_error(last.logits.data_as<float>(), every.logits.data_as<float>() + 8 * V, size_t(V)), 0.0);
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
                  std::string::npos)
            << e.what();
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
    // A max_tokens whose sum with the prompt overflows is still past the positions (before, the sum
    // wrapped negative and passed the check, to fail later in the cache with a wrong message).
    req.max_tokens = std::numeric_limits<int64_t>::max() - 1;
    EXPECT_THAT(error_of([&] { generate(*m, cache, req, {}, Stream{}); }),
                HasSubstr("exceeds the model's max_position_embeddings"));
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
        EXPECT_NE(
            msg.find("model.layers.0.self_attn.kv_a_proj_with_mqa.weight' has shape [80, 256], expected [64, 256]"),
            std::string::npos)
            << msg;
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

// The synthetic checkpoint holds decoder layers 0..2 and the MTP layer at 3.
TEST_F(ModelTest, CheckpointWithLayersPastTheConfigIsAnError) {
    io::ModelConfig c = small_config();
    c.num_hidden_layers = 2;  // layer 2 is a decoder layer in the file, and 3 the MTP layer
    std::string msg = error_of([&] { DeepseekV3::load(copy_model("bf16", "layers_2", c)); });
    EXPECT_THAT(msg, HasSubstr("tensor 'model.layers.2."));
    EXPECT_THAT(msg, HasSubstr("num_hidden_layers=2"));
    EXPECT_THAT(msg, HasSubstr("no 'model.layers.2.eh_proj.weight'"));

    c.num_hidden_layers = 1;
    c.num_nextn_predict_layers = 0;
    msg = error_of([&] { DeepseekV3::load(copy_model("bf16", "layers_1", c)); });
    EXPECT_THAT(msg, HasSubstr("tensor 'model.layers.1."));
    EXPECT_THAT(msg, HasSubstr("past the model's layers"));
    EXPECT_THAT(msg, HasSubstr("num_hidden_layers=1 and num_nextn_predict_layers=0"));

    c = small_config();
    c.num_nextn_predict_layers = 0;  // the MTP layer's tensors are then past the model
    msg = error_of([&] { DeepseekV3::load(copy_model("bf16", "no_nextn", c)); });
    EXPECT_THAT(msg, HasSubstr("tensor 'model.layers.3."));
    EXPECT_THAT(msg, HasSubstr("num_hidden_layers=3 and num_nextn_predict_layers=0"));
}

TEST_F(ModelTest, CheckpointWithFewerLayersThanTheConfigIsAnError) {
    io::ModelConfig c = small_config();
    c.num_hidden_layers = 4;  // the MTP layer at 3 would be read as a decoder layer
    std::string msg = error_of([&] { DeepseekV3::load(copy_model("bf16", "layers_4", c)); });
    EXPECT_THAT(msg, HasSubstr("tensor 'model.layers.3.eh_proj.weight' makes layer 3 an MTP layer"));
    EXPECT_THAT(msg, HasSubstr("num_hidden_layers=4"));
    c.num_hidden_layers = 6;  // layer 4 is in no file: a missing tensor
    msg = error_of([&] { DeepseekV3::load(copy_model("bf16", "layers_6", c)); });
    EXPECT_THAT(msg, HasSubstr("has no tensor 'model.layers.4."));
}

TEST_F(ModelTest, MissingRouterBiasIsAnError) {
    for (const std::string bias :
         {"model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.3.mlp.gate.e_score_correction_bias"}) {
        SCOPED_TRACE(bias);
        const std::string dir = copy_model("bf16", "no_bias", std::nullopt,
                                           [&](const std::string& n, std::vector<uint8_t>&) { return n != bias; });
        const std::string msg = error_of([&] { DeepseekV3::load(dir); });
        EXPECT_THAT(msg, HasSubstr("has no tensor '" + bias + "'"));
        EXPECT_THAT(msg, HasSubstr("noaux_tc"));
    }
}

TEST_F(ModelTest, UnusedTensorsAreAWarningNotAnError) {
    const std::vector<std::string> extra = {"model.layers.0.self_attn.rotary_emb.inv_freq",
                                            "model.layers.1.self_attn.rotary_emb.inv_freq",
                                            "model.layers.2.self_attn.rotary_emb.inv_freq",
                                            "model.layers.3.self_attn.rotary_emb.inv_freq",
                                            "model.layers.1.mlp.experts.0.up_proj.bias",
                                            "extra.a",
                                            "extra.b"};
    const std::string dir = copy_model("bf16", "extras", std::nullopt, {}, extra);
    ::testing::internal::CaptureStderr();
    std::unique_ptr<DeepseekV3> m;
    EXPECT_NO_THROW(m = DeepseekV3::load(dir));
    const std::string err = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(m);
    EXPECT_EQ(m->weights().unused_tensors.size(), extra.size());
    // Sorted, the first five named, then a count.
    EXPECT_THAT(err, HasSubstr("warning: checkpoint '" + dir +
                               "': 7 tensors the model does not use, ignored: extra.a, "
                               "extra.b, model.layers.0.self_attn.rotary_emb.inv_freq, "
                               "model.layers.1.mlp.experts.0.up_proj.bias, "
                               "model.layers.1.self_attn.rotary_emb.inv_freq and 2 more\n"));
    EXPECT_THAT(err, Not(HasSubstr("model.layers.3.self_attn")));

    // A checkpoint without extras warns of nothing, and neither does a rank that skips other ranks'
    // experts (fp8: their weight_scale_inv too).
    ::testing::internal::CaptureStderr();
    m = DeepseekV3::load(*dir_ + "/bf16");
    const ModelWeights w =
        load_weights(io::Checkpoint::open(*dir_ + "/fp8"), io::load_model_config(*dir_ + "/fp8"), ParallelConfig{0, 4});
    EXPECT_THAT(::testing::internal::GetCapturedStderr(), Not(HasSubstr("warning")));
    EXPECT_TRUE(m->weights().unused_tensors.empty());
    EXPECT_TRUE(w.unused_tensors.empty());
    EXPECT_EQ(w.layers[1].moe.experts.size(), 4u);
}

TEST_F(ModelTest, NonFiniteWeightsAndBadScalesAreErrorsNamingTheTensorAndElement) {
    struct Case {
        const char* model;
        std::string tensor;
        int64_t index;
        std::string value;
        std::string expected;
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::string kScale = "model.layers.0.self_attn.q_a_proj.weight_scale_inv";  // [1, 2]
    const std::vector<Case> cases = {
        // bf16 weights in the mapping, [96, 256] and [256, 128]; the whole embedding table.
        {"bf16", "model.layers.1.mlp.experts.5.up_proj.weight", 777, bf16_bits(0x7fc0),
         "has NaN at element 777 (row 3, column 9): weights must be finite"},
        {"bf16", "model.layers.0.self_attn.o_proj.weight", 5, bf16_bits(0xff80),
         "has -Inf at element 5 (row 0, column 5)"},
        {"bf16", "model.embed_tokens.weight", 1000 * 256 - 1, bf16_bits(0x7f80),
         "has +Inf at element 255999 (row 999, column 255)"},
        {"bf16", "model.layers.3.embed_tokens.weight", 0, bf16_bits(0x7fc1), "has NaN at element 0"},
        {"bf16", "lm_head.weight", 1000, bf16_bits(0x7f80), "has +Inf at element 1000 (row 3, column 232)"},
        // Converted to f32 at load: a norm (bf16) and the router bias (f32).
        {"bf16", "model.layers.2.input_layernorm.weight", 3, bf16_bits(0x7fc0), "has NaN at element 3"},
        {"bf16", "model.layers.1.mlp.gate.e_score_correction_bias", 2, f32_value(nan), "has NaN at element 2"},
        // fp8 e4m3fn: NaN is S.1111.111; scales must be finite and not negative.
        {"fp8", "model.layers.0.self_attn.q_a_proj.weight", 1234, fp8_byte(0x7f),
         "has NaN (byte 0x7f) at element 1234 (row 4, column 210): weights must be finite"},
        {"fp8", "model.layers.1.mlp.experts.0.down_proj.weight", 0, fp8_byte(0xff), "has NaN (byte 0xff) at element 0"},
        {"fp8", kScale, 1, f32_value(-0.5f),
         "has -0.5 at element 1 (row 0, column 1): fp8 block scales must be finite"},
        {"fp8", kScale, 1, f32_value(nan), "has NaN at element 1"},
        {"fp8", kScale, 1, f32_value(inf), "has +Inf at element 1"},
    };
    for (const Case& k : cases) {
        SCOPED_TRACE(k.tensor + " " + k.expected);
        const std::string dir = copy_model(k.model, "bad_value", std::nullopt, set_element(k.tensor, k.index, k.value));
        const std::string msg = error_of([&] { DeepseekV3::load(dir); });
        EXPECT_THAT(msg, HasSubstr(dir + "/model.safetensors: tensor '" + k.tensor + "' " + k.expected));
    }
    // Finite extremes, a tiny scale and a zero scale load.
    const std::string dir =
        copy_model("fp8", "good_value", std::nullopt, [&](const std::string& n, std::vector<uint8_t>& b) {
            if (n == kScale) {  // a tiny scale, and a zero one (an all-zero block)
                set_element(kScale, 0, f32_value(std::numeric_limits<float>::denorm_min()))(n, b);
                set_element(kScale, 1, f32_value(0.0f))(n, b);
            }
            if (n == "model.layers.0.self_attn.q_a_proj.weight") set_element(n, 0, fp8_byte(0x7e))(n, b);  // 448
            if (n == "model.embed_tokens.weight") set_element(n, 0, bf16_bits(0xff7f))(n, b);  // bf16's lowest
            return true;
        });
    EXPECT_NO_THROW(DeepseekV3::load(dir));
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

// The same folder written sharded, then as one file: the shards and their index go, so the folder
// holds the model just written (before, the loader read the stale index: the previous model, without
// a word); a folder holding both layouts is refused, naming both.
TEST(Synthetic, RewritingAFolderLeavesOneCheckpoint) {
    const std::string d = fanout::testing::temp_dir("rewrite");
    io::ModelConfig c = preset_config("tiny", 1);
    c.vocab_size = 300;
    MakeModelOptions sharded;
    sharded.max_shard_bytes = 64 << 10;
    write_synthetic_model(d, c, sharded);
    ASSERT_TRUE(fs::exists(d + "/model.safetensors.index.json"));
    const io::Checkpoint many = io::Checkpoint::open(d);
    ASSERT_GT(many.num_shards(), 1);
    std::ofstream(d + "/notes.txt") << "not a weight file";
    MakeModelOptions single;
    std::vector<std::string> notes;
    single.note = [&](const std::string& n) { notes.push_back(n); };
    write_synthetic_model(d, c, single);
    EXPECT_EQ(static_cast<int64_t>(notes.size()), many.num_shards() + 1);  // the shards and their index, each told
    EXPECT_THAT(notes.back() + notes.front(), ::testing::HasSubstr("removed the previous checkpoint's"));
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(d)) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files, (std::vector<std::string>{"config.json", "model.safetensors", "notes.txt"}));
    EXPECT_EQ(io::Checkpoint::open(d).num_shards(), 1);
    std::ofstream(d + "/model.safetensors.index.json") << R"({"weight_map": {}})";
    EXPECT_THAT(fanout::testing::error_of([&] { io::Checkpoint::open(d); }),
                ::testing::HasSubstr("holds both model.safetensors and model.safetensors.index.json"));
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
