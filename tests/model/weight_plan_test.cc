// The GPU runner's weight plan streamed into host memory (the same plan and reader the device
// upload runs, with a host arena for a target): every array checked against the CPU model's
// dequantization of the checkpoint — bit-exactly wherever the FP8 blocks line up or the weight is
// bf16, within FP8 rounding where a fused weight's blocks straddle and are re-quantized — on
// sharded FP8 checkpoints of both kinds and a bf16 one; and bad values found while streaming.
#include "fanout/model/weight_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fanout/io/safetensors.h"
#include "fanout/model/synthetic.h"
#include "fanout/ops/fp8_quant.h"
#include "test_util.h"

namespace fanout::model {
namespace {

namespace fs = std::filesystem;
using fanout::testing::error_of;
using ::testing::HasSubstr;

// The arena in host memory; staging buffers are plain vectors, copies memcpy.
class HostTarget : public WeightTarget {
  public:
    HostTarget(size_t arena_bytes, int readers)
        : arena_(arena_bytes, 0xA5), staging_(static_cast<size_t>(readers) * 2, std::vector<uint8_t>(kStagingBytes)) {}
    uint8_t* staging(int reader, int slot) override { return staging_[static_cast<size_t>(reader * 2 + slot)].data(); }
    void wait(int, int) override {}
    void copy(int reader, int slot, size_t at, size_t n) override {
        ASSERT_LE(at + n, arena_.size());
        std::memcpy(arena_.data() + at, staging(reader, slot), n);
    }
    void finish(int) override {}
    void write(size_t at, const uint8_t* host, size_t n) override {
        ASSERT_LE(at + n, arena_.size());
        std::memcpy(arena_.data() + at, host, n);
    }
    const std::vector<uint8_t>& arena() const { return arena_; }

  private:
    std::vector<uint8_t> arena_;  // poisoned: a byte no fill writes shows up as garbage
    std::vector<std::vector<uint8_t>> staging_;
};

struct Loaded {
    io::ModelConfig config;
    ModelWeights weights;
};

Loaded bind_model(const std::string& dir) {
    Loaded l{io::load_model_config(dir), {}};
    LoadOptions o;
    o.check_values = false;
    l.weights = load_weights(io::Checkpoint::open(dir), l.config, {}, o);
    return l;
}

// Values of array `a` read as f32 (bf16 or f32 storage).
class Arena {
  public:
    Arena(const WeightPlan& plan, const std::vector<uint8_t>& bytes) : plan_(plan), bytes_(bytes) {}
    const uint8_t* at(int a) const { return bytes_.data() + plan_.arrays[static_cast<size_t>(a)].offset; }
    float bf16(int a, size_t i) const {
        uint16_t v;
        std::memcpy(&v, at(a) + 2 * i, 2);
        return bf16_to_f32(v);
    }
    float f32(int a, size_t i) const {
        float v;
        std::memcpy(&v, at(a) + 4 * i, 4);
        return v;
    }
    // Element (b, n, k) of a matrix as the GPU computes with it.
    float value(const MatrixPlan& m, int64_t b, int64_t n, int64_t k) const {
        const size_t i = static_cast<size_t>((b * m.N + n) * m.K + k);
        if (!m.fp8) return bf16(m.bf16, i);
        const int64_t nbN = ops::ceil_div(m.N, ops::kFp8Block), nbK = ops::ceil_div(m.K, ops::kFp8Block);
        const float s = f32(m.scale, static_cast<size_t>((b * nbN + n / ops::kFp8Block) * nbK + k / ops::kFp8Block));
        return fp8e4m3_to_f32(at(m.q)[i]) * s;
    }
    float scale_of(const MatrixPlan& m, int64_t b, int64_t n, int64_t k) const {
        const int64_t nbN = ops::ceil_div(m.N, ops::kFp8Block), nbK = ops::ceil_div(m.K, ops::kFp8Block);
        return f32(m.scale, static_cast<size_t>((b * nbN + n / ops::kFp8Block) * nbK + k / ops::kFp8Block));
    }

