// CPU prefill and decode throughput of the reference forward pass, beside its roofline.
//
// Measures on this machine, over all threads: (1) streaming-read bandwidth (a 1 GiB buffer summed
// once); (2) the peak f32 FMA rate (8 independent 8-wide FMA chains per thread). The floors: decode streams the weights a step touches (attention, dense/shared MLP, the
// routed experts hit, the LM head) once; prefill does 2 FLOPs per active weight per token. Prints
// a table and writes JSON. There is no CPU anchor in REFERENCE.md: the GPU anchors apply from the
// GPU kernels on (docs/PERF.md).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "fanout/model/generate.h"
#include "fanout/model/synthetic.h"
#include "fanout/ops/cpu_util.h"

using namespace fanout;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Streaming-read bandwidth over all threads: each sums its share of a 1 GiB buffer.
double measure_read_bandwidth_gbs(ThreadPool& pool) {
    const int64_t n = int64_t{1} << 28;
    std::vector<float> a(static_cast<size_t>(n), 1.0f);
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
        const auto t = clock_type::now();
        pool.parallel_for(n, n / pool.num_threads(), [&](int64_t b, int64_t e) {
            volatile float sink = ops::cpu::dot(a.data() + b, a.data() + b, e - b);
            (void)sink;
        });
        best = std::min(best, seconds_since(t));
    }
    return 4.0 * n / best / 1e9;
}

// Peak f32 FMA rate over all threads: 8 independent 8-wide FMA chains per thread.
double measure_peak_gflops(ThreadPool& pool) {
    typedef float v8 __attribute__((vector_size(32)));
    const int64_t reps = 20'000'000;
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
        const auto t = clock_type::now();
        pool.parallel_for(pool.num_threads(), 1, [&](int64_t, int64_t) {
            v8 acc[8];
            for (int j = 0; j < 8; ++j) acc[j] = v8{} + static_cast<float>(j);
            const v8 x = v8{} + 0.9999999f, y = v8{} + 1e-7f;
            for (int64_t r = 0; r < reps; ++r)
                for (int j = 0; j < 8; ++j) acc[j] = acc[j] * x + y;
            volatile float sink = 0;
            for (int j = 0; j < 8; ++j) sink = sink + acc[j][0];
        });
        best = std::min(best, seconds_since(t));
    }
    return 2.0 * 64 * reps * pool.num_threads() / best / 1e9;
}

int64_t weight_bytes(const ops::LinearWeight& w) {
    return w.out_features * w.in_features * static_cast<int64_t>(dtype_size(w.dtype));
}
int64_t mlp_bytes(const model::MlpWeights& m) { return weight_bytes(m.gate) + weight_bytes(m.up) + weight_bytes(m.down); }

// Weight bytes a step of `batch` decode tokens reads, with the expected number of distinct
// experts under uniform routing: E · (1 − (1 − k/E)^batch).
double decode_step_bytes(const model::DeepseekV3& m, int64_t batch) {
    const auto& c = m.config();
    const auto& w = m.weights();
    double bytes = static_cast<double>(weight_bytes(w.lm_head)) + batch * c.hidden_size * 2.0;
    for (const auto& l : w.layers) {
        const auto& a = l.attn;
        bytes += weight_bytes(a.kv_a) + weight_bytes(a.kv_b) + weight_bytes(a.o) +
                 (c.q_lora_rank > 0 ? weight_bytes(a.q_a) + weight_bytes(a.q_b) : weight_bytes(a.q_proj));
        if (!l.is_moe) {
            bytes += mlp_bytes(l.mlp);
            continue;
        }
        const double E = static_cast<double>(c.n_routed_experts), k = static_cast<double>(c.num_experts_per_tok);
        bytes += weight_bytes(l.moe.router) + (l.moe.shared ? mlp_bytes(*l.moe.shared) : 0);
        bytes += E * (1.0 - std::pow(1.0 - k / E, static_cast<double>(batch))) * mlp_bytes(l.moe.experts[0]);
    }
    return bytes;
}

// Weights one token multiplies through in the decoder layers (2 FLOPs each), attention's
// score/value work and the LM head aside (prefill computes logits for its last token only).
double active_params(const model::DeepseekV3& m) {
    const auto& c = m.config();
    double p = 0;
    for (const auto& l : m.weights().layers) {
        const auto& a = l.attn;
        for (const auto* lw : {&a.q_a, &a.q_b, &a.q_proj, &a.kv_a, &a.kv_b, &a.o})
            p += static_cast<double>(lw->out_features * lw->in_features);
        const auto mp = [](const model::MlpWeights& x) {
            return 3.0 * static_cast<double>(x.gate.out_features * x.gate.in_features);
        };
        if (!l.is_moe) p += mp(l.mlp);
        else p += (l.moe.shared ? mp(*l.moe.shared) : 0) + c.num_experts_per_tok * mp(l.moe.experts[0]) +
                  static_cast<double>(c.n_routed_experts * c.hidden_size);
    }
    return p;
}

