// Pieces shared by the fanout subcommands: id-list parsing, model and tokenizer resolution.
#pragma once

#include <CLI/CLI.hpp>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "fanout/core/parallel.h"
#include "fanout/engine/engine.h"
#include "fanout/io/tokenizer.h"
#include "fanout/kv/paged_kv_cache.h"
#include "fanout/model/deepseek_v3.h"
#ifdef FANOUT_WITH_CUDA
#include "fanout/model/weight_upload.h"
#endif

namespace fanout::cli {

// "3,17,5" -> ids; errors name the flag and the bad entry.
std::vector<int32_t> parse_ids(const std::string& text, const char* flag);

struct ModelArgs {
    std::string model = "tiny";
    std::string fp8_mode = "dequant";
    std::string kv_dtype = "auto";  // kv_dtype(): the KV cache's entries
    std::string device = "cpu";     // "cuda": the GPU runner (generate, score)
    int threads = 0;
};

// A finite number in [lo, hi]: CLI::Range and CLI::PositiveNumber let NaN through (every
// comparison with it is false).
CLI::Validator finite_in(double lo, double hi);
void add_model_flag(CLI::App* cmd, std::string& model);
void add_model_args(CLI::App* cmd, ModelArgs& a);
// 'tiny' -> the embedded model's folder (made on first use); anything else as given.
std::string resolve_model_dir(const std::string& model);
// Loads (binds and, on the CPU path, checks) the model; --device cuda leaves the value checks to
// the GPU runner's streaming upload. `progress` defaults to load_progress_printer().
// `parallel`: the rank's share (its routed experts) of an expert-parallel deployment.
std::unique_ptr<model::DeepseekV3> load_model(const ModelArgs& a, const model::LoadProgress& progress = {},
                                              const ParallelConfig& parallel = {});
// A progress callback that prints the load on stderr: stage, tensors, GB, GB/s and ETA — one line
// rewritten in place on a terminal, plain lines every 2 s otherwise.
model::LoadProgress load_progress_printer();
// "host memory <when>: peak RSS …; now … anonymous, … file-backed" on stderr.
void print_host_memory(const char* when);
#ifdef FANOUT_WITH_CUDA
// The weight upload's line on stderr: GB, tensors, seconds, GB/s and where the readers' time went.
void print_upload_summary(const model::StreamStats& s);
#endif
model::ForwardOptions forward_options(const ModelArgs& a);
// --kv-dtype: "auto" is f32 on the CPU path and bf16 on the GPU; "fp8" stores each entry's latent in
// e4m3 with a scale per 128 values (57% of bf16's bytes at V3's widths: 1.76× the tokens in the
// same memory). f32 on the GPU is refused, naming the choices.
DType kv_dtype(const ModelArgs& a);
// --ep N, --tp T and --ranks threads|processes: the expert-parallel ranks of a command
// (deployment.h) and the tensor-parallel split of each DP group's attention. `ep` 0 means 1, or the
// world of the MPI launcher.
void add_rank_options(CLI::App* cmd, int& ep, std::string& ranks, int& tp);
// Checks --tp against --ep (before anything loads): tp divides ep, and tp > 1 runs on the CPU path
// (ranks as threads of one process, or as processes under MPI).
void check_tp(int tp, int ep, const std::string& device);
// --microbatch on|off|auto and --microbatch-min-tokens N: the two-microbatch schedule
// (engine::EngineConfig::microbatch).
struct MicrobatchArgs {
    std::string mode = "auto";
    int64_t min_tokens = std::numeric_limits<int64_t>::max();
    void apply(engine::EngineConfig& c) const {
        c.microbatch = engine::parse_microbatch(mode);
        c.microbatch_min_tokens = min_tokens;
    }
    // Whether a step of `tokens` tokens runs as two microbatches (one engine, no group).
    bool on_for(int64_t tokens) const {
        const auto m = engine::parse_microbatch(mode);
        return m == engine::EngineConfig::Microbatch::kOn ||
               (m == engine::EngineConfig::Microbatch::kAuto && tokens >= min_tokens);
    }
};
void add_microbatch_options(CLI::App* cmd, MicrobatchArgs& a);
kv::PagedKvCache make_cache(const model::DeepseekV3& m, int64_t tokens, const ModelArgs& a);
// The model folder's tokenizer; the error says how to get one for synthetic models.
io::Tokenizer load_tokenizer(const std::string& model_dir);

// Registration of each subcommand (apps/cmd_*.cc).
void add_model_commands(CLI::App& app);  // make-model, generate, score
void add_tokenize_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_engine_command(CLI::App& app);  // the engine's gRPC service (cmd_serve.cc)
void add_router_command(CLI::App& app);
void add_plan_command(CLI::App& app);  // plan sweep|recommend|layer|profile

}  // namespace fanout::cli