  private:
    const WeightPlan& plan_;
    const std::vector<uint8_t>& bytes_;
};

// Whether a matrix's values come from the checkpoint's bytes (not prepared on the host).
bool streamed(const WeightPlan& plan, const MatrixPlan& m) {
    const int a = m.fp8 ? m.q : m.bf16;
    for (const auto& f : plan.arrays[static_cast<size_t>(a)].fills)
        if (f.host) return false;
    return true;
}

// The reference of a matrix: element (b, n, k) as the CPU model dequantizes the checkpoint.
using Reference = std::function<float(int64_t b, int64_t n, int64_t k)>;

// Rows of `parts` stacked along N, for batch b.
Reference stacked_rows(std::vector<std::vector<const ops::LinearWeight*>> batches) {
    auto cache = std::make_shared<std::map<std::pair<int64_t, int64_t>, std::vector<float>>>();
    return [batches, cache](int64_t b, int64_t n, int64_t k) {
        auto& row = (*cache)[{b, n}];
        if (row.empty()) {
            int64_t r = n;
            for (const auto* p : batches[static_cast<size_t>(b)]) {
                if (r < p->out_features) {
                    row.resize(static_cast<size_t>(p->in_features));
                    p->row_f32(r, row.data());
                    break;
                }
                r -= p->out_features;
            }
        }
        return row[static_cast<size_t>(k)];
    };
}

// Bit-exact where `exact`, else within FP8 e4m3 rounding of the re-quantized block (3 mantissa
// bits: half an ulp is 1/16 of the value, plus the subnormal step). bf16 targets hold the
// reference rounded to bf16, exactly.
void expect_matrix(const Arena& arena, const MatrixPlan& m, const Reference& ref, bool exact, const std::string& what) {
    const bool bf16_round = !m.fp8;
    exact = exact || bf16_round;
    ASSERT_GT(m.N, 0) << what;
    int64_t bad = 0;
    for (int64_t b = 0; b < m.batch; ++b)
        for (int64_t n = 0; n < m.N; ++n)
            for (int64_t k = 0; k < m.K; ++k) {
                const float want = bf16_round ? round_to_bf16(ref(b, n, k)) : ref(b, n, k);
                const float got = arena.value(m, b, n, k);
                const bool ok = exact ? std::memcmp(&got, &want, 4) == 0
                                      : std::fabs(got - want) <= std::fabs(want) / 16 +
                                                                     (m.fp8 ? arena.scale_of(m, b, n, k) / 512 : 0.0f) +
                                                                     std::fabs(want) / 128;
                if (!ok && bad++ < 3)
                    ADD_FAILURE() << what << " [" << b << ", " << n << ", " << k << "]: got " << got << ", want "
                                  << want << (exact ? " (bit-exact)" : "");
            }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " elements differ";
}

// Every array of the plan against the CPU model's values.
void expect_plan_matches(const Loaded& l, const WeightPlan& plan, const std::vector<uint8_t>& bytes) {
    const io::ModelConfig& c = l.config;
    const ModelWeights& w = l.weights;
    const Arena arena(plan, bytes);
    const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim;
    // Streamed FP8 is the checkpoint's own bytes and scales; re-quantized blocks only round.
    const auto check = [&](const MatrixPlan& m, const Reference& ref, const std::string& what) {
        expect_matrix(arena, m, ref, streamed(plan, m), what);
    };
    const auto check_layer = [&](const LayerWeights& lw, const LayerPlan& p, const std::string& L) {
        const AttentionWeights& a = lw.attn;
        for (int64_t i = 0; i < c.hidden_size; ++i) {
            ASSERT_EQ(arena.f32(p.input_norm, static_cast<size_t>(i)), lw.input_norm.data_as<float>()[i]);
            ASSERT_EQ(arena.f32(p.post_norm, static_cast<size_t>(i)), lw.post_norm.data_as<float>()[i]);
        }
        check(p.qkv_a, stacked_rows({{&a.q_a, &a.kv_a}}), L + "q_a|kv_a");
        check(p.q_b, stacked_rows({{&a.q_b}}), L + "q_b");
        check(p.kv_b, stacked_rows({{&a.kv_b}}), L + "kv_b");
        check(p.o, stacked_rows({{&a.o}}), L + "o_proj");
        const Reference kv_b = stacked_rows({{&a.kv_b}});
        // k_b / v_b: bf16, each value the checkpoint's dequantized one rounded (bit-exact).
        expect_matrix(
            arena, p.k_b, [&](int64_t h, int64_t cc, int64_t n) { return kv_b(0, h * (nope + v) + n, cc); }, true,
            L + "k_b");
        expect_matrix(
            arena, p.v_b, [&](int64_t h, int64_t j, int64_t cc) { return kv_b(0, h * (nope + v) + nope + j, cc); },
            true, L + "v_b");
        ASSERT_EQ(p.k_b.batch, H);
        const MlpWeights* mlp = lw.is_moe ? (lw.moe.shared ? &*lw.moe.shared : nullptr) : &lw.mlp;
        if (mlp) {
            check(p.gate_up, stacked_rows({{&mlp->gate, &mlp->up}}), L + "gate|up");
            check(p.down, stacked_rows({{&mlp->down}}), L + "down");
        }
        if (lw.is_moe) {
            std::vector<std::vector<const ops::LinearWeight*>> gu, dn;
            for (const auto& e : lw.moe.experts) {
                gu.push_back({&e.gate, &e.up});
                dn.push_back({&e.down});
            }
            check(p.experts_gate_up, stacked_rows(gu), L + "experts gate|up");
            check(p.experts_down, stacked_rows(dn), L + "experts down");
            const Reference router = stacked_rows({{&lw.moe.router}});
            for (int64_t e = 0; e < c.n_routed_experts; ++e)
                for (int64_t k = 0; k < c.hidden_size; ++k)
                    ASSERT_EQ(arena.bf16(p.router, static_cast<size_t>(e * c.hidden_size + k)),
                              round_to_bf16(router(0, e, k)));
        }
    };
    for (int64_t l2 = 0; l2 < c.num_hidden_layers; ++l2)
        check_layer(w.layers[static_cast<size_t>(l2)], plan.layers[static_cast<size_t>(l2)],
                    "layer " + std::to_string(l2) + " ");
    // The embedding and a head, every 7th row of each.
    std::vector<float> row(static_cast<size_t>(c.hidden_size));
    const auto check_tables = [&](const Tensor& embed, int embed_at, const ops::LinearWeight& head, int head_at) {
        for (int64_t t = 0; t < c.vocab_size; t += 7) {
            convert_to_f32(static_cast<const uint8_t*>(embed.data()) + t * c.hidden_size * dtype_size(embed.dtype()),
                           embed.dtype(), row.size(), row.data());
            for (int64_t k = 0; k < c.hidden_size; ++k)
                ASSERT_EQ(arena.bf16(embed_at, static_cast<size_t>(t * c.hidden_size + k)), round_to_bf16(row[k]));
            head.row_f32(t, row.data());
            for (int64_t k = 0; k < c.hidden_size; ++k)
                ASSERT_EQ(arena.bf16(head_at, static_cast<size_t>(t * c.hidden_size + k)), round_to_bf16(row[k]));
        }
    };
    check_tables(w.embed, plan.embed, w.lm_head, plan.lm_head);
    if (!plan.mtp) return;
    const MtpWeights& m = *w.mtp;
    check_layer(m.layer, plan.mtp->layer, "MTP layer ");
    check(plan.mtp->eh_proj, stacked_rows({{&m.eh_proj}}), "eh_proj");
    for (int64_t i = 0; i < c.hidden_size; ++i) {
        ASSERT_EQ(arena.f32(plan.mtp->enorm, static_cast<size_t>(i)), m.enorm.data_as<float>()[i]);
        ASSERT_EQ(arena.f32(plan.mtp->hnorm, static_cast<size_t>(i)), m.hnorm.data_as<float>()[i]);
        ASSERT_EQ(arena.f32(plan.mtp->head_norm, static_cast<size_t>(i)), m.head_norm.data_as<float>()[i]);
    }
    check_tables(m.embed, plan.mtp->embed, m.head, plan.mtp->head);
}

// Widths where every FP8 block lines up with the GPU layout (as DeepSeek-V3's): 128-row q_a and
// gate / up, heads of 128 + 128 rows in kv_b; small enough for a unit test.
io::ModelConfig aligned_config() {
    io::ModelConfig c = preset_config("tiny");
    c.vocab_size = 512;
    c.hidden_size = 256;
    c.q_lora_rank = 128;
    c.kv_lora_rank = 128;
    c.num_attention_heads = 2;
    c.qk_nope_head_dim = 128;
    c.v_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.intermediate_size = 384;
    c.moe_intermediate_size = 128;
    c.n_routed_experts = 4;
    c.num_experts_per_tok = 2;
    c.n_group = 1;
    c.topk_group = 1;
    c.num_hidden_layers = 2;
    c.first_k_dense_replace = 1;
    c.fp8 = io::Fp8QuantConfig{};
    return c;
}

class WeightPlanTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new std::string(fanout::testing::temp_dir("weight_plan"));
        MakeModelOptions sharded;
        sharded.max_shard_bytes = 256 << 10;  // many shards: tensors of one layer spread over files
        write_synthetic_model(*dir_ + "/aligned", aligned_config(), sharded);
        io::ModelConfig tiny = preset_config("tiny");
        tiny.vocab_size = 1000;
        io::ModelConfig tiny_fp8 = tiny;
        tiny_fp8.fp8 = io::Fp8QuantConfig{};
        write_synthetic_model(*dir_ + "/straddling", tiny_fp8, sharded);
        write_synthetic_model(*dir_ + "/bf16", tiny, sharded);
        MakeModelOptions own = sharded;
        own.mtp_copies_embed_and_head = false;
        write_synthetic_model(*dir_ + "/mtp_own", tiny, own);
    }
    static void TearDownTestSuite() {
        fs::remove_all(*dir_);
        delete dir_;
    }
    // Plans and streams `name` with `readers` readers; returns the arena's bytes.
    static std::vector<uint8_t> stream(const Loaded& l, const WeightPlan& plan, int readers,
                                       StreamStats* st = nullptr) {
        HostTarget t(plan.arena_bytes, readers);
        stream_weights(plan, l.weights, t, readers, {}, st);
        return t.arena();
    }
    static std::string* dir_;
};
std::string* WeightPlanTest::dir_ = nullptr;

