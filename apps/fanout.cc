// fanout: the command-line entry point. One binary, subcommands:
//   make-model  write a synthetic checkpoint (HF/DeepSeek format)
//   generate    continue a prompt with one model instance on the CPU
//   score       write the logits of a token sequence (raw little-endian float32 [T, vocab])
#include <CLI/CLI.hpp>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "fanout/model/generate.h"
#include "fanout/model/synthetic.h"

namespace {

using namespace fanout;

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

struct ModelArgs {
    std::string model = "tiny";
    std::string fp8_mode = "dequant";
    std::string kv_dtype = "f32";
    int threads = 0;
};

void add_model_args(CLI::App* cmd, ModelArgs& a) {
    cmd->add_option("--model", a.model, "model folder (HF format) or 'tiny', the embedded default")
        ->capture_default_str();
    cmd->add_option("--fp8-mode", a.fp8_mode, "fp8 weights: 'dequant' (exact reference) or 'w8a8' (activations "
                                              "quantized per 1x128, as the GPU GEMMs)")
        ->check(CLI::IsMember({"dequant", "w8a8"}))
        ->capture_default_str();
    cmd->add_option("--kv-dtype", a.kv_dtype, "KV cache element type")
        ->check(CLI::IsMember({"f32", "bf16"}))
        ->capture_default_str();
    cmd->add_option("--threads", a.threads, "CPU threads (0 = all cores)");
}

std::unique_ptr<model::DeepseekV3> load_model(const ModelArgs& a) {
    std::string dir = a.model;
    if (dir == "tiny") dir = model::ensure_tiny_model([](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); });
    const auto t0 = std::chrono::steady_clock::now();
    // Progress on a terminal only: one line rewritten in place.
    model::LoadProgress progress;
    if (::isatty(STDERR_FILENO))
        progress = [](const std::string& what, int64_t done, int64_t total) {
            std::fprintf(stderr, "\rloading %s (%lld/%lld)\033[K", what.c_str(), (long long)done, (long long)total);
        };
    auto m = model::DeepseekV3::load(dir, {}, progress);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%sloaded %s: %lld layers%s, %s weights, in %.2f s\n", progress ? "\r\033[K" : "",
                 dir.c_str(), (long long)m->config().num_hidden_layers, m->weights().mtp ? " + MTP" : "",
                 m->config().fp8 ? "fp8" : "bf16", secs);
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

int run_make_model(const std::string& preset, int64_t layers, const std::string& dtype, uint64_t seed,
                   const std::string& out, double shard_gb) {
    io::ModelConfig c = model::preset_config(preset, layers);
    if (dtype == "fp8") c.fp8 = io::Fp8QuantConfig{};
    model::MakeModelOptions o;
    o.seed = seed;
    o.max_shard_bytes = static_cast<int64_t>(shard_gb * (1 << 30));
    FANOUT_CHECK(o.max_shard_bytes > 0, "--shard-gb must be positive, got {}", shard_gb);
    o.progress = [](const std::string& file, int64_t done, int64_t total) {
        std::fprintf(stderr, "\rwriting %s: %.2f / %.2f GB   ", file.c_str(), done / 1e9, total / 1e9);
    };
    model::write_synthetic_model(out, c, o);
    std::fprintf(stderr, "\nwrote %s model (%lld layers, %s) to %s\n", preset.c_str(), (long long)c.num_hidden_layers,
                 dtype.c_str(), out.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"fanout: DeepSeek-V3 serving with expert parallelism"};
    app.require_subcommand(1);

    auto* mk = app.add_subcommand("make-model", "write a synthetic checkpoint in the HF/DeepSeek format");
    std::string preset = "tiny", dtype = "bf16", out;
    int64_t layers = 0;
    uint64_t seed = 0;
    double shard_gb = 4.0;
    mk->add_option("--preset", preset, "'tiny' or 'full-layers' (real V3 widths)")
        ->check(CLI::IsMember({"tiny", "full-layers"}))
        ->capture_default_str();
    mk->add_option("--layers", layers, "decoder layers (full-layers: required)");
    mk->add_option("--dtype", dtype, "weight type")->check(CLI::IsMember({"bf16", "fp8"}))->capture_default_str();
    mk->add_option("--seed", seed, "seed of the pseudo-random weights")->capture_default_str();
    mk->add_option("--shard-gb", shard_gb, "largest safetensors shard, GB")->capture_default_str();
    mk->add_option("--out", out, "output folder")->required();

    ModelArgs gen_args;
    auto* gen = app.add_subcommand("generate", "continue a prompt");
    add_model_args(gen, gen_args);
    std::string prompt_ids, prompt_text;
    model::GenerateRequest req;
    auto* ids_opt = gen->add_option("--prompt-ids", prompt_ids, "prompt token ids, comma-separated");
    auto* text_opt = gen->add_option("--prompt", prompt_text, "prompt text (needs the tokenizer)");
    ids_opt->excludes(text_opt);
    gen->add_option("--max-tokens", req.max_tokens, "tokens to generate at most")->capture_default_str();
    gen->add_option("--temperature", req.sampling.temperature, "0 = greedy")->capture_default_str();
    gen->add_option("--top-p", req.sampling.top_p, "nucleus sampling mass")->capture_default_str();
    gen->add_option("--top-k", req.sampling.top_k, "0 = off")->capture_default_str();
    gen->add_option("--seed", req.sampling.seed, "sampling seed")->capture_default_str();
    gen->add_flag("--ignore-eos", req.ignore_eos, "keep going past EOS");

    ModelArgs score_args;
    auto* score = app.add_subcommand("score", "write the logits of a token sequence");
    add_model_args(score, score_args);
    std::string token_ids, output;
    score->add_option("--token-ids", token_ids, "token ids, comma-separated")->required();
    score->add_option("--output", output, "file for raw little-endian float32 logits [T, vocab]")->required();

    CLI11_PARSE(app, argc, argv);
    try {
        if (mk->parsed()) return run_make_model(preset, layers, dtype, seed, out, shard_gb);
        if (gen->parsed()) {
            FANOUT_CHECK(text_opt->count() == 0,
                         "--prompt takes text, which needs the DeepSeek-V3 tokenizer (not built yet); pass token ids "
                         "with --prompt-ids 1,2,3");
            FANOUT_CHECK(ids_opt->count() == 1, "give the prompt with --prompt-ids");
            req.prompt = parse_ids(prompt_ids, "--prompt-ids");
            ops::validate_sampling_params(req.sampling);
            auto m = load_model(gen_args);
            ThreadPool pool(gen_args.threads);
            kv::PagedKvCache cache = make_cache(*m, static_cast<int64_t>(req.prompt.size()) + req.max_tokens, gen_args);
            auto res = model::generate(*m, cache, req, forward_options(gen_args), Stream{&pool});
            std::string ids;
            for (size_t i = 0; i < res.tokens.size(); ++i) ids += (i ? "," : "") + std::to_string(res.tokens[i]);
            std::printf("%s\n", ids.c_str());
            std::fprintf(stderr,
                         "finish_reason=%s prompt_tokens=%lld generated=%zu prefill %.1f tok/s, decode %.1f tok/s "
                         "(%d threads)\n",
                         res.finish_reason.c_str(), (long long)res.prompt_tokens, res.tokens.size(),
                         res.prompt_tokens / std::max(res.prefill_seconds, 1e-9),
                         (res.tokens.size() - 1) / std::max(res.decode_seconds, 1e-9), pool.num_threads());
            return 0;
        }
        if (score->parsed()) {
            const std::vector<int32_t> ids = parse_ids(token_ids, "--token-ids");
            auto m = load_model(score_args);
            const int64_t T = static_cast<int64_t>(ids.size());
            FANOUT_CHECK(T <= m->config().max_position_embeddings, "{} tokens exceed max_position_embeddings {}", T,
                         m->config().max_position_embeddings);
            ThreadPool pool(score_args.threads);
            kv::PagedKvCache cache = make_cache(*m, T, score_args);
            kv::SequenceBlocks seq;
            cache.reserve(seq, T);
            auto batch = model::StepBatchBuilder(cache).add(ids, 0, seq, model::StepBatchBuilder::Logits::kAll).build();
            auto res = m->forward(batch, cache, forward_options(score_args), Stream{&pool});
            std::ofstream f(output, std::ios::binary);
            FANOUT_CHECK(f.good(), "cannot create {}", output);
            f.write(static_cast<const char*>(res.logits.data()), static_cast<std::streamsize>(res.logits.nbytes()));
            FANOUT_CHECK(f.good(), "writing {} failed", output);
            std::fprintf(stderr, "wrote logits [%lld, %lld] to %s\n", (long long)T, (long long)m->config().vocab_size,
                         output.c_str());
            return 0;
        }
    } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
