#include "fanout/model/weights.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include "fanout/core/thread_pool.h"
#include "fanout/ops/fp8_quant.h"

namespace fanout::model {
namespace {

using io::Checkpoint;
using ops::LinearWeight;

constexpr std::initializer_list<DType> kFloatTypes = {DType::kBF16, DType::kF16, DType::kF32};

// ---------------------------------------------------------------------------------------------
// Value checks: no NaN or Inf in any weight, and fp8 block scales finite and not negative (a zero
// scale is an all-zero block, which a quantizer may write).

// The first index in [begin, end) whose key(p[i]) >= threshold, or -1. Each block is max-reduced
// first (which vectorizes), and only a block with a hit is walked again for the index.
template <typename T, typename Key>
int64_t first_flagged(const T* p, int64_t begin, int64_t end, T threshold, Key key) {
    constexpr int64_t kBlock = 4096;
    for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t e = std::min(end, b + kBlock);
        T m = 0;
        for (int64_t i = b; i < e; ++i) m = std::max<T>(m, key(p[i]));
        if (m < threshold) continue;
        for (int64_t i = b; i < e; ++i)
            if (key(p[i]) >= threshold) return i;
    }
    return -1;
}

// The first element in [begin, end) that is NaN or ±Inf (kFinite), or that is not a finite,
// non-negative f32 (kNonNegativeScale); -1 when none. Bit tests only: a float is NaN or Inf when its exponent
// field is all ones; fp8 e4m3fn has no Inf, and S.1111.111 (byte 0x7f / 0xff) is its NaN.
int64_t first_bad_value(const void* data, DType dtype, WeightCheck::Kind check, int64_t begin, int64_t end) {
    switch (dtype) {
        case DType::kF32: {
            const auto* p = static_cast<const uint32_t*>(data);
            // ±0 (an all-zero block) is kept; bits - 1 puts negatives, NaN and Inf past the largest finite's.
            if (check == WeightCheck::kScale)
                return first_flagged<uint32_t>(p, begin, end, 0x7f7fffffu,
                                               [](uint32_t v) -> uint32_t { return (v << 1) == 0 ? 0u : v - 1u; });
            return first_flagged<uint32_t>(p, begin, end, 0x7f800000u,
                                           [](uint32_t v) -> uint32_t { return v & 0x7fffffffu; });
        }
        case DType::kBF16:
            return first_flagged<uint16_t>(static_cast<const uint16_t*>(data), begin, end, 0x7f80,
                                           [](uint16_t v) -> uint16_t { return v & 0x7fff; });
        case DType::kF16:
            return first_flagged<uint16_t>(static_cast<const uint16_t*>(data), begin, end, 0x7c00,
                                           [](uint16_t v) -> uint16_t { return v & 0x7fff; });
        case DType::kFP8E4M3:
            return first_flagged<uint8_t>(static_cast<const uint8_t*>(data), begin, end, 0x7f,
                                          [](uint8_t v) -> uint8_t { return v & 0x7f; });
        default:
            return -1;
    }
}

// ---------------------------------------------------------------------------------------------
// Binding

// Binds tensors for load_weights: remembers every name the model reads (what is left over is
// reported as unused), copies small tensors to f32 checking them as they are converted, and queues
// the weights that stay in the mapping for check_values().
class Binder {
  public:
    explicit Binder(const Checkpoint& ck) : ck_(ck) {}
    const Checkpoint& checkpoint() const { return ck_; }
    bool has(const std::string& name) const { return ck_.has(name); }

    // A tensor left in the mapping, of one of `dtypes` and exactly `shape`.
    Tensor get(const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape,
               WeightCheck::Kind check = WeightCheck::kFinite) {
        Tensor t = ck_.get(name, dtypes, shape);
        read_.insert(name);
        checks_.push_back({name, t.data(), t.dtype(), t.shape(), check});
        return t;
    }

