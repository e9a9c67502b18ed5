#include "fanout/io/model_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "fanout/core/error.h"
#include "fanout/io/json_util.h"

namespace fanout::io {
namespace {

using nlohmann::json;

// No DeepSeek-V3 size comes near 2^31. Each size is bounded by it, and the weights' element
// counts (products of two or three sizes) by kMaxElements, checked without overflow, so that no
// size arithmetic downstream leaves int64.
constexpr int64_t kMaxExtent = int64_t{1} << 31;
constexpr int64_t kMaxElements = int64_t{1} << 44;

// Fails, naming the fields, when the product of `sizes` passes kMaxElements.
void check_elements(const std::string& where, const char* what,
                    std::initializer_list<std::pair<const char*, int64_t>> sizes) {
    int64_t n = 1;
    bool over = false;
    std::string names;
    for (const auto& [name, v] : sizes) {
        over = over || __builtin_mul_overflow(n, v, &n) || n > kMaxElements;
        names += fmt::format("{}{}={}", names.empty() ? "" : " × ", name, v);
    }
    FANOUT_CHECK(!over, "{}: {} ({}) has more than 2^44 elements; no DeepSeek-V3 size comes near", where, what, names);
}

// Reads one field with its type checked; `where` names the file in errors.
class FieldReader {
  public:
    FieldReader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

    int64_t integer(const char* key) const {
        const json& v = require(key);
        FANOUT_CHECK(v.is_number_integer(), "{}: field '{}' must be an integer, found {}", where_, key,
                     describe_json(v));
        FANOUT_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
                     "{}: field '{}' is {}, past the 64-bit integer range", where_, key, describe_json(v));
        return v.get<int64_t>();
    }
    int64_t integer(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }
    // A size: in [1, kMaxExtent].
    int64_t positive(const char* key) const { return integer_in(key, 1, kMaxExtent); }
    int64_t integer_in(const char* key, int64_t lo, int64_t hi) const { return in_range(key, integer(key), lo, hi); }
    double number_in(const char* key, double lo, double hi) const { return in_range(key, number(key), lo, hi); }
    double number_in(const char* key, double lo, double hi, double fallback) const {
        return has(key) ? number_in(key, lo, hi) : fallback;
    }
    double number(const char* key) const {
        const json& v = require(key);
        FANOUT_CHECK(v.is_number(), "{}: field '{}' must be a number, found {}", where_, key, describe_json(v));
        const double d = v.get<double>();
        FANOUT_CHECK(std::isfinite(d), "{}: field '{}' must be finite", where_, key);
        return d;
    }
    double number(const char* key, double fallback) const { return has(key) ? number(key) : fallback; }
    bool boolean(const char* key, bool fallback) const { return optional_bool(j_, key, fallback, where_); }
    std::string string(const char* key, const std::string& fallback) const {
        if (!has(key)) return fallback;
        const json& v = j_.at(key);
        FANOUT_CHECK(v.is_string(), "{}: field '{}' must be a string, found {}", where_, key, describe_json(v));
        return v.get<std::string>();
    }
    // Present and not null.
    bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
    // Present as null (HF's None), which for some keys differs from absent (HF's default).
    bool is_null(const char* key) const { return j_.contains(key) && j_.at(key).is_null(); }
    // An optional key whose absence means HF's default `hf_default`, and to which null gives no
    // meaning (so it is refused): an integer or a number in [lo, hi].
    int64_t hf_integer(const char* key, int64_t lo, int64_t hi, int64_t hf_default) const {
        return hf_absent(key, hf_default) ? hf_default : integer_in(key, lo, hi);
    }
    double hf_number(const char* key, double lo, double hi, double hf_default) const {
        return hf_absent(key, hf_default) ? hf_default : number_in(key, lo, hi);
    }
    const std::string& where() const { return where_; }

  private:
    template <typename T>
    T in_range(const char* key, T v, T lo, T hi) const {
        if (v < lo) {
            if (lo == T(1) && std::is_integral_v<T>)
                FANOUT_FAIL("{}: field '{}' must be positive, found {}", where_, key, v);
            FANOUT_FAIL("{}: field '{}' must be >= {}, found {}", where_, key, lo, v);
        }
        FANOUT_CHECK(v <= hi, "{}: field '{}' is {}, past the supported maximum {}", where_, key, v, hi);
        return v;
    }

