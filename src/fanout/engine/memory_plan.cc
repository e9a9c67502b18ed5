#include "fanout/engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fanout/core/error.h"
#include "fanout/io/checkpoint.h"
#include "fanout/kv/paged_kv_cache.h"
#include "fanout/model/weights.h"

namespace fanout::engine {
namespace {

std::string gb(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

}  // namespace

MemoryPlan plan_memory(const MemoryRequest& r) {
    FANOUT_CHECK(r.utilization > 0 && r.utilization <= 1, "the memory utilization must be in (0, 1], got {}",
                 r.utilization);
    FANOUT_CHECK(r.kv_block_bytes > 0, "a KV block of {} bytes", r.kv_block_bytes);
    MemoryPlan p;
    p.budget_bytes = r.total_bytes * r.utilization;
    p.fixed_bytes = r.in_use_bytes + r.weight_bytes + r.workspace_bytes + r.graph_bytes;
    const double left = p.budget_bytes - p.fixed_bytes;
    const double min_kv = static_cast<double>(r.min_kv_blocks) * r.kv_block_bytes;
    const std::string parts = fmt::format(
        "{}weights {}, step workspaces {}{}", r.in_use_bytes > 0 ? "in use already " + gb(r.in_use_bytes) + ", " : "",
        gb(r.weight_bytes), gb(r.workspace_bytes), r.graph_bytes > 0 ? ", CUDA graphs " + gb(r.graph_bytes) : "");
    if (left < min_kv) {
        // Name the part that does not fit: the workspaces scale with the flags, the weights do not.
        const std::string fix = r.workspace_bytes > r.weight_bytes
                                    ? "lower --max-num-seqs / --max-batched-tokens (the step workspaces grow with them)"
                                    : "use a machine with more memory or a smaller model";
        FANOUT_FAIL("this configuration does not fit: {} need {} before any KV cache, but {} has {} × {:.2f} = {}; {}",
                    parts, gb(p.fixed_bytes), r.where, gb(r.total_bytes), r.utilization, gb(p.budget_bytes), fix);
    }
    if (r.kv_bytes) {
        FANOUT_CHECK(*r.kv_bytes > 0 && std::isfinite(*r.kv_bytes), "--kv-memory-gb must be positive, got {}",
                     *r.kv_bytes / 1e9);
        if (*r.kv_bytes > left)
            FANOUT_FAIL(
                "--kv-memory-gb {:.2f} does not fit: {} has {} × {:.2f} = {}, of which {} take {}; at most "
                "--kv-memory-gb {:.2f} fits",
                *r.kv_bytes / 1e9, r.where, gb(r.total_bytes), r.utilization, gb(p.budget_bytes), parts,
                gb(p.fixed_bytes), std::floor(left / 1e7) / 100);
        p.kv_bytes = *r.kv_bytes;
    } else {
        p.kv_bytes = left;
    }
    p.kv_blocks = std::max<int64_t>(r.min_kv_blocks, static_cast<int64_t>(p.kv_bytes / r.kv_block_bytes));
    p.summary = fmt::format("memory plan for {}: {} of {} ({:.2f}); {}; KV cache {} = {} blocks", r.where,
                            gb(p.budget_bytes), gb(r.total_bytes), r.utilization, parts, gb(p.kv_bytes), p.kv_blocks);
    return p;
}

double cpu_step_workspace_bytes(const io::ModelConfig& c, int64_t max_num_seqs, int64_t max_batched_tokens) {
    const double D = static_cast<double>(c.hidden_size), H = static_cast<double>(c.num_attention_heads);
    const double qk = static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim);
    const double v = static_cast<double>(c.v_head_dim), nope = static_cast<double>(c.qk_nope_head_dim);
    const double experts_active = static_cast<double>(c.n_shared_experts + c.num_experts_per_tok);
    // f32 activations a token holds at once inside a layer (generous: every buffer of a stage).
    const double per_token = 8 * D + 2 * H * (qk + v) + static_cast<double>(c.kv_entry_dim()) +
                             static_cast<double>(c.q_lora_rank) + static_cast<double>(c.n_routed_experts) +
                             3 * std::max(experts_active * static_cast<double>(c.moe_intermediate_size),
                                          static_cast<double>(c.intermediate_size));
    const double logits = static_cast<double>(max_num_seqs) * static_cast<double>(c.vocab_size);
    const double expansion = static_cast<double>(c.max_position_embeddings) * H * (nope + v);
    return 4.0 * (static_cast<double>(max_batched_tokens) * per_token + logits + expansion);
}

double tp_attention_copy_bytes(const io::ModelConfig& c, int tp, int groups) {
    if (tp <= 1) return 0;
    const double H = static_cast<double>(c.num_attention_heads), D = static_cast<double>(c.hidden_size);
    const double q_in = static_cast<double>(c.q_lora_rank > 0 ? c.q_lora_rank : c.hidden_size);
    const double per_layer = H * static_cast<double>(c.qk_head_dim()) * q_in +
                             H * static_cast<double>(c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank +
                             D * H * static_cast<double>(c.v_head_dim);
    const double layers = static_cast<double>(c.num_hidden_layers + c.num_nextn_predict_layers);
    return 4.0 * per_layer * layers * groups;
}

double kv_block_bytes(const io::ModelConfig& c, bool with_mtp, int64_t block_size, DType dtype) {
    const double layers = static_cast<double>(c.num_hidden_layers + (with_mtp && c.num_nextn_predict_layers > 0));
    kv::KvCacheConfig k;
    k.entry_dim = c.kv_entry_dim();
    k.kv_lora = c.kv_lora_rank;
    k.dtype = dtype;
    return layers * static_cast<double>(block_size) * static_cast<double>(k.entry_bytes());
}

double checkpoint_file_bytes(const std::string& dir) {
    std::error_code ec;
    double bytes = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir, ec))
        if (f.path().extension() == ".safetensors") bytes += static_cast<double>(f.file_size(ec));
    return bytes;
}