    // A [dim] tensor (a norm, the router bias) copied to f32.
    Tensor get_f32(const std::string& name, int64_t dim) {
        Tensor src = ck_.get(name, kFloatTypes, {dim});
        read_.insert(name);
        Tensor out = Tensor::zeros({dim}, DType::kF32);
        convert_to_f32(src.data(), src.dtype(), static_cast<size_t>(dim), out.data_as<float>());
        const int64_t bad = first_bad_value(out.data(), DType::kF32, WeightCheck::kFinite, 0, dim);
        if (bad >= 0) fail_weight_value(ck_, {name, src.data(), src.dtype(), src.shape()}, bad);
        return out;
    }

    // A name the model reads that this rank does not (another rank's expert): not unused.
    void skip(const std::string& name) { read_.insert(name); }

    // The weights queued for value checks, in binding order.
    std::vector<WeightCheck> take_checks() { return std::move(checks_); }

    // The checkpoint's tensors that nothing read or skipped, sorted.
    std::vector<std::string> unused() const {
        std::vector<std::string> out;
        for (const auto& name : ck_.names())
            if (read_.count(name) == 0) out.push_back(name);
        return out;
    }

  private:
    const Checkpoint& ck_;
    std::set<std::string> read_;
    std::vector<WeightCheck> checks_;
};

// `prefix`.weight [out, in], in a float dtype or fp8 with `prefix`.weight_scale_inv.
LinearWeight load_linear(Binder& b, const std::string& prefix, int64_t out, int64_t in) {
    const std::string name = prefix + ".weight";
    Tensor w = b.get(name, {DType::kBF16, DType::kF16, DType::kF32, DType::kFP8E4M3}, {out, in});
    LinearWeight lw;
    lw.dtype = w.dtype();
    lw.data = w.data();
    lw.out_features = out;
    lw.in_features = in;
    if (w.dtype() == DType::kFP8E4M3) {
        const std::string sname = prefix + ".weight_scale_inv";
        FANOUT_CHECK(b.has(sname), "{}: fp8 tensor '{}' has no '{}' beside it", b.checkpoint().file_of(name), name,
                     sname);
        Tensor s = b.get(sname, {DType::kF32}, {ops::ceil_div(out, ops::kFp8Block), ops::ceil_div(in, ops::kFp8Block)},
                         WeightCheck::kScale);
        lw.scale_inv = s.data_as<float>();
    }
    return lw;
}

constexpr const char* kMlpProjections[] = {"gate_proj", "up_proj", "down_proj"};

MlpWeights load_mlp(Binder& b, const std::string& prefix, int64_t hidden, int64_t inter) {
    return {load_linear(b, prefix + ".gate_proj", inter, hidden), load_linear(b, prefix + ".up_proj", inter, hidden),
            load_linear(b, prefix + ".down_proj", hidden, inter)};
}

// What load_mlp would read, for an expert another rank holds.
void skip_mlp(Binder& b, const std::string& prefix) {
    for (const char* proj : kMlpProjections) {
        b.skip(fmt::format("{}.{}.weight", prefix, proj));
        b.skip(fmt::format("{}.{}.weight_scale_inv", prefix, proj));
    }
}

AttentionWeights load_attention(Binder& b, const std::string& p, const io::ModelConfig& c) {
    AttentionWeights a;
    const int64_t H = c.num_attention_heads, D = c.hidden_size;
    if (c.q_lora_rank > 0) {
        a.q_a = load_linear(b, p + "q_a_proj", c.q_lora_rank, D);
        a.q_a_norm = b.get_f32(p + "q_a_layernorm.weight", c.q_lora_rank);
        a.q_b = load_linear(b, p + "q_b_proj", H * c.qk_head_dim(), c.q_lora_rank);
    } else {
        a.q_proj = load_linear(b, p + "q_proj", H * c.qk_head_dim(), D);
    }
    a.kv_a = load_linear(b, p + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, D);
    a.kv_a_norm = b.get_f32(p + "kv_a_layernorm.weight", c.kv_lora_rank);
    a.kv_b = load_linear(b, p + "kv_b_proj", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
    a.o = load_linear(b, p + "o_proj", D, H * c.v_head_dim);
    return a;
}

// Rows [r0, r0 + n) of w as an f32 matrix in `owned`.
ops::LinearWeight f32_rows(const ops::LinearWeight& w, int64_t r0, int64_t n, std::vector<Tensor>& owned) {
    Tensor t = Tensor::zeros({n, w.in_features}, DType::kF32);
    for (int64_t r = 0; r < n; ++r) w.row_f32(r0 + r, t.data_as<float>() + r * w.in_features);
    owned.push_back(t);
    return {DType::kF32, t.data(), n, w.in_features, nullptr};
}

// Columns [c0, c0 + k) of w as an f32 matrix in `owned`.
ops::LinearWeight f32_cols(const ops::LinearWeight& w, int64_t c0, int64_t k, std::vector<Tensor>& owned) {
    Tensor t = Tensor::zeros({w.out_features, k}, DType::kF32);
    std::vector<float> row(static_cast<size_t>(w.in_features));
    for (int64_t n = 0; n < w.out_features; ++n) {
        w.row_f32(n, row.data());
        std::copy(row.begin() + c0, row.begin() + c0 + k, t.data_as<float>() + n * k);
    }
    owned.push_back(t);
    return {DType::kF32, t.data(), w.out_features, k, nullptr};
}

// Tensor-parallel attention: this rank's heads of the per-head projections.
void shard_heads(AttentionWeights& a, const io::ModelConfig& c, const ParallelConfig& plan,
                 std::vector<Tensor>& owned) {
    if (plan.tp == 1) return;
    const int64_t h = c.num_attention_heads / plan.tp, h0 = h * plan.tp_rank();
    ops::LinearWeight& q = c.q_lora_rank > 0 ? a.q_b : a.q_proj;
    q = f32_rows(q, h0 * c.qk_head_dim(), h * c.qk_head_dim(), owned);
    const int64_t kv = c.qk_nope_head_dim + c.v_head_dim;
    a.kv_b = f32_rows(a.kv_b, h0 * kv, h * kv, owned);
    a.o = f32_cols(a.o, h0 * c.v_head_dim, h * c.v_head_dim, owned);
}

LayerWeights load_layer(Binder& b, int64_t layer, const io::ModelConfig& c, const ParallelConfig& plan) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    LayerWeights lw;
    lw.input_norm = b.get_f32(p + "input_layernorm.weight", c.hidden_size);
    lw.post_norm = b.get_f32(p + "post_attention_layernorm.weight", c.hidden_size);
    lw.attn = load_attention(b, p + "self_attn.", c);
    // The MTP layer (index num_hidden_layers) is always an MoE layer when the model has experts.
    lw.is_moe = c.is_moe_layer(layer);
    if (!lw.is_moe) {
        lw.mlp = load_mlp(b, p + "mlp", c.hidden_size, c.intermediate_size);
        return lw;
    }
    const int64_t E = c.n_routed_experts;
    MoeWeights& m = lw.moe;
    m.router = load_linear(b, p + "mlp.gate", E, c.hidden_size);
    // topk_method noaux_tc (the only one parse_model_config accepts) selects experts by score + this
    // bias; a checkpoint without it would route differently from the model it was trained as.
    const std::string bias_name = p + "mlp.gate.e_score_correction_bias";
    FANOUT_CHECK(b.has(bias_name),
                 "checkpoint '{}' has no tensor '{}': topk_method 'noaux_tc' routes every MoE layer's tokens with "
                 "this per-expert bias",
                 b.checkpoint().dir(), bias_name);
    m.bias = b.get_f32(bias_name, E);
    const ParallelConfig::Range mine = plan.experts(E);
    m.expert_begin = mine.begin;
    m.expert_end = mine.end;
    for (int64_t e = 0; e < E; ++e) {
        const std::string prefix = fmt::format("{}mlp.experts.{}", p, e);
        if (e >= m.expert_begin && e < m.expert_end)
            m.experts.push_back(load_mlp(b, prefix, c.hidden_size, c.moe_intermediate_size));
        else
            skip_mlp(b, prefix);
    }
    if (c.n_shared_experts > 0)
        m.shared = load_mlp(b, p + "mlp.shared_experts", c.hidden_size, c.moe_intermediate_size * c.n_shared_experts);
    return lw;
}

// ---------------------------------------------------------------------------------------------
// Checks of the checkpoint's tensor names against the config

// The layer index of a "model.layers.<i>.<...>" name, or -1 for other names (an index past int64
// reads as int64's max).
int64_t layer_of(const std::string& name) {
    constexpr std::string_view kPrefix = "model.layers.";
    if (!std::string_view(name).starts_with(kPrefix)) return -1;
    const char* begin = name.data() + kPrefix.size();
    const char* end = name.data() + name.size();
    if (begin == end || !std::isdigit(static_cast<unsigned char>(*begin))) return -1;
    int64_t layer = 0;
    const auto [next, ec] = std::from_chars(begin, end, layer);
    if (ec == std::errc::result_out_of_range) layer = std::numeric_limits<int64_t>::max();
    const char* after = next;
    while (after != end && std::isdigit(static_cast<unsigned char>(*after))) ++after;
    return after != end && *after == '.' ? layer : -1;
}

// Every "model.layers.<i>." tensor must belong to a layer the model has: a decoder layer below
// num_hidden_layers, or the MTP layer at num_hidden_layers when the checkpoint has one (its
// eh_proj). Anything past that means config.json and the checkpoint disagree on the layer count.
void check_layer_range(const Checkpoint& ck, const io::ModelConfig& c, bool has_mtp) {
    const int64_t end = c.num_hidden_layers + (has_mtp ? c.num_nextn_predict_layers : 0);
    for (const auto& name : ck.names()) {
        const int64_t layer = layer_of(name);
        if (layer < end) continue;
        FANOUT_CHECK(layer >= c.num_hidden_layers + c.num_nextn_predict_layers,
                     "{}: tensor '{}' is of layer {}, where the MTP layer goes (num_hidden_layers={} in config.json), "
                     "but the checkpoint has no 'model.layers.{}.eh_proj.weight', so it is no MTP layer: does "
                     "config.json's num_hidden_layers count every decoder layer of the checkpoint?",
                     ck.file_of(name), name, layer, c.num_hidden_layers, layer);
        FANOUT_FAIL(
            "{}: tensor '{}' is of layer {}, past the model's layers: config.json has num_hidden_layers={} "
            "and num_nextn_predict_layers={} (the MTP layers follow the decoder layers), so the checkpoint "
            "and config.json disagree on the number of layers",
            ck.file_of(name), name, layer, c.num_hidden_layers, c.num_nextn_predict_layers);
    }
}

// A decoder layer that holds an MTP layer's eh_proj: config.json counts the MTP layer as a decoder layer.
void check_no_mtp_in_decoder_layers(const Checkpoint& ck, const io::ModelConfig& c) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        const std::string probe = fmt::format("model.layers.{}.eh_proj.weight", l);
        FANOUT_CHECK(!ck.has(probe),
                     "{}: tensor '{}' makes layer {} an MTP layer, but config.json's num_hidden_layers={} makes it a "
                     "decoder layer: the checkpoint has {} decoder layers",
                     ck.file_of(probe), probe, l, c.num_hidden_layers, l);
    }
}

