// make-model, generate, score.
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "cli_common.h"
#include "fanout/core/parallel.h"
#include "fanout/io/chat_template.h"
#include "fanout/model/ep_group.h"
#include "fanout/model/generate.h"
#include "fanout/model/synthetic.h"
#ifdef FANOUT_WITH_CUDA
#include "fanout/model/deepseek_v3_cuda.h"
#endif

namespace fanout::cli {
namespace {

#ifdef FANOUT_WITH_CUDA
// The GPU runner for one request of up to `context` tokens, taking `step_tokens` per step.
std::unique_ptr<model::CudaModel> make_cuda_model(const model::DeepseekV3& m, int64_t context, int64_t step_tokens) {
    model::CudaModelOptions o;
    o.max_requests = 1;
    o.max_context = context;
    o.max_step_tokens = step_tokens;
    o.max_logit_rows = step_tokens;  // score returns every position's
    auto gpu = std::make_unique<model::CudaModel>(m, o, load_progress_printer());
    print_upload_summary(gpu->upload_stats());
    return gpu;
}
#endif

void require_cuda_build(const ModelArgs& a) {
#ifndef FANOUT_WITH_CUDA
    FANOUT_CHECK(a.device != "cuda", "--device cuda: this fanout was built without CUDA (no nvcc at configure time)");
#endif
}

// The routed experts of the model at a.model split over `ep` ranks, threads of this process
// (model/ep_group.h), for steps of up to `max_tokens` tokens on rank 0.
std::unique_ptr<model::EpThreadGroup> load_ep_group(const ModelArgs& a, int ep, int64_t max_tokens) {
    FANOUT_CHECK(a.device == "cpu",
                 "--ep {}: expert parallelism runs on the CPU path so far (ranks as threads); the GPU runner holds "
                 "every expert (--ep 1)",
                 ep);
    const std::string dir = resolve_model_dir(a.model);
    const io::ModelConfig c = io::load_model_config(dir);
    validate(ParallelConfig{0, ep, 1}, c.n_routed_experts);  // before loading anything
    std::vector<std::unique_ptr<model::DeepseekV3>> models;
    for (int r = 0; r < ep; ++r) models.push_back(load_model(a, {}, ParallelConfig{r, ep, 1}));
    const int cores = a.threads > 0 ? a.threads : static_cast<int>(std::thread::hardware_concurrency());
    return std::make_unique<model::EpThreadGroup>(std::move(models), max_tokens, forward_options(a),
                                                  std::max(1, cores / ep));
}

struct MakeModelArgs {
    std::string preset = "tiny", dtype = "bf16", out;
    int64_t layers = 0;
    uint64_t seed = 0;
    double shard_gb = 4.0;
};

void run_make_model(const MakeModelArgs& a) {
    io::ModelConfig c = model::preset_config(a.preset, a.layers);
    if (a.dtype == "fp8") c.fp8 = io::Fp8QuantConfig{};
    model::MakeModelOptions o;
    o.seed = a.seed;
    o.max_shard_bytes = static_cast<int64_t>(a.shard_gb * (1 << 30));
    FANOUT_CHECK(o.max_shard_bytes > 0, "--shard-gb must be positive, got {}", a.shard_gb);
    o.progress = [](const std::string& file, int64_t done, int64_t total) {
        std::fprintf(stderr, "\rwriting %s: %.2f / %.2f GB   ", file.c_str(), done / 1e9, total / 1e9);
    };
    model::write_synthetic_model(a.out, c, o);
    const bool tok = c.vocab_size == 129280 && model::copy_default_tokenizer(a.out);
    std::fprintf(stderr, "\nwrote %s model (%lld layers, %s%s) to %s\n", a.preset.c_str(),
                 (long long)c.num_hidden_layers, a.dtype.c_str(), tok ? ", DeepSeek-V3 tokenizer" : "", a.out.c_str());
}

struct GenerateArgs {
    ModelArgs model;
    std::string prompt_ids, prompt_text;
    bool chat = false;
    model::GenerateRequest req;
    int ep = 1;
};

void run_generate(GenerateArgs& a, bool have_ids, bool have_text) {
    FANOUT_CHECK(have_ids != have_text, "give the prompt with --prompt TEXT or --prompt-ids 1,2,3");
    FANOUT_CHECK(!a.chat || have_text, "--chat takes the prompt as text (--prompt)");
    ops::validate_sampling_params(a.req.sampling);
    std::optional<io::Tokenizer> tokenizer;
    if (have_text) {
        tokenizer = load_tokenizer(resolve_model_dir(a.model.model));
        if (a.chat) {
            const io::ChatFormat format = io::detect_chat_format(tokenizer->chat_template());
            const std::vector<io::ChatMessage> messages = {{"user", a.prompt_text, {}}};
            a.req.prompt = tokenizer->encode(io::render_chat(format, messages, true, tokenizer->bos_token()), false);
        } else {
            a.req.prompt = tokenizer->encode(a.prompt_text, true);
        }
    } else {
        a.req.prompt = parse_ids(a.prompt_ids, "--prompt-ids");
    }
    require_cuda_build(a.model);
    std::unique_ptr<model::EpThreadGroup> group;
    std::unique_ptr<model::DeepseekV3> m;
    if (a.ep > 1)
        group = load_ep_group(a.model, a.ep, a.req.prefill_chunk);
    else
        m = load_model(a.model);
    ThreadPool pool(a.model.threads);
    const int64_t context = static_cast<int64_t>(a.req.prompt.size()) + a.req.max_tokens;
    std::optional<io::IncrementalDecoder> stream;
    if (tokenizer) stream.emplace(*tokenizer, /*skip_special_tokens=*/true);
    const auto on_token = [&](int32_t id) {
        if (!stream) return;
        const std::string piece = stream->push(id);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
    };
    model::GenerateResult res;
    if (group) {
        // Rank 0 runs the request; every step of it is a step of the group.
        const model::DeepseekV3& lead = group->lead();
        kv::PagedKvCache cache = make_cache(lead, context, a.model);
        const model::SampleStep step = [&](const model::StepBatch& batch, ops::Sampler& sampler) {
            auto out = group->forward(batch, cache);
            return batch.logit_rows.empty() ? -1
                                            : sampler.sample(out.logits.data_as<float>(), lead.config().vocab_size);
        };
        res = model::generate_loop(lead.config(), cache, a.req, step, on_token);
    } else if (a.model.device == "cuda") {
#ifdef FANOUT_WITH_CUDA
        auto gpu = make_cuda_model(*m, context, std::min<int64_t>(a.req.prefill_chunk, 256));
        kv::PagedKvCache blocks = gpu->make_block_allocator();
        res = model::generate_cuda(*gpu, blocks, a.req, on_token);
#endif
    } else {
        kv::PagedKvCache cache = make_cache(*m, context, a.model);
        res = model::generate(*m, cache, a.req, forward_options(a.model), Stream{&pool}, on_token);
    }
    if (stream) {
        std::printf("%s\n", stream->flush().c_str());
    } else {
        std::string ids;
        for (size_t i = 0; i < res.tokens.size(); ++i) ids += (i ? "," : "") + std::to_string(res.tokens[i]);
        std::printf("%s\n", ids.c_str());
    }
    const std::string where = a.model.device == "cuda" ? std::string("cuda")
                              : group                  ? fmt::format("{} EP ranks (threads)", a.ep)
                                                       : fmt::format("{} threads", pool.num_threads());
    std::fprintf(stderr,
                 "finish_reason=%s prompt_tokens=%lld generated=%zu prefill %.1f tok/s, decode %.1f tok/s (%s)\n",
                 res.finish_reason.c_str(), (long long)res.prompt_tokens, res.tokens.size(),
                 res.prompt_tokens / std::max(res.prefill_seconds, 1e-9),
                 (res.tokens.size() - 1) / std::max(res.decode_seconds, 1e-9), where.c_str());
}

struct ScoreArgs {
    ModelArgs model;
    std::string token_ids, output;
    int ep = 1;
};

void write_logits(const std::string& path, const Tensor& logits) {
    std::ofstream f(path, std::ios::binary);
    FANOUT_CHECK(f.good(), "cannot create {}", path);
    f.write(static_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.nbytes()));
    FANOUT_CHECK(f.good(), "writing {} failed", path);
    std::fprintf(stderr, "wrote logits [%lld, %lld] to %s\n", (long long)logits.dim(0), (long long)logits.dim(1),
                 path.c_str());
}

void run_score(const ScoreArgs& a) {
    const std::vector<int32_t> ids = parse_ids(a.token_ids, "--token-ids");
    require_cuda_build(a.model);
    std::unique_ptr<model::EpThreadGroup> group;
    std::unique_ptr<model::DeepseekV3> m;
    if (a.ep > 1)
        group = load_ep_group(a.model, a.ep, static_cast<int64_t>(ids.size()));
    else
        m = load_model(a.model);
    const model::DeepseekV3& lead = group ? group->lead() : *m;
    const io::ModelConfig& c = lead.config();
    const int64_t T = static_cast<int64_t>(ids.size());
    FANOUT_CHECK(T <= c.max_position_embeddings, "{} tokens exceed max_position_embeddings {}", T,
                 c.max_position_embeddings);
    for (int64_t t = 0; t < T; ++t)
        FANOUT_CHECK(ids[t] >= 0 && ids[t] < c.vocab_size, "token id {} at index {} is outside the vocabulary [0, {})",
                     ids[t], t, c.vocab_size);
    Tensor logits;
    if (a.model.device == "cuda") {
#ifdef FANOUT_WITH_CUDA
        auto gpu = make_cuda_model(*m, T, T);
        kv::PagedKvCache blocks = gpu->make_block_allocator();
        kv::SequenceBlocks seq;
        blocks.reserve(seq, T);
        auto batch = model::StepBatchBuilder(blocks).add(ids, 0, seq, model::StepBatchBuilder::Logits::kAll).build();
        logits = gpu->forward_logits(batch);
#endif
    } else {
        kv::PagedKvCache cache = make_cache(lead, T, a.model);
        kv::SequenceBlocks seq;
        cache.reserve(seq, T);
        auto batch = model::StepBatchBuilder(cache).add(ids, 0, seq, model::StepBatchBuilder::Logits::kAll).build();
        if (group) {
            logits = group->forward(batch, cache).logits;  // a step of every rank
        } else {
            ThreadPool pool(a.model.threads);
            logits = m->forward(batch, cache, forward_options(a.model), Stream{&pool}).logits;
        }
    }
    write_logits(a.output, logits);
}

}  // namespace