double checkpoint_weight_bytes(const std::string& dir, const io::ModelConfig& c, const ParallelConfig& parallel,
                               bool with_mtp) {
    const io::Checkpoint ck = io::Checkpoint::open(dir);
    const ParallelConfig::Range mine = parallel.experts(c.n_routed_experts);
    const int64_t layers = c.num_hidden_layers + (with_mtp ? 1 : 0);
    // The MTP layer's embed_tokens / shared_head.head take no room of their own when they are
    // copies of the model's (DeepSeek-V3's are: the GPU keeps one, model/weight_plan.h).
    const auto copies = [&](const std::string& name, const char* model_name) {
        return ck.has(model_name) && model::same_bytes(ck.get(name), ck.get(model_name));
    };
    const std::string mtp = fmt::format("model.layers.{}.", c.num_hidden_layers);
    double bytes = 0;
    for (const auto& name : ck.names()) {
        if (name.rfind("model.layers.", 0) == 0 && std::atoll(name.c_str() + 13) >= layers)
            continue;  // the MTP layers, unless drafting with the first
        if (with_mtp && ((name == mtp + "embed_tokens.weight" && copies(name, "model.embed_tokens.weight")) ||
                         (name == mtp + "shared_head.head.weight" && copies(name, "lm_head.weight"))))
            continue;
        if (const size_t at = name.find(".mlp.experts."); at != std::string::npos) {
            const int64_t e = std::atoll(name.c_str() + at + 13);
            if (e < mine.begin || e >= mine.end) continue;  // another rank's expert
        }
        // kv_b is held again split per head for the absorbed form (k_b transposed, v_b), in bf16.
        const io::TensorEntry& entry = ck.entry(name);
        bytes += static_cast<double>(entry.nbytes);
        if (name.ends_with("kv_b_proj.weight"))
            bytes += 2.0 * static_cast<double>(entry.nbytes) / static_cast<double>(dtype_size(entry.dtype));
    }
    return bytes;
}

double host_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    double kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit)
        if (key == "MemTotal:") return kb * 1024;
    return 0;
}

HostRss host_rss() {
    std::ifstream in("/proc/self/status");
    HostRss r;
    std::string line;
    while (std::getline(in, line)) {
        const auto kb = [&] { return std::atof(line.c_str() + line.find(':') + 1) * 1024; };
        if (line.starts_with("VmHWM:")) r.peak_bytes = kb();
        if (line.starts_with("RssAnon:")) r.anon_bytes = kb();
        if (line.starts_with("RssFile:")) r.file_bytes = kb();
    }
    return r;
}

}  // namespace fanout::engine