// Tensors nothing reads: a warning (HF checkpoints may carry extras, e.g. rotary inv_freq buffers).
void warn_unused(const Checkpoint& ck, const std::vector<std::string>& unused) {
    if (unused.empty()) return;
    constexpr size_t kShown = 5;
    const size_t shown = std::min(unused.size(), kShown);
    std::string list =
        fmt::format("{}", fmt::join(unused.begin(), unused.begin() + static_cast<std::ptrdiff_t>(shown), ", "));
    if (unused.size() > shown) list += fmt::format(" and {} more", unused.size() - shown);
    fmt::print(stderr, "warning: checkpoint '{}': {} tensor{} the model does not use, ignored: {}\n", ck.dir(),
               unused.size(), unused.size() == 1 ? "" : "s", list);
}

}  // namespace

ModelWeights load_weights(io::Checkpoint checkpoint, const io::ModelConfig& c, const ParallelConfig& plan,
                          const LoadOptions& opts) {
    validate(plan, c.n_routed_experts);
    FANOUT_CHECK(c.num_attention_heads % plan.tp == 0, "--tp {}: the model's {} attention heads do not split evenly",
                 plan.tp, c.num_attention_heads);
    ModelWeights w;
    w.checkpoint = std::move(checkpoint);
    w.parallel = plan;
    const Checkpoint& ck = w.checkpoint;
    // HF writes num_nextn_predict_layers: 1 by default without MTP tensors; such a model has no MTP head.
    const std::string mtp_probe = fmt::format("model.layers.{}.eh_proj.weight", c.num_hidden_layers);
    const bool has_mtp = c.num_nextn_predict_layers > 0 && ck.has(mtp_probe);
    check_layer_range(ck, c, has_mtp);

    Binder b(ck);
    const int64_t total = c.num_hidden_layers + c.num_nextn_predict_layers + 1;
    w.embed = b.get("model.embed_tokens.weight", kFloatTypes, {c.vocab_size, c.hidden_size});
    w.final_norm = b.get_f32("model.norm.weight", c.hidden_size);
    if (ck.has("lm_head.weight") || !c.tie_word_embeddings) {
        w.lm_head = load_linear(b, "lm_head", c.vocab_size, c.hidden_size);
    } else {
        w.lm_head = {w.embed.dtype(), w.embed.data(), c.vocab_size, c.hidden_size, nullptr};
    }
    const auto progress = [&](const std::string& what, int64_t done) {
        if (opts.progress) opts.progress({fmt::format("binding {}", what), done, total});
    };
    progress("embeddings and head", 1);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        w.layers.push_back(load_layer(b, l, c, plan));
        shard_heads(w.layers.back().attn, c, plan, w.owned);
        progress(fmt::format("layer {}", l), l + 2);
    }
    check_no_mtp_in_decoder_layers(ck, c);
    if (has_mtp) {
        const int64_t l = c.num_hidden_layers;
        const std::string p = fmt::format("model.layers.{}.", l);
        MtpWeights m;
        m.enorm = b.get_f32(p + "enorm.weight", c.hidden_size);
        m.hnorm = b.get_f32(p + "hnorm.weight", c.hidden_size);
        m.eh_proj = load_linear(b, p + "eh_proj", c.hidden_size, 2 * c.hidden_size);
        m.layer = load_layer(b, l, c, plan);
        shard_heads(m.layer.attn, c, plan, w.owned);
        m.head_norm = b.get_f32(p + "shared_head.norm.weight", c.hidden_size);
        m.head = ck.has(p + "shared_head.head.weight")
                     ? load_linear(b, p + "shared_head.head", c.vocab_size, c.hidden_size)
                     : w.lm_head;
        m.embed = ck.has(p + "embed_tokens.weight")
                      ? b.get(p + "embed_tokens.weight", kFloatTypes, {c.vocab_size, c.hidden_size})
                      : w.embed;
        w.mtp = std::move(m);
        progress("mtp layer", total);
    }
    w.unused_tensors = b.unused();
    if (plan.rank == 0) warn_unused(ck, w.unused_tensors);  // every rank sees the same ones
    w.unchecked = b.take_checks();
    if (opts.check_values) {
        check_weight_values(ck, w.unchecked, opts.progress);
        w.unchecked.clear();
    }
    return w;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    if (a.data() == b.data()) return a.dtype() == b.dtype() && a.shape() == b.shape();
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

