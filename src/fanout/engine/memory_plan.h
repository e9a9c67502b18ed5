// Memory planning before anything is loaded (issue 15's first piece; the CPU path today).
//
// Weights, step workspaces and CUDA-graph pools are accounted first; the KV cache then takes
// `--kv-memory-gb` (the CPU path) or, later on the GPU, what is left of a fraction of the device.
// A configuration that cannot fit is refused before a byte is loaded, with an Error that states
// what was asked, what fits, and which flag to change — so the CLI exits 2 at once instead of
// failing minutes into a load. Plain data: no device calls (the caller measures the memory).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fanout/core/dtype.h"
#include "fanout/core/parallel.h"
#include "fanout/io/model_config.h"

namespace fanout::engine {

struct MemoryRequest {
    std::string where;               // "this host (MemTotal)" / "GPU 0"
    double total_bytes = 0;          // the memory of the device (or host)
    double utilization = 0.9;        // the fraction fanout may use
    double in_use_bytes = 0;         // already taken by others (other processes, the CUDA context)
    double weight_bytes = 0;         // checkpoint bytes resident while serving
    double workspace_bytes = 0;      // step buffers at the configured limits (step_workspace_bytes)
    double graph_bytes = 0;          // CUDA-graph pools (0 on the CPU path)
    double kv_block_bytes = 0;       // one KV block, all layers
    std::optional<double> kv_bytes;  // --kv-memory-gb; unset: what is left
    int64_t min_kv_blocks = 4;
};

struct MemoryPlan {
    int64_t kv_blocks = 0;
    double kv_bytes = 0, budget_bytes = 0, fixed_bytes = 0;
    std::string summary;  // one line: the budget and where it goes
};

// The plan, or an Error naming the flag to change.
MemoryPlan plan_memory(const MemoryRequest& r);

// The CPU path's step workspace at the scheduler's limits, from the config alone: activations of
// max_batched_tokens tokens, one f32 logits row per sequence (max_num_seqs), and the MHA form's
// expansion of the longest context through kv_b (one layer at a time).
double cpu_step_workspace_bytes(const io::ModelConfig& c, int64_t max_num_seqs, int64_t max_batched_tokens);

// Host bytes of tensor-parallel attention's per-head copies (model/weights.h: q_b or q_proj, kv_b
// and o_proj of every layer and the MTP layer, f32) held by `groups` TP groups: each group's ranks
// together hold one whole copy. 0 when tp is 1.
double tp_attention_copy_bytes(const io::ModelConfig& c, int tp, int groups);

// KV bytes per block — every decoder layer, and with_mtp the MTP layer the models hold (the first,
// if the checkpoint has one) — with entries of `dtype` (f32, bf16, or kFP8E4M3:
// ops::latent_entry_bytes; throws for one the cache cannot store). The CPU and GPU paths both.
double kv_block_bytes(const io::ModelConfig& c, bool with_mtp, int64_t block_size, DType dtype);

// The host's memory (MemTotal in /proc/meminfo), in bytes; 0 when unknown.
double host_memory_bytes();

// This process's resident memory from /proc/self/status: the peak (VmHWM, which counts mapped
// checkpoint pages too), and now anonymous (heap, pinned staging) and file-backed (mapped pages).
struct HostRss {
    double peak_bytes = 0, anon_bytes = 0, file_bytes = 0;
};
HostRss host_rss();

// Bytes of the `*.safetensors` files in `dir` (0 for a folder that is not there: the loader names it).
double checkpoint_file_bytes(const std::string& dir);

// Bytes of the checkpoint's tensors in `dir` that the GPU runner of one rank of `parallel` holds:
// all but the MTP layers' (with_mtp: but the first MTP layer's, the one MTP drafting runs), its
// block of each layer's routed experts, kv_b twice more (split per head into k_b and v_b) — read
// from the safetensors headers; nothing is loaded.
double checkpoint_weight_bytes(const std::string& dir, const io::ModelConfig& c, const ParallelConfig& parallel = {},
                               bool with_mtp = false);

}  // namespace fanout::engine