TEST_F(WeightPlanTest, AlignedFp8IsStreamedAsItIsAndBitExact) {
    const Loaded l = bind_model(*dir_ + "/aligned");
    ASSERT_GT(l.weights.checkpoint.num_shards(), 3);
    const WeightPlan plan = plan_weights(l.config, l.weights);
    // Nothing re-quantized: the host prepares only norms, the router bias and k_b / v_b (kv_b
    // split per head, dequantized to bf16 for the absorbed form's bf16 projections).
    for (const LayerPlan& p : plan.layers) {
        for (const MatrixPlan* m :
             {&p.qkv_a, &p.q_b, &p.kv_b, &p.o, &p.gate_up, &p.down, &p.experts_gate_up, &p.experts_down})
            if (m->N > 0) {
                EXPECT_TRUE(m->fp8);
                EXPECT_TRUE(streamed(plan, *m));
            }
        EXPECT_FALSE(p.k_b.fp8);
        EXPECT_FALSE(p.v_b.fp8);
    }
    StreamStats st;
    const auto bytes = stream(l, plan, 3, &st);
    EXPECT_EQ(st.readers, 3);
    EXPECT_DOUBLE_EQ(st.bytes, plan.stream_bytes);
    expect_plan_matches(l, plan, bytes);
}

// One expert stored in another dtype than the rest of its layer is refused by name, before
// anything is stacked (before: the whole layer was dequantized on the host, ~30 GB at V3's
// widths, and the error then named expert 0).
TEST_F(WeightPlanTest, AnExpertInAnotherDtypeIsNamed) {
    Loaded l = bind_model(*dir_ + "/aligned");
    ops::LinearWeight& up = l.weights.layers[1].moe.experts[3].up;
    up.dtype = DType::kBF16;  // as a checkpoint whose expert 3 was saved unquantized
    up.scale_inv = nullptr;
    EXPECT_THAT(error_of([&] { plan_weights(l.config, l.weights); }),
                HasSubstr("'model.layers.1.mlp.experts.3.up_proj.weight' is BF16 while "
                          "'model.layers.1.mlp.experts.0.gate_proj.weight' is F8_E4M3"));
}