    bool hf_absent(const char* key, double hf_default) const {
        FANOUT_CHECK(!is_null(key), "{}: field '{}' is null; leave it out for HF's default {}", where_, key,
                     hf_default);
        return !j_.contains(key);
    }
    const json& require(const char* key) const {
        FANOUT_CHECK(j_.contains(key) && !j_.at(key).is_null(), "{}: required field '{}' is missing", where_, key);
        return j_.at(key);
    }
    const json& j_;
    std::string where_;
};

void expect_value(const FieldReader& r, const char* key, const std::string& fallback,
                  std::initializer_list<const char*> allowed) {
    const std::string v = r.string(key, fallback);
    for (const char* a : allowed)
        if (v == a) return;
    FANOUT_FAIL("{}: field '{}' is '{}'; fanout implements only {}", r.where(), key, v,
                fmt::join(std::vector<std::string>(allowed.begin(), allowed.end()), ", "));
}

void parse_rope(const json& j, const std::string& where, ModelConfig& c) {
    // transformers 5 spells it rope_parameters (rope_theta may sit inside); 4 spells it rope_scaling.
    // Both, and different: transformers 5 takes rope_scaling, 4 ignores rope_parameters' scaling,
    // and the checkpoint's author may have meant either — refused, naming both.
    const bool both = j.contains("rope_parameters") && !j["rope_parameters"].is_null() && j.contains("rope_scaling") &&
                      !j["rope_scaling"].is_null();
    FANOUT_CHECK(!both || j["rope_parameters"] == j["rope_scaling"],
                 "{}: 'rope_parameters' ({}) and 'rope_scaling' ({}) disagree; keep the one meant", where,
                 describe_json(j["rope_parameters"]), describe_json(j["rope_scaling"]));
    const char* key = nullptr;
    if (j.contains("rope_parameters") && !j["rope_parameters"].is_null())
        key = "rope_parameters";
    else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
        key = "rope_scaling";
    if (!key) return;
    const json& rp = j[key];
    FANOUT_CHECK(rp.is_object(), "{}: field '{}' must be an object, found {}", where, key, describe_json(rp));
    const std::string sub = where + ": " + key;
    FieldReader r(rp, sub);
    if (r.has("rope_theta")) c.rope_theta = r.number_in("rope_theta", 1.0, 1e12, 0.0);
    std::string type = r.string("rope_type", r.string("type", "default"));
    if (type == "default") return;
    FANOUT_CHECK(type == "yarn", "{}: rope type '{}' is not supported; fanout implements 'default' and 'yarn'", sub,
                 type);
    // YaRN's correction range divides by log(rope_theta): a base of 1 makes every frequency NaN.
    FANOUT_CHECK(c.rope_theta > 1.0, "{}: rope_theta must be > 1 with YaRN, found {}", sub, c.rope_theta);
    YarnConfig y;
    y.factor = r.number_in("factor", 1.0, 1e6);
    y.original_max_position_embeddings = r.has("original_max_position_embeddings")
                                             ? r.positive("original_max_position_embeddings")
                                             : c.max_position_embeddings;
    y.beta_fast = r.number_in("beta_fast", 1e-6, 1e6, 32.0);
    y.beta_slow = r.number_in("beta_slow", 1e-6, 1e6, 1.0);
    y.mscale = r.number_in("mscale", 0.0, 100.0, 0.0);
    y.attention_factor = r.number_in("attention_factor", 0.0, 100.0, 0.0);
    y.mscale_all_dim = r.number_in("mscale_all_dim", 0.0, 100.0, 0.0);
    y.truncate = r.boolean("truncate", true);
    c.yarn = y;
}

void parse_quantization(const json& j, const std::string& where, ModelConfig& c) {
    if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return;
    const json& q = j["quantization_config"];
    const std::string sub = where + ": quantization_config";
    FANOUT_CHECK(q.is_object(), "{} must be an object", sub);
    FieldReader r(q, sub);
    expect_value(r, "quant_method", "", {"fp8"});
    expect_value(r, "fmt", "e4m3", {"e4m3"});
    expect_value(r, "activation_scheme", "dynamic", {"dynamic"});
    Fp8QuantConfig f;
    if (q.contains("weight_block_size")) {
        const json& b = q["weight_block_size"];
        FANOUT_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer(),
                     "{}: weight_block_size must be [rows, cols], found {}", sub, describe_json(b));
        f.block_n = b[0].get<int64_t>();
        f.block_k = b[1].get<int64_t>();
    }
    FANOUT_CHECK(f.block_n == 128 && f.block_k == 128,
                 "{}: weight_block_size [{}, {}] is not supported; fanout implements [128, 128]", sub, f.block_n,
                 f.block_k);
    c.fp8 = f;
}

