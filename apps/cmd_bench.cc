// bench: `fanout bench tokenizer`, `fanout bench serve`, and on CUDA builds `fanout bench kernels`,
// `fanout bench mla`, `fanout bench layer`, `fanout bench comm`.
#include <map>

#include "cli_common.h"
#include "comm_bench.h"
#include "kernels_bench.h"
#include "layer_bench.h"
#include "mla_bench.h"
#include "serve_bench.h"
#include "tokenizer_bench.h"

namespace fanout::cli {

void add_bench_command(CLI::App& app) {
    auto* bench = app.add_subcommand("bench", "benchmarks: print a table, write JSON");
    bench->require_subcommand(1);
    auto o = std::make_shared<bench::TokenizerBenchOptions>();
    auto model = std::make_shared<std::string>("tiny");
    o->corpus = FANOUT_SOURCE_DIR "/tests/fixtures/tokenizer/corpus.jsonl";
    o->js_script = FANOUT_SOURCE_DIR "/scripts/js/tokenize.mjs";
    o->json_out = "tokenizer_bench.json";
    auto* tok = bench->add_subcommand("tokenizer", "single-threaded encode speed beside the JS reference");
    add_model_flag(tok, *model);
    tok->add_option("--corpus", o->corpus, "JSONL corpus")->capture_default_str();
    tok->add_option("--js", o->js_script, "JS reference script ('' to skip)")->capture_default_str();
    tok->add_option("--repeat", o->repeat, "passes over the corpus")->capture_default_str();
    tok->add_option("--json", o->json_out, "JSON output")->capture_default_str();
    tok->callback([o, model] {
        o->tokenizer_dir = resolve_model_dir(*model);
        load_tokenizer(o->tokenizer_dir);  // a clear error when the model has none
        if (const int rc = bench::run_tokenizer_bench(*o); rc != 0) FANOUT_FAIL("tokenizer benchmark found mismatches");
    });

    auto s = std::make_shared<bench::ServeBenchOptions>();
    s->json_out = "serve_bench.json";
    auto* serve =
        bench->add_subcommand("serve", "load-test an OpenAI-compatible server: throughput, TTFT, TPOT, ITL, goodput");
    serve->add_option("--base-url", s->base_url, "server, http://host:port")->capture_default_str();
    serve->add_option("--model", s->model, "'model' sent (default: the first of GET /v1/models)");
    serve->add_option("--endpoint", s->endpoint, "chat or completions")
        ->check(CLI::IsMember({"chat", "completions"}))
        ->capture_default_str();
    serve->add_option("-n,--num-requests", s->num_requests, "requests to send")->capture_default_str();
    serve->add_option("--request-rate", s->request_rate, "Poisson arrivals per second (0 = all at once)")
        ->capture_default_str();
    serve->add_option("--max-concurrency", s->max_concurrency, "requests in flight at most (0 = unlimited)")
        ->capture_default_str();
    serve->add_option("--prompt-len", s->prompt_len, "prompt words per request")->capture_default_str();
    serve->add_option("--prompt-len-range", s->prompt_len_range, "prompt words vary uniformly by +-this")
        ->capture_default_str();
    serve->add_option("--output-len", s->output_len, "max_tokens per request")->capture_default_str();
    serve->add_option("--output-len-range", s->output_len_range, "max_tokens varies uniformly by +-this")
        ->capture_default_str();
    serve->add_option("--prefix-groups", s->prefix_groups, "shared-prefix groups (0 = none)")->capture_default_str();
    serve
        ->add_option("--turns", s->turns,
                     "multi-turn: conversations of N requests, each extending the previous prompt by --prompt-len "
                     "words, sent when it finished (reports the best hit rate a placement could reach)")
        ->capture_default_str();
    serve
        ->add_option("--first-turn-len", s->first_turn_len,
                     "multi-turn: words of each conversation's opening (a document, a long history; 0 = "
                     "--prompt-len), later turns add --prompt-len")
        ->capture_default_str();
    serve->add_option("--kv-block-size", s->kv_block_size, "the server's KV block size, for the best hit rate")
        ->capture_default_str();
    serve->add_option("--prefix-len", s->prefix_len, "words of each shared prefix, before the prompt words")
        ->capture_default_str();
    serve->add_option("--slo-ttft-ms", s->slo_ttft_ms, "goodput: TTFT bound (0 = none)")->capture_default_str();
    serve->add_option("--slo-tpot-ms", s->slo_tpot_ms, "goodput: TPOT bound (0 = none)")->capture_default_str();
    serve->add_option("--seed", s->seed, "workload seed")->capture_default_str();
    serve->add_flag("!--no-ignore-eos", s->ignore_eos,
                    "let outputs stop at EOS (default: ignore_eos, run to max_tokens)");
    serve->add_option("--timeout", s->timeout_s, "seconds per request")->capture_default_str();
    serve->add_option("--json", s->json_out, "JSON output ('' to skip)")->capture_default_str();
    auto mix = std::make_shared<std::string>();
    serve->add_option("--mix", *mix,
                      "kinds of request and their weights: streamed=W,plain=W,cancelled=W,malformed=W "
                      "(default: streamed only)");
    serve
        ->add_option("--slow-clients", s->slow_clients,
                     "extra connections that send a request head one byte per second for the whole run")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    serve
        ->add_option("--server-pid", s->server_pid,
                     "sample this process's RSS, threads and open fds from /proc every 0.5 s (0 = no sampling)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    serve->callback([s, mix] {
        if (!mix->empty()) s->mix = bench::parse_request_mix(*mix);
        if (const int rc = bench::run_serve_bench(*s); rc != 0)
            FANOUT_FAIL("serve benchmark: some requests failed (or the sampled server went away)");
    });