TEST_F(WeightPlanTest, StraddlingBlocksAreRequantizedTheRestStreamed) {
    const Loaded l = bind_model(*dir_ + "/straddling");
    const WeightPlan plan = plan_weights(l.config, l.weights);
    EXPECT_FALSE(streamed(plan, plan.layers[0].qkv_a));  // q_a's 96 rows straddle the first block
    EXPECT_TRUE(streamed(plan, plan.layers[0].q_b));
    expect_plan_matches(l, plan, stream(l, plan, 2));
}

TEST_F(WeightPlanTest, Bf16IsStreamedBitExact) {
    const Loaded l = bind_model(*dir_ + "/bf16");
    const WeightPlan plan = plan_weights(l.config, l.weights);
    expect_plan_matches(l, plan, stream(l, plan, 4));
}

TEST_F(WeightPlanTest, ReaderCountDoesNotChangeTheBytes) {
    const Loaded l = bind_model(*dir_ + "/aligned");
    const WeightPlan plan = plan_weights(l.config, l.weights);
    EXPECT_EQ(stream(l, plan, 1), stream(l, plan, 5));
}

TEST_F(WeightPlanTest, AnEpRankReadsOnlyItsExperts) {
    // Rank 1 of EP2 binds experts 2 and 3 of 4: the plan stacks those two, reads nothing of the
    // others, and the rest (attention, shared expert, router) as EP1 does.
    const std::string dir = *dir_ + "/aligned";
    const Loaded all = bind_model(dir);
    Loaded rank{io::load_model_config(dir), {}};
    LoadOptions o;
    o.check_values = false;
    ParallelConfig sp;
    sp.rank = 1;
    sp.ep = 2;
    rank.weights = load_weights(io::Checkpoint::open(dir), rank.config, sp, o);
    const WeightPlan full = plan_weights(all.config, all.weights), half = plan_weights(rank.config, rank.weights);
    const MatrixPlan& gu = half.layers[1].experts_gate_up;
    ASSERT_EQ(gu.batch, 2);
    const auto expert_bytes = [](const WeightPlan& p) {
        return double(p.arrays[size_t(p.layers[1].experts_gate_up.q)].bytes +
                      p.arrays[size_t(p.layers[1].experts_gate_up.scale)].bytes +
                      p.arrays[size_t(p.layers[1].experts_down.q)].bytes +
                      p.arrays[size_t(p.layers[1].experts_down.scale)].bytes);
    };
    EXPECT_DOUBLE_EQ(full.stream_bytes - half.stream_bytes, expert_bytes(full) / 2);
    const auto bytes = stream(rank, half, 2);
    const Arena arena(half, bytes);
    std::vector<std::vector<const ops::LinearWeight*>> mine;
    for (int64_t e = 2; e < 4; ++e) {
        const MlpWeights& m = all.weights.layers[1].moe.experts[size_t(e)];
        mine.push_back({&m.gate, &m.up});
    }
    expect_matrix(arena, gu, stacked_rows(mine), true, "rank 1's experts gate|up");
}