// A token id from `key` (an array entry when `entry` >= 0): an integer in [0, vocab_size).
int64_t token_id(const json& v, const char* key, int64_t entry, const std::string& where, int64_t vocab_size) {
    const std::string field = entry >= 0 ? fmt::format("{}[{}]", key, entry) : std::string(key);
    FANOUT_CHECK(v.is_number_integer(), "{}: field '{}' must be an integer, found {}", where, field, describe_json(v));
    const bool in_vocab = v.is_number_unsigned() ? v.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                                                 : v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab_size;
    FANOUT_CHECK(in_vocab, "{}: field '{}' is {}, outside the vocabulary [0, vocab_size={})", where, field,
                 describe_json(v), vocab_size);
    return v.get<int64_t>();
}

// bos_token_id (null or absent: none) and eos_token_id (an id, or a non-empty array of ids; null
// or absent: none), each inside the vocabulary.
void parse_special_tokens(const json& j, const std::string& where, ModelConfig& c) {
    if (j.contains("bos_token_id") && !j["bos_token_id"].is_null())
        c.bos_token_id = token_id(j["bos_token_id"], "bos_token_id", -1, where, c.vocab_size);
    if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return;
    const json& e = j["eos_token_id"];
    if (!e.is_array()) {
        c.eos_token_ids.push_back(token_id(e, "eos_token_id", -1, where, c.vocab_size));
        return;
    }
    FANOUT_CHECK(!e.empty(), "{}: field 'eos_token_id' is [], an empty list; give at least one token id, or null",
                 where);
    for (size_t i = 0; i < e.size(); ++i)
        c.eos_token_ids.push_back(token_id(e[i], "eos_token_id", static_cast<int64_t>(i), where, c.vocab_size));
}

}  // namespace

double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

double ModelConfig::softmax_scale() const {
    double s = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
    if (yarn && yarn->mscale_all_dim != 0.0) {
        const double m = yarn_get_mscale(yarn->factor, yarn->mscale_all_dim);
        s *= m * m;
    }
    return s;
}