bool same_bytes(const ops::LinearWeight& a, const ops::LinearWeight& b) {
    if (a.dtype != b.dtype || a.out_features != b.out_features || a.in_features != b.in_features) return false;
    const size_t n = static_cast<size_t>(a.out_features * a.in_features) * dtype_size(a.dtype);
    if (a.data != b.data && std::memcmp(a.data, b.data, n) != 0) return false;
    if ((a.scale_inv == nullptr) != (b.scale_inv == nullptr)) return false;
    if (a.scale_inv == nullptr || a.scale_inv == b.scale_inv) return true;
    const size_t blocks = static_cast<size_t>(ops::ceil_div(a.out_features, ops::kFp8Block) *
                                              ops::ceil_div(a.in_features, ops::kFp8Block));
    return std::memcmp(a.scale_inv, b.scale_inv, blocks * sizeof(float)) == 0;
}

int64_t first_bad_weight_value(const WeightCheck& check, const void* data, int64_t first, int64_t count) {
    const int64_t i = first_bad_value(data, check.dtype, check.kind, 0, count);
    return i < 0 ? -1 : first + i;
}

// "<file>: tensor '<name>' has NaN at element 1234 (row 4, column 210) ...".
void fail_weight_value(const Checkpoint& ck, const WeightCheck& s, int64_t i) {
    const float v = load_as_f32(s.data, s.dtype, static_cast<size_t>(i));
    std::string value = std::isnan(v) ? "NaN" : std::isinf(v) ? (v > 0 ? "+Inf" : "-Inf") : fmt::format("{}", v);
    if (s.dtype == DType::kFP8E4M3) value += fmt::format(" (byte 0x{:02x})", static_cast<const uint8_t*>(s.data)[i]);
    std::string where = fmt::format("element {}", i);
    if (s.shape.size() == 2) where += fmt::format(" (row {}, column {})", i / s.shape[1], i % s.shape[1]);
    if (s.kind == WeightCheck::kScale)
        FANOUT_FAIL("{}: tensor '{}' has {} at {}: fp8 block scales must be finite and not negative",
                    ck.file_of(s.name), s.name, value, where);
    FANOUT_FAIL("{}: tensor '{}' has {} at {}: weights must be finite", ck.file_of(s.name), s.name, value, where);
}