// With the MTP layer (MTP drafting on the GPU): its embedding and head are the model's arrays when
// they are copies of them (DeepSeek-V3's checkpoint; the synthetic one mirrors it), arrays of their
// own otherwise; either way the streamed bytes are the checkpoint's.
TEST_F(WeightPlanTest, TheMtpLayerSharesTheModelsEmbeddingAndHeadWhenTheyAreCopies) {
    const Loaded copies = bind_model(*dir_ + "/bf16"), own = bind_model(*dir_ + "/mtp_own");
    const WeightPlan plain = plan_weights(copies.config, copies.weights);
    const WeightPlan shared = plan_weights(copies.config, copies.weights, true);
    const WeightPlan separate = plan_weights(own.config, own.weights, true);
    ASSERT_TRUE(shared.mtp && separate.mtp);
    EXPECT_FALSE(plain.mtp);
    EXPECT_EQ(shared.mtp->embed, shared.embed);
    EXPECT_EQ(shared.mtp->head, shared.lm_head);
    EXPECT_NE(separate.mtp->embed, separate.embed);
    EXPECT_NE(separate.mtp->head, separate.lm_head);
    const double table = static_cast<double>(copies.config.vocab_size * copies.config.hidden_size * 2);  // bf16
    EXPECT_NEAR(static_cast<double>(separate.arena_bytes - shared.arena_bytes), 2 * table, 2 * WeightPlan::kAlign);
    expect_plan_matches(copies, shared, stream(copies, shared, 3));
    expect_plan_matches(own, separate, stream(own, separate, 3));
}

TEST_F(WeightPlanTest, BadValuesAreFoundWhileStreaming) {
    // A copy of the aligned checkpoint with a NaN (fp8 0x7f) in an expert's weight and a negative
    // block scale elsewhere: binding succeeds, streaming names the tensor, file and element.
    const std::string bad = *dir_ + "/bad";
    fs::copy(*dir_ + "/aligned", bad, fs::copy_options::recursive);
    const Loaded probe = bind_model(bad);
    const std::string name = "model.layers.1.mlp.experts.2.up_proj.weight";
    const std::string file = probe.weights.checkpoint.file_of(name);
    const size_t offset = io::SafetensorsFile::open(file).entry(name).offset;
    {
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(offset + 3 * 256 + 17));  // row 3, column 17
        const char nan = 0x7f;
        f.write(&nan, 1);
    }
    const Loaded l = bind_model(bad);  // no value checks while binding
    const WeightPlan plan = plan_weights(l.config, l.weights);
    const std::string msg = error_of([&] { stream(l, plan, 3); });
    EXPECT_THAT(msg, HasSubstr(name));
    EXPECT_THAT(msg, HasSubstr("NaN"));
    EXPECT_THAT(msg, HasSubstr("row 3, column 17"));
    EXPECT_THAT(msg, HasSubstr(file));
    fs::remove_all(bad);
}

}  // namespace
}  // namespace fanout::model