void add_model_commands(CLI::App& app) {
    auto mk_args = std::make_shared<MakeModelArgs>();
    auto* mk = app.add_subcommand("make-model", "write a synthetic checkpoint in the HF/DeepSeek format");
    mk->add_option("--preset", mk_args->preset, "'tiny' or 'full-layers' (real V3 widths)")
        ->check(CLI::IsMember({"tiny", "full-layers"}))
        ->capture_default_str();
    mk->add_option("--layers", mk_args->layers, "decoder layers (full-layers: required)");
    mk->add_option("--dtype", mk_args->dtype, "weight type")
        ->check(CLI::IsMember({"bf16", "fp8"}))
        ->capture_default_str();
    mk->add_option("--seed", mk_args->seed, "seed of the pseudo-random weights")->capture_default_str();
    mk->add_option("--shard-gb", mk_args->shard_gb, "largest safetensors shard, GB")->capture_default_str();
    mk->add_option("--out", mk_args->out, "output folder")->required();
    mk->callback([mk_args] { run_make_model(*mk_args); });

    auto gen_args = std::make_shared<GenerateArgs>();
    auto* gen = app.add_subcommand("generate", "continue a prompt (text or token ids)");
    add_model_args(gen, gen_args->model);
    auto* ids_opt = gen->add_option("--prompt-ids", gen_args->prompt_ids, "prompt token ids, comma-separated");
    auto* text_opt = gen->add_option("--prompt", gen_args->prompt_text, "prompt text (BOS added)");
    ids_opt->excludes(text_opt);
    gen->add_flag("--chat", gen_args->chat, "render --prompt as a user message with the chat template");
    auto& r = gen_args->req;
    gen->add_option("--max-tokens", r.max_tokens, "tokens to generate at most")->capture_default_str();
    gen->add_option("--ep", gen_args->ep,
                    "expert-parallel ranks, threads of this process on the CPU path: each holds n_routed_experts / N "
                    "routed experts; rank 0 runs the request, the others serve their experts")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    gen->add_option("--temperature", r.sampling.temperature, "0 = greedy")->capture_default_str();
    gen->add_option("--top-p", r.sampling.top_p, "nucleus sampling mass")->capture_default_str();
    gen->add_option("--top-k", r.sampling.top_k, "0 = off")->capture_default_str();
    gen->add_option("--seed", r.sampling.seed, "sampling seed")->capture_default_str();
    gen->add_flag("--ignore-eos", r.ignore_eos, "keep going past EOS");
    gen->callback(
        [gen_args, ids_opt, text_opt] { run_generate(*gen_args, ids_opt->count() > 0, text_opt->count() > 0); });

    auto score_args = std::make_shared<ScoreArgs>();
    auto* score = app.add_subcommand("score", "write the logits of a token sequence");
    add_model_args(score, score_args->model);
    score->add_option("--token-ids", score_args->token_ids, "token ids, comma-separated")->required();
    score
        ->add_option("--ep", score_args->ep,
                     "expert-parallel ranks, threads of this process on the CPU path: each holds n_routed_experts / N "
                     "routed experts; rank 0 runs the sequence, the others serve their experts")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    score->add_option("--output", score_args->output, "file for raw little-endian float32 logits [T, vocab]")
        ->required();
    score->callback([score_args] { run_score(*score_args); });
}

}  // namespace fanout::cli
