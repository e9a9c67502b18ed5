// make-model, generate, score.
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "cli_common.h"
#include "deployment.h"
#include "fanout/core/parallel.h"
#include "fanout/io/chat_template.h"
#include "fanout/model/ep_group.h"
#include "fanout/model/generate.h"
#include "fanout/model/step_cost.h"
#include "fanout/model/synthetic.h"
#ifdef FANOUT_WITH_CUDA
#include "fanout/engine/cuda_runner.h"
#include "fanout/model/deepseek_v3_cuda.h"
#endif

namespace fanout::cli {
namespace {

#ifdef FANOUT_WITH_CUDA
// The GPU runner for one request of up to `context` tokens, taking `step_tokens` per step
// (`microbatch`: with the two-microbatch schedule), over a cache of `kv_dtype` entries.
std::unique_ptr<model::CudaModel> make_cuda_model(const model::DeepseekV3& m, int64_t context, int64_t step_tokens,
                                                  bool microbatch, DType kv_dtype) {
    model::CudaModelOptions o;
    o.microbatch = microbatch;
    o.kv_dtype = kv_dtype;
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
std::unique_ptr<model::EpThreadGroup> load_ep_group(const ModelArgs& a, int ep, int64_t max_tokens, int tp) {
    FANOUT_CHECK(a.device == "cpu",
                 "--ep {}: expert parallelism runs on the CPU path so far (ranks as threads); the GPU runner holds "
                 "every expert (--ep 1)",
                 ep);
    const std::string dir = resolve_model_dir(a.model);
    const io::ModelConfig c = io::load_model_config(dir);
    validate(ParallelConfig{0, ep, tp}, c.n_routed_experts);  // before loading anything
    std::vector<std::unique_ptr<model::DeepseekV3>> models;
    for (int r = 0; r < ep; ++r) models.push_back(load_model(a, {}, ParallelConfig{r, ep, tp}));
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
    FANOUT_CHECK(std::isfinite(a.shard_gb) && a.shard_gb > 0 && a.shard_gb <= 1024,
                 "--shard-gb must be in (0, 1024], got {}", a.shard_gb);
    o.max_shard_bytes = std::max<int64_t>(1, static_cast<int64_t>(a.shard_gb * (1 << 30)));
    o.note = [](const std::string& what) { std::fprintf(stderr, "%s\n", what.c_str()); };
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
    int ep = 0;  // 0: 1, or the MPI launcher's world
    std::string ranks = "threads";
    int mtp = 0;  // MTP draft tokens per step
    int tp = 1;   // tensor-parallel attention ranks per DP group
    MicrobatchArgs microbatch;
};

// generate through the engine — the one runner path `serve` uses: rank 0's engine runs the
// request; at --ep N the other ranks of the DP group (deployment.h) run empty steps serving their
// experts. Prints the text (or the ids) as it streams, then a summary line on stderr.
void generate_through_engine(GenerateArgs& a, Deployment& d, const io::Tokenizer* tokenizer) {
    const std::string dir = resolve_model_dir(a.model.model);
    const io::ModelConfig c = io::load_model_config(dir);
    check_tp(a.tp, a.ep, a.model.device);
    validate(ParallelConfig{d.rank, a.ep, a.tp}, c.n_routed_experts);  // before loading anything
    // The cache is sized from the request: the request is checked against the model's context
    // first (before, --max-tokens 10000000 on a 64-position model allocated 12.8 GB, then failed).
    const int64_t prompt = static_cast<int64_t>(a.req.prompt.size());
    FANOUT_CHECK(a.req.max_tokens >= 1 && a.req.max_tokens <= c.max_position_embeddings - prompt,
                 "--max-tokens {} with a {}-token prompt: must be in 1..{} (the model's max_position_embeddings {})",
                 a.req.max_tokens, prompt, std::max<int64_t>(0, c.max_position_embeddings - prompt),
                 c.max_position_embeddings);
    const int64_t context = prompt + a.req.max_tokens;
    FANOUT_CHECK(a.req.prefill_chunk >= 1, "--prefill-chunk must be >= 1, got {}", a.req.prefill_chunk);
    engine::EngineConfig ec;
    ec.scheduler.max_num_seqs = 1;
    ec.scheduler.max_batched_tokens = a.req.prefill_chunk;
    ec.scheduler.prefill_chunk = a.req.prefill_chunk;
    ec.num_kv_blocks = std::max<int64_t>(1, (context + kv::kDefaultBlockSize - 1) / kv::kDefaultBlockSize);
    ec.mtp_draft_tokens = a.mtp;
    a.microbatch.apply(ec);
    const DType kv_dtype = cli::kv_dtype(a.model);
    // As serve: small query lengths in the absorbed form (the engine raises it for MTP's checking steps).
    model::ForwardOptions opts = forward_options(a.model);
    opts.absorbed_max_query = model::absorbed_form_max_query(c);
    if (a.model.device == "cuda") {
#ifdef FANOUT_WITH_CUDA
        model::CudaModelOptions o;
        o.max_requests = 1;
        o.max_context = context;
        o.max_step_tokens = std::min<int64_t>(a.req.prefill_chunk, 256);
        o.num_kv_blocks = ec.num_kv_blocks;
        o.kv_dtype = kv_dtype;
        o.mtp_draft_tokens = a.mtp;
        o.microbatch = ec.microbatch == engine::EngineConfig::Microbatch::kOn;  // EP1: auto has nothing to hide
        ec.scheduler.max_batched_tokens = ec.scheduler.prefill_chunk = o.max_step_tokens;
        auto m = load_model(a.model);
        auto runner = std::make_unique<engine::CudaRunner>(*m, o, load_progress_printer());
        print_upload_summary(runner->model().upload_stats());
        d.make_rank(std::move(runner), ec, tokenizer);
#endif
    } else if (a.ep == 1) {
        d.make_rank(std::make_unique<engine::DeepseekRunner>(load_model(a.model), opts, a.model.threads, kv_dtype), ec,
                    tokenizer);
    } else {
        const int local = a.ranks == "threads" ? a.ep : 1;
        std::vector<std::unique_ptr<model::DeepseekV3>> models;
        for (int r = 0; r < local; ++r)
            models.push_back(load_model(a.model, {}, ParallelConfig{d.rank + r, a.ep, a.tp}));
        const int cores = a.model.threads > 0 ? a.model.threads : static_cast<int>(std::thread::hardware_concurrency());
        d.make_cpu_ranks(std::move(models), ec, opts, std::max(1, cores / a.ep), kv_dtype, tokenizer, a.tp);
    }
    if (d.follows()) return d.follow();
    d.start();
    engine::RequestParams p;
    p.prompt = a.req.prompt;
    p.max_tokens = a.req.max_tokens;
    p.sampling = a.req.sampling;
    p.ignore_eos = a.req.ignore_eos;
    const auto t0 = std::chrono::steady_clock::now();
    auto handle = d.service().submit(p);
    std::vector<int32_t> tokens;
    engine::RequestEvent ev;
    std::chrono::steady_clock::time_point first;
    while (handle->next(&ev, std::chrono::hours(24))) {
        if (tokens.empty() && !ev.tokens.empty()) first = std::chrono::steady_clock::now();
        tokens.insert(tokens.end(), ev.tokens.begin(), ev.tokens.end());
        if (tokenizer) {
            std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
            std::fflush(stdout);
        }
        if (ev.finished) break;
    }
    const auto end = std::chrono::steady_clock::now();
    d.stop();
    const std::string failure = d.failure();
    FANOUT_CHECK(failure.empty(), "the deployment stopped: {}", failure);
    FANOUT_CHECK(ev.finished && ev.finish_reason != "error", "generation failed ({})", ev.finish_reason);
    if (tokenizer) {
        std::printf("\n");
        std::fflush(stdout);
    } else {
        std::string ids;
        for (size_t i = 0; i < tokens.size(); ++i) ids += (i ? "," : "") + std::to_string(tokens[i]);
        std::printf("%s\n", ids.c_str());
    }
    const std::string where =
        a.model.device == "cuda" ? std::string("cuda")
        : a.ep > 1
            ? fmt::format("{} EP ranks as {}", a.ep, a.ranks)
            : fmt::format("{} threads", a.model.threads > 0 ? a.model.threads
                                                            : static_cast<int>(std::thread::hardware_concurrency()));
    const double prefill = std::chrono::duration<double>(first - t0).count();
    const double decode = std::chrono::duration<double>(end - first).count();
    std::fprintf(
        stderr, "finish_reason=%s prompt_tokens=%zu generated=%zu prefill %.1f tok/s, decode %.1f tok/s (%s)\n",
        ev.finish_reason.c_str(), a.req.prompt.size(), tokens.size(), a.req.prompt.size() / std::max(prefill, 1e-9),
        (tokens.size() - 1) / std::max(decode, 1e-9), where.c_str());
    if (a.mtp > 0) {
        const engine::EngineStats st = d.service().stats();
        std::fprintf(stderr, "MTP: %lld of %lld draft tokens accepted (%.1f%%)\n", (long long)st.accepted_draft_tokens,
                     (long long)st.draft_tokens,
                     st.draft_tokens ? 100.0 * st.accepted_draft_tokens / st.draft_tokens : 0.0);
    }
}

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
    Deployment d;
    d.join_world(a.ep, a.ranks, a.model.device);
    FANOUT_CHECK(a.ep == 1 || a.model.device == "cpu",
                 "generate --ep {} --device cuda: run the deployment with `mpirun -np {} fanout serve --device cuda` "
                 "(GPU ranks are processes)",
                 a.ep, a.ep);
    generate_through_engine(a, d, tokenizer ? &*tokenizer : nullptr);
}

struct ScoreArgs {
    ModelArgs model;
    std::string token_ids, output;
    int ep = 0;  // 0: 1, or the MPI launcher's world
    std::string ranks = "threads";
    int tp = 1;
    MicrobatchArgs microbatch;
};

void write_logits(const std::string& path, const Tensor& logits) {
    std::ofstream f(path, std::ios::binary);
    FANOUT_CHECK(f.good(), "cannot create {}", path);
    f.write(static_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.nbytes()));
    FANOUT_CHECK(f.good(), "writing {} failed", path);
    std::fprintf(stderr, "wrote logits [%lld, %lld] to %s\n", (long long)logits.dim(0), (long long)logits.dim(1),
                 path.c_str());
}

void run_score(ScoreArgs& a) {
    const std::vector<int32_t> ids = parse_ids(a.token_ids, "--token-ids");
    require_cuda_build(a.model);
    Deployment d;
    d.join_world(a.ep, a.ranks, a.model.device);
    check_tp(a.tp, a.ep, a.model.device);
    FANOUT_CHECK(a.ep == 1 || a.model.device == "cpu",
                 "--ep {}: expert parallelism runs on the CPU path so far; the GPU runner holds every expert (--ep 1)",
                 a.ep);
    std::unique_ptr<model::EpThreadGroup> group;
    std::unique_ptr<model::DeepseekV3> m;
    if (d.world > 1)  // this process's rank; the others are processes of the launcher
        m = load_model(a.model, {}, ParallelConfig{d.rank, d.world, a.tp});
    else if (a.ep > 1)
        group = load_ep_group(a.model, a.ep, static_cast<int64_t>(ids.size()), a.tp);
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
        auto gpu = make_cuda_model(*m, T, T, a.microbatch.on_for(T), kv_dtype(a.model));
        kv::PagedKvCache blocks = gpu->make_block_allocator();
        kv::SequenceBlocks seq;
        blocks.reserve(seq, T);
        auto batch = model::StepBatchBuilder(blocks).add(ids, 0, seq, model::StepBatchBuilder::Logits::kAll).build();
        batch.microbatch = a.microbatch.on_for(T);  // one request: all in the first microbatch
        logits = gpu->forward_logits(batch);
#endif
    } else {
        kv::PagedKvCache cache = make_cache(lead, T, a.model);
        kv::SequenceBlocks seq;
        cache.reserve(seq, T);
        auto batch = model::StepBatchBuilder(cache).add(ids, 0, seq, model::StepBatchBuilder::Logits::kAll).build();
        batch.microbatch = a.microbatch.on_for(T);
        if (group) {
            logits = group->forward(batch, cache).logits;  // a step of every rank
        } else if (d.world > 1) {
#ifdef FANOUT_WITH_MPI
            FANOUT_CHECK(d.mpi != nullptr,
                         "score's ranks as processes exchange tokens over MPI: start them with mpirun");
            // One step of the group: the first DP rank's TP ranks (rank 0 alone without TP) the
            // sequence, the others an empty step serving their experts.
            const ParallelConfig pc{d.rank, d.world, a.tp};
            auto ep = comm::make_mpi_ep(m->ep_config(pc, T), d.comm);
            auto microbatch_ep = comm::make_mpi_ep(m->ep_config(pc, T), d.microbatch_comm());
            model::ForwardOptions o = forward_options(a.model);
            o.ep = ep.get();
            o.microbatch_ep = microbatch_ep.get();
            Deployment::TpGroup g;
            if (a.tp > 1) {
                g = d.join_tp_group(a.tp, false);
                o.tp = g.tp.get();
            }
            ThreadPool pool(a.model.threads);
            model::StepBatch empty = model::StepBatchBuilder(cache).build();
            empty.microbatch = batch.microbatch;  // every rank's exchanges the same way
            const auto out = m->forward(d.rank < a.tp ? batch : empty, cache, o, Stream{&pool});
            if (d.rank != 0) return;
            logits = out.logits;
#endif
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
    add_rank_options(gen, gen_args->ep, gen_args->ranks, gen_args->tp);
    add_microbatch_options(gen, gen_args->microbatch);
    gen->add_option("--mtp", gen_args->mtp,
                    "MTP speculative decoding: draft tokens per step (0 = off; at most 3 on the GPU)")
        ->check(CLI::Range(0, engine::Engine::kMaxDraftTokens))
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
    add_rank_options(score, score_args->ep, score_args->ranks, score_args->tp);
    add_microbatch_options(score, score_args->microbatch);
    score->add_option("--output", score_args->output, "file for raw little-endian float32 logits [T, vocab]")
        ->required();
    score->callback([score_args] { run_score(*score_args); });
}

}  // namespace fanout::cli