double lm_head_params(const model::DeepseekV3& m) {
    return static_cast<double>(m.config().vocab_size * m.config().hidden_size);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"CPU prefill/decode benchmark of the reference forward"};
    std::string model_dir = "tiny", json_out = "cpu_forward_bench.json", fp8_mode = "dequant";
    int64_t prompt_len = 128, decode_steps = 16, batch = 1;
    int threads = 0;
    app.add_option("--model", model_dir, "model folder or 'tiny'")->capture_default_str();
    app.add_option("--prompt-len", prompt_len, "prefill tokens")->capture_default_str();
    app.add_option("--decode-steps", decode_steps, "decode steps timed")->capture_default_str();
    app.add_option("--batch", batch, "decode requests per step")->capture_default_str();
    app.add_option("--threads", threads, "CPU threads (0 = all)");
    app.add_option("--fp8-mode", fp8_mode, "dequant or w8a8")->check(CLI::IsMember({"dequant", "w8a8"}));
    app.add_option("--json", json_out, "JSON output file")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    try {
        const std::string dir = model_dir == "tiny" ? model::ensure_tiny_model() : model_dir;
        auto m = model::DeepseekV3::load(dir);
        ThreadPool pool(threads);
        const Stream s{&pool};
        model::ForwardOptions opts;
        opts.fp8_mode = fp8_mode == "w8a8" ? ops::Fp8Mode::kW8A8 : ops::Fp8Mode::kDequant;
        const double bw = measure_read_bandwidth_gbs(pool), gflops = measure_peak_gflops(pool);

        const int64_t ctx = prompt_len + decode_steps + 1;
        kv::PagedKvCache cache(m->kv_cache_config(batch * ((ctx + 63) / 64)));
        std::vector<kv::SequenceBlocks> seqs(static_cast<size_t>(batch));
        std::vector<std::vector<int32_t>> prompts;
        for (int64_t b = 0; b < batch; ++b) {
            cache.reserve(seqs[b], ctx);
            std::vector<int32_t> p;
            for (int64_t i = 0; i < prompt_len; ++i) p.push_back(static_cast<int32_t>((i * 7919 + b * 31) % m->config().vocab_size));
            prompts.push_back(p);
        }
        // Warm-up, then prefill request 0 (timed), the others untimed.
        m->forward(model::StepBatchBuilder(cache).add(std::span(prompts[0]).first(8), 0, seqs[0]).build(), cache, opts, s);  // warm-up
        // Prefill request 0 three times (rewriting the same cache slots); the median counts.
        std::vector<double> prefill_runs;
        clock_type::time_point t;
        for (int rep = 0; rep < 3; ++rep) {
            t = clock_type::now();
            m->forward(model::StepBatchBuilder(cache).add(prompts[0], 0, seqs[0]).build(), cache, opts, s);
            prefill_runs.push_back(seconds_since(t));
        }
        std::sort(prefill_runs.begin(), prefill_runs.end());
        const double prefill_s = prefill_runs[1];
        for (int64_t b = 1; b < batch; ++b)
            m->forward(model::StepBatchBuilder(cache).add(prompts[b], 0, seqs[b]).build(), cache, opts, s);
        // Decode: `batch` requests, one token each per step.
        std::vector<double> step_s;
        for (int64_t i = 0; i < decode_steps; ++i) {
            model::StepBatchBuilder bb(cache);
            std::vector<int32_t> toks(static_cast<size_t>(batch));
            for (int64_t b = 0; b < batch; ++b) {
                toks[b] = static_cast<int32_t>((i * 131 + b) % m->config().vocab_size);
                bb.add(std::span(toks).subspan(b, 1), prompt_len + i, seqs[b]);
            }
            const auto step = bb.build();
            t = clock_type::now();
            m->forward(step, cache, opts, s);
            step_s.push_back(seconds_since(t));
        }
        std::sort(step_s.begin(), step_s.end());
        const double decode_step = step_s[step_s.size() / 2];

        const double prefill_tps = prompt_len / prefill_s, decode_tps = batch / decode_step;
        const double prefill_floor_s = 2.0 * (active_params(*m) * prompt_len + lm_head_params(*m)) / (gflops * 1e9);
        const double decode_floor_s = decode_step_bytes(*m, batch) / (bw * 1e9);
        std::printf("\nfanout CPU forward — %s, %d threads, fp8 mode %s\n", dir.c_str(), pool.num_threads(), fp8_mode.c_str());
        std::printf("measured ceilings (all threads): streaming read %.1f GB/s, peak f32 FMA %.1f GFLOP/s\n\n", bw, gflops);
        std::printf("%-28s %14s %16s %10s %s\n", "phase", "measured", "roofline floor", "of ceiling", "anchor");
        std::printf("%-28s %10.1f tok/s %12.1f tok/s %9.1f%% %s\n", ("prefill " + std::to_string(prompt_len) + " tok").c_str(),
                    prefill_tps, prompt_len / prefill_floor_s, 100.0 * prefill_floor_s / prefill_s, "none (CPU)");
        std::printf("%-28s %10.2f tok/s %12.2f tok/s %9.1f%% %s\n", ("decode batch " + std::to_string(batch)).c_str(),
                    decode_tps, batch / decode_floor_s, 100.0 * decode_floor_s / decode_step, "none (CPU)");
        nlohmann::json j;
        j["benchmark"] = "cpu_forward";
        j["machine"] = {{"threads", pool.num_threads()}, {"hardware_concurrency", std::thread::hardware_concurrency()},
                        {"read_gbs", bw}, {"peak_fma_gflops", gflops}};
        j["model"] = {{"dir", dir}, {"layers", m->config().num_hidden_layers}, {"hidden", m->config().hidden_size},
                      {"fp8", m->config().fp8.has_value()}, {"fp8_mode", fp8_mode}};
        j["prefill"] = {{"tokens", prompt_len}, {"seconds", prefill_s}, {"tokens_per_s", prefill_tps},
                        {"floor_seconds", prefill_floor_s}, {"active_params", active_params(*m)}};
        j["decode"] = {{"batch", batch}, {"context", prompt_len}, {"median_step_seconds", decode_step},
                       {"tokens_per_s", decode_tps}, {"floor_seconds", decode_floor_s},
                       {"step_weight_bytes", decode_step_bytes(*m, batch)}};
        j["anchor"] = "none: REFERENCE.md has GPU anchors only";
        std::ofstream(json_out) << j.dump(2) << "\n";
        std::printf("\nwrote %s\n", json_out.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