    auto k = std::make_shared<bench::KernelsBenchOptions>();
    auto* kernels = bench->add_subcommand(
        "kernels", "FP8 GEMM and grouped GEMM kernels beside cuBLASLt, DeepGEMM and the rooflines (GPU)");
    kernels->add_flag("--sweep", k->sweep, "also time every tile shape and split of the dense GEMM");
    kernels->add_flag(
        "--cold", k->cold,
        "dense: each call reads its own copy of W (the copies together 3x the L2), as a model's "
        "layers do; the default reuses one W, cache-warm where it fits the L2, as the anchors were taken");
    kernels->add_flag("--serial", k->serial,
                      "dense: no call overlaps the next (an empty kernel between them, its time subtracted), as in a "
                      "layer; the default times back-to-back calls, each starting in the previous one's tail");
    kernels->add_flag("!--no-dense", k->dense, "skip the dense shapes");
    kernels->add_flag("!--no-grouped", k->grouped, "skip the grouped points (masked decode and contiguous prefill)");
    kernels->add_option("--shape", k->shape,
                        "dense: only this shape (fused qkv_a, q_b, kv_b, o_proj, shared gate+up, shared down)");
    kernels
        ->add_option("--m", k->m,
                     "dense: only this M (64, 128, 256, 1024 and 4096 have anchors and sums; any other runs alone)")
        ->check(CLI::PositiveNumber);
    kernels->add_option("--config", k->config,
                        "dense: this tile config instead of the table, e.g. 128x256/1, 128x128/2c2, or 128x256/skc2 "
                        "(stream-K: the tiles past the whole waves dealt out in K shares; 128x128 and 128x256)");
    kernels->add_flag("--lt-search", k->lt_search,
                      "dense: also time cuBLASLt's block-scaled FP8 algorithm in every tile and cluster shape it "
                      "accepts (its heuristic offers one)");
    kernels
        ->add_option("--data", k->data,
                     "the FP8 operands' values: uniform (in ±64), normal (σ = 448/4, as block-quantized Gaussian "
                     "values) or zeros; long GEMMs run at the power limit, where the values move the clock")
        ->transform(CLI::CheckedTransformer(std::map<std::string, bench::KernelsBenchOptions::Data>(
            std::begin(bench::kDataNames), std::end(bench::kDataNames))));
    kernels
        ->add_option("--draws", k->draws,
                     "grouped masked: time every config on this many routing draws of each point's total (the "
                     "anchor's counts first) and print each one's mean and range")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    kernels->add_flag("--hot", k->hot,
                      "grouped masked: time each of fanout's configs after ~0.2 s of it back to back instead of an "
                      "idle pause, at the clock the power limit leaves under sustained work (as in a layer); the "
                      "cuBLASLt column is still timed from the pause");
    kernels->add_option("--json", k->json_out, "JSON output ('' to skip)")->capture_default_str();
    kernels->callback([k] {
#ifdef FANOUT_WITH_CUDA
        bench::run_kernels_bench(*k);
#else
        FANOUT_FAIL("`fanout bench kernels` needs a CUDA build: this fanout was configured without nvcc");
#endif
    });