void check_weight_values(const Checkpoint& ck, const std::vector<WeightCheck>& checks, const LoadProgress& progress) {
    constexpr int64_t kChunk = int64_t{1} << 20;  // elements
    struct Chunk {
        size_t check;
        int64_t begin, end;
    };
    std::vector<Chunk> chunks;
    double bytes_total = 0;
    for (size_t i = 0; i < checks.size(); ++i) {
        const int64_t n = shape_numel(checks[i].shape);
        for (int64_t b = 0; b < n; b += kChunk) chunks.push_back({i, b, std::min(n, b + kChunk)});
        bytes_total += static_cast<double>(checks[i].nbytes());
    }
    std::vector<int64_t> first(chunks.size(), -1);
    ThreadPool pool;
    // Groups of chunks in turn, so progress is reported from this thread between them.
    const int64_t group = 64 * std::max<int64_t>(1, pool.num_threads());
    double bytes_done = 0;
    for (int64_t g0 = 0; g0 < static_cast<int64_t>(chunks.size()); g0 += group) {
        const int64_t g1 = std::min<int64_t>(static_cast<int64_t>(chunks.size()), g0 + group);
        pool.parallel_for(g1 - g0, 1, [&](int64_t begin, int64_t end) {
            for (int64_t c = g0 + begin; c < g0 + end; ++c) {
                const WeightCheck& s = checks[chunks[c].check];
                first[c] = first_bad_value(s.data, s.dtype, s.kind, chunks[c].begin, chunks[c].end);
            }
        });
        for (int64_t c = g0; c < g1; ++c)
            bytes_done +=
                static_cast<double>(chunks[c].end - chunks[c].begin) * dtype_size(checks[chunks[c].check].dtype);
        if (progress)
            progress({"checking weights", static_cast<int64_t>(chunks[g1 - 1].check) + 1,
                      static_cast<int64_t>(checks.size()), bytes_done, bytes_total});
    }
    for (size_t c = 0; c < chunks.size(); ++c)
        if (first[c] >= 0) fail_weight_value(ck, checks[chunks[c].check], first[c]);
}

}  // namespace fanout::model