double ModelConfig::rope_attention_factor() const {
    if (!yarn) return 1.0;
    if (yarn->attention_factor > 0.0) return yarn->attention_factor;
    if (yarn->mscale != 0.0 && yarn->mscale_all_dim != 0.0)
        return yarn_get_mscale(yarn->factor, yarn->mscale) / yarn_get_mscale(yarn->factor, yarn->mscale_all_dim);
    return yarn_get_mscale(yarn->factor, 1.0);
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& label) {
    const json j = parse_json_bounded(json_text, label);  // walked recursively below (==, dumps)
    FANOUT_CHECK(j.is_object(), "{}: must be a JSON object", label);
    FieldReader r(j, label);
    expect_value(r, "model_type", "", {"deepseek_v3"});
    expect_value(r, "hidden_act", "silu", {"silu"});
    expect_value(r, "scoring_func", "sigmoid", {"sigmoid"});
    expect_value(r, "topk_method", "noaux_tc", {"noaux_tc"});

    ModelConfig c;
    c.vocab_size = r.positive("vocab_size");
    c.hidden_size = r.positive("hidden_size");
    c.num_hidden_layers = r.positive("num_hidden_layers");
    c.num_attention_heads = r.positive("num_attention_heads");
    c.intermediate_size = r.positive("intermediate_size");
    c.kv_lora_rank = r.positive("kv_lora_rank");
    c.qk_nope_head_dim = r.positive("qk_nope_head_dim");
    c.qk_rope_head_dim = r.positive("qk_rope_head_dim");
    c.v_head_dim = r.positive("v_head_dim");
    // A key left out takes HF DeepseekV3Config's default (V3's value), as transformers would load it;
    // null is None as the model code reads it: no query LoRA (transformers), no routed experts and
    // no shared expert (DeepSeek's own modeling code; transformers' fails on those).
    c.q_lora_rank = r.is_null("q_lora_rank") ? 0 : r.has("q_lora_rank") ? r.positive("q_lora_rank") : 1536;
    c.max_position_embeddings = r.positive("max_position_embeddings");
    c.rms_norm_eps = r.number_in("rms_norm_eps", 0.0, 1.0, 1e-6);
    c.rope_theta = r.number_in("rope_theta", 1.0, 1e12, 10000.0);
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
    c.num_nextn_predict_layers = r.has("num_nextn_predict_layers") ? r.integer("num_nextn_predict_layers") : 0;
    c.first_k_dense_replace = r.hf_integer("first_k_dense_replace", 0, kMaxExtent, 3);
    c.n_routed_experts = r.is_null("n_routed_experts") ? 0
                         : r.has("n_routed_experts")   ? r.integer_in("n_routed_experts", 0, 1 << 20)
                                                       : 256;
    FANOUT_CHECK(!r.boolean("attention_bias", false),
                 "{}: attention_bias true is not supported; DeepSeek-V3's attention projections have no bias", label);
    FANOUT_CHECK(c.num_nextn_predict_layers >= 0 && c.num_nextn_predict_layers <= 1,
                 "{}: num_nextn_predict_layers is {}; fanout implements 0 or 1", label, c.num_nextn_predict_layers);
    FANOUT_CHECK(c.first_k_dense_replace >= 0, "{}: first_k_dense_replace must be >= 0, found {}", label,
                 c.first_k_dense_replace);
    FANOUT_CHECK(c.qk_rope_head_dim % 2 == 0, "{}: qk_rope_head_dim must be even, found {}", label, c.qk_rope_head_dim);
    FANOUT_CHECK(r.boolean("rope_interleave", true),
                 "{}: rope_interleave false is not supported; DeepSeek-V3 rotates interleaved pairs", label);
    FANOUT_CHECK(r.integer("moe_layer_freq", 1) == 1, "{}: moe_layer_freq is {}; fanout implements 1", label,
                 r.integer("moe_layer_freq", 1));
    if (c.n_routed_experts > 0) {
        c.moe_intermediate_size = r.hf_integer("moe_intermediate_size", 1, kMaxExtent, 2048);
        c.n_shared_experts = r.is_null("n_shared_experts") ? 0  // DeepSeek's model code: no shared experts
                             : r.has("n_shared_experts")   ? r.integer_in("n_shared_experts", 0, 1 << 10)
                                                           : 1;
        c.num_experts_per_tok = r.hf_integer("num_experts_per_tok", 1, kMaxExtent, 8);
        // n_group and topk_group are range-checked against the expert count below.
        constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
        c.n_group = r.hf_integer("n_group", -kAny, kAny, 8);
        c.topk_group = r.hf_integer("topk_group", -kAny, kAny, 4);
        c.norm_topk_prob = r.boolean("norm_topk_prob", true);
        c.routed_scaling_factor = r.hf_number("routed_scaling_factor", 0.0, 1e6, 2.5);
        FANOUT_CHECK(c.n_shared_experts >= 0, "{}: n_shared_experts must be >= 0, found {}", label, c.n_shared_experts);
        FANOUT_CHECK(c.n_group > 0 && c.n_group <= c.n_routed_experts && c.n_routed_experts % c.n_group == 0,
                     "{}: n_routed_experts={} must be a multiple of n_group={}{}", label, c.n_routed_experts, c.n_group,
                     r.has("n_group") ? "" : " (HF's default: the field is absent)");
        FANOUT_CHECK(c.topk_group > 0 && c.topk_group <= c.n_group, "{}: topk_group={}{} must be in [1, n_group={}]",
                     label, c.topk_group, r.has("topk_group") ? "" : " (HF's default: the field is absent)", c.n_group);
        const int64_t per_group = c.n_routed_experts / c.n_group;
        FANOUT_CHECK(per_group >= 2 || c.n_group == 1,
                     "{}: each of the n_group={} groups needs at least 2 experts (group score = top-2 sum)", label,
                     c.n_group);
        FANOUT_CHECK(c.num_experts_per_tok <= c.topk_group * per_group,
                     "{}: num_experts_per_tok={} exceeds the {} experts in topk_group={} groups", label,
                     c.num_experts_per_tok, c.topk_group * per_group, c.topk_group);
    }
    check_elements(label, "the embedding", {{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}});
    check_elements(label, "a dense MLP", {{"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size}});
    check_elements(label, "the query projection",
                   {{"num_attention_heads", c.num_attention_heads},
                    {"qk_head_dim", c.qk_head_dim()},
                    {"q_lora_rank or hidden_size", c.q_lora_rank > 0 ? c.q_lora_rank : c.hidden_size}});
    check_elements(label, "q_a_proj", {{"q_lora_rank", c.q_lora_rank}, {"hidden_size", c.hidden_size}});
    check_elements(label, "kv_a_proj_with_mqa",
                   {{"kv_lora_rank + qk_rope_head_dim", c.kv_entry_dim()}, {"hidden_size", c.hidden_size}});
    check_elements(label, "eh_proj", {{"hidden_size", c.hidden_size}, {"2 × hidden_size", 2 * c.hidden_size}});
    check_elements(label, "kv_b_proj",
                   {{"num_attention_heads", c.num_attention_heads},
                    {"qk_nope_head_dim + v_head_dim", c.qk_nope_head_dim + c.v_head_dim},
                    {"kv_lora_rank", c.kv_lora_rank}});
    check_elements(
        label, "o_proj",
        {{"num_attention_heads", c.num_attention_heads}, {"v_head_dim", c.v_head_dim}, {"hidden_size", c.hidden_size}});
    check_elements(label, "a layer's routed experts",
                   {{"n_routed_experts + n_shared_experts", c.n_routed_experts + c.n_shared_experts},
                    {"3 × moe_intermediate_size", 3 * c.moe_intermediate_size},
                    {"hidden_size", c.hidden_size}});
    parse_rope(j, label, c);
    parse_quantization(j, label, c);
    parse_special_tokens(j, label, c);
    return c;
}

ModelConfig load_model_config(const std::string& model_dir) {
    FANOUT_CHECK(std::filesystem::is_directory(model_dir), "model folder '{}' does not exist or is not a folder",
                 model_dir);
    const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
    FANOUT_CHECK(std::filesystem::exists(path), "cannot read {}: no config.json in the model folder", path);
    return parse_model_config(read_text_file(path), path);  // a FIFO, device or folder is refused unopened
}

std::string model_config_to_json(const ModelConfig& c) {
    nlohmann::ordered_json j;
    j["architectures"] = {"DeepseekV3ForCausalLM"};
    j["model_type"] = "deepseek_v3";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.intermediate_size;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_key_value_heads"] = c.num_attention_heads;
    j["n_shared_experts"] = c.n_shared_experts;
    j["n_routed_experts"] = c.n_routed_experts;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["topk_method"] = "noaux_tc";
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_layer_freq"] = 1;
    j["first_k_dense_replace"] = c.first_k_dense_replace;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["scoring_func"] = "sigmoid";
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_interleave"] = true;
    if (c.yarn) {
        nlohmann::ordered_json y = {{"type", "yarn"},
                                    {"factor", c.yarn->factor},
                                    {"original_max_position_embeddings", c.yarn->original_max_position_embeddings},
                                    {"beta_fast", c.yarn->beta_fast},
                                    {"beta_slow", c.yarn->beta_slow}};
        // 0 means absent for these (HF treats a missing key differently from a given one).
        if (c.yarn->mscale != 0.0) y["mscale"] = c.yarn->mscale;
        if (c.yarn->mscale_all_dim != 0.0) y["mscale_all_dim"] = c.yarn->mscale_all_dim;
        if (c.yarn->attention_factor > 0.0) y["attention_factor"] = c.yarn->attention_factor;
        if (!c.yarn->truncate) y["truncate"] = false;
        j["rope_scaling"] = y;
    } else {
        j["rope_scaling"] = nullptr;
    }
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
    j["eos_token_id"] = c.eos_token_ids.empty()       ? json(nullptr)
                        : c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0])
                                                      : json(c.eos_token_ids);
    j["torch_dtype"] = "bfloat16";
    if (c.fp8) {
        j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                    {"fmt", "e4m3"},
                                    {"quant_method", "fp8"},
                                    {"weight_block_size", {c.fp8->block_n, c.fp8->block_k}}};
    }
    return j.dump(2) + "\n";
}

}  // namespace fanout::io