    auto a = std::make_shared<bench::MlaBenchOptions>();
    auto* mla = bench->add_subcommand(
        "mla", "MLA decode attention (absorbed form, paged cache) and MHA-form prefill beside the bf16 peak (GPU)");
    mla->add_option("--batches", a->batches, "requests per step")->delimiter(',')->capture_default_str();
    mla->add_option("--query-len", a->query_len, "query tokens per request")->capture_default_str();
    mla->add_option("--kv-len", a->kv_len, "cached positions per request")->capture_default_str();
    mla->add_option("--heads", a->heads, "query heads (128 at TP1)")->capture_default_str();
    mla->add_flag("--head-major", a->head_major,
                  "q_lat and the output head-major [H, T, 512], as the layer holds them (default token-major)");
    mla->add_option("--prefill", a->prefill_shapes,
                    "MHA-form prefill points heads:tokens:prefix[:requests] ('' for none)")
        ->delimiter(',')
        ->capture_default_str();
    mla->add_option("--json", a->json_out, "JSON output ('' to skip)")->capture_default_str();
    mla->callback([a] {
#ifdef FANOUT_WITH_CUDA
        bench::run_mla_bench(*a);
#else
        FANOUT_FAIL("`fanout bench mla` needs a CUDA build: this fanout was configured without nvcc");
#endif
    });

    auto l = std::make_shared<bench::LayerBenchOptions>();
    auto* layer = bench->add_subcommand(
        "layer", "one V3 layer (dense and MoE at emulated EP8..EP128), kernel by kernel beside the roofline (GPU)");
    layer->add_option("--batches", l->batches, "requests per GPU")->delimiter(',')->capture_default_str();
    layer->add_option("--eps", l->eps, "EP sizes to emulate (256 / EP local experts)")
        ->delimiter(',')
        ->capture_default_str();
    layer->add_option("--query-len", l->query_len, "query tokens per request")->capture_default_str();
    layer->add_option("--kv-len", l->kv_len, "cached positions per request")->capture_default_str();
    layer->add_option("--replays", l->replays, "timed graph replays per point")->capture_default_str();
    layer
        ->add_option("--comm", l->comm,
                     "emulated only, or also real dispatch/combine across the visible GPUs (EP = their number)")
        ->check(CLI::IsMember({"emulated", "nvlink", "nccl"}))
        ->capture_default_str();
    layer->add_option("--gpus", l->gpus, "GPUs for --comm nvlink|nccl (0: every visible one)")->capture_default_str();
    layer->add_flag("--mha", l->mha,
                    "attention in the MHA form, as the model runs prefill chunks (needs --query-len > 4)");
    layer
        ->add_option("--decodes", l->decodes,
                     "one-token decode requests ahead of each point's requests in the same step (a mixed step)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    layer->add_flag("--microbatch", l->microbatch,
                    "also each emulated MoE point as two interleaved microbatches (the split's cost: communication "
                    "is not included)");
    layer->add_option("--kv-dtype", l->kv_dtype, "KV cache entries: bf16 or fp8")
        ->check(CLI::IsMember({"bf16", "fp8"}))
        ->capture_default_str();
    layer->add_option("--json", l->json_out, "JSON output ('' to skip)")->capture_default_str();
    layer->callback([l] {
#ifdef FANOUT_WITH_CUDA
        bench::run_layer_bench(*l);
#else
        FANOUT_FAIL("`fanout bench layer` needs a CUDA build: this fanout was configured without nvcc");
#endif
    });

    auto m = std::make_shared<bench::CommBenchOptions>();
    auto* comm = bench->add_subcommand(
        "comm", "EP dispatch/combine on all visible GPUs beside peer bandwidth, NCCL all-to-all and pplx (GPU)");
    comm->add_option("--backends", m->backends, "GPU EP backends: nvlink, nccl")->delimiter(',')->capture_default_str();
    comm->add_option("--tokens", m->tokens, "tokens per rank")->delimiter(',')->capture_default_str();
    comm->add_option("--capacity", m->capacity,
                     "tokens per rank the backends are built for, as a server builds them for its step budget "
                     "(0: each point's own count)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    comm->add_option("--hidden", m->hidden, "hidden size")->capture_default_str();
    comm->add_option("--experts", m->experts, "routed experts")->capture_default_str();
    comm->add_option("--topk", m->topk, "experts per token")->capture_default_str();
    comm->add_option("--replays", m->replays, "timed graph replays per figure")->capture_default_str();
    comm->add_option("--json", m->json_out, "JSON output ('' to skip)")->capture_default_str();
    comm->callback([m] {
#ifdef FANOUT_WITH_CUDA
        bench::run_comm_bench(*m);
#else
        FANOUT_FAIL("`fanout bench comm` needs a CUDA build: this fanout was configured without nvcc");
#endif
    });
}

}  // namespace fanout::cli
