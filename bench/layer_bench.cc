#include "layer_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "emulated_ep.h"
#include "fanout/comm/ep_gpu.h"
#include "fanout/comm/local_gpus.h"
#include "fanout/core/cuda_check.h"
#include "fanout/core/cuda_graph.h"
#include "fanout/model/cuda_layer.h"
#include "fanout/model/deepseek_v3.h"
#include "fanout/model/synthetic.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/mla_attention_cuda.h"
#include "fanout/ops/model_glue_cuda.h"
#include "gpu_timing.h"
#include "kernels_bench.h"

namespace fanout::bench {
namespace {

using model::CudaLayerExec;
using model::DeviceArray;

// REFERENCE.md §1: one MoE layer, H100, TP1, batch 128 per GPU, query 2, KV 5000.
constexpr double kSeedEp8LayerUs = 1802;  // with communication
constexpr double kSeedGroupGemmUs[2][2] = {{8, 555}, {128, 270}};
constexpr double kTargetGroupedEp8Us = 385, kTargetLayerEp8Us = 1100;  // issue 6, H200, no communication

struct Cost {
    double bytes = 0, flops = 0;
    bool bf16 = false;  // tensor-core work at the bf16 rate (attention, router), else FP8
};

// y[M, N] = x[M, K] · Wᵀ with FP8 W and x already in FP8 (the norm or activation before it wrote
// it, and counts those bytes): weights once, x read once, output bf16.
Cost gemm(double M, double N, double K) { return {N * K + M * K + M * N * 2, 2 * M * N * K}; }
Cost add(Cost a, Cost b) { return {a.bytes + b.bytes, a.flops + b.flops, a.bf16 || b.bf16}; }

// Bytes and FLOPs of each kernel the layer marks, for T tokens of R requests.
// `emulated`: the local experts receive m rows each on average (the emulated backend); else the step's own
// routing, which reaches at most T·top_k of them — only those experts' weights are read.
// `decodes` of the T tokens are one-token requests ahead of the R requests; `mha`: the R requests'
// attention runs in the MHA form (their chunks end their kv contexts; causal), the decodes' apart
// in the absorbed form ("decode_attention").
// `entry_bytes`: one cached position's bytes (bf16 or FP8 entries), as the attention reads them.
std::map<std::string, Cost> layer_costs(const io::ModelConfig& c, double R, double T, double kv, int ep, double m,
                                        double entry_bytes, bool emulated = true, double decodes = 0,
                                        bool mha = false) {
    const double D = c.hidden_size, H = c.num_attention_heads, C = c.kv_lora_rank, nope = c.qk_nope_head_dim;
    const double rope = c.qk_rope_head_dim, V = c.v_head_dim, ql = c.q_lora_rank, E = c.n_routed_experts;
    const double K = c.num_experts_per_tok, Ie = c.moe_intermediate_size, EL = E / std::max(ep, 1);
    const double Is = ep > 0 ? Ie * c.n_shared_experts : c.intermediate_size;
    std::map<std::string, Cost> k;
    // The norms in front of FP8 projections write only their e4m3 rows (+ scales).
    k["input_norm"] = {T * D * 3, 0};
    k["qkv_a"] = gemm(T, ql + C + rope, D);
    k["q_a_norm"] = {T * ql * 3, 0};
    k["q_b"] = gemm(T, H * (nope + rope), ql);
    // q's rope parts read and written in place (the k_b BMM reads the nope parts where q_b left
    // them), the kv latent and k_pe read and their cache entry written.
    k["latent_norm_rope_append"] = {T * H * rope * 4 + T * (C + rope) * 4, 0};
    const auto absorbed = [&](double r, double t) {
        return Cost{r * kv * entry_bytes + t * H * (C + rope + C) * 2, 2 * t * H * kv * (C + rope + C), true};
    };
    const double Ta = mha ? decodes : T;  // tokens in the absorbed form
    if (mha) {
        const double chunk = (T - decodes) / std::max(R, 1.0), pairs = R * (chunk * kv - chunk * (chunk - 1) / 2);
        // (the gather's reads are not counted; its bf16 rows quantized in the span)
        k["kv_b_expand"] = add(gemm(R * kv, H * (nope + V), C), {R * kv * C * 3, 0});
        k["attention"] = {(T - decodes) * H * (nope + rope + V) * 2 + R * kv * (H * (nope + V) + rope) * 2,
                          2 * H * pairs * (nope + rope + V), true};
        if (decodes > 0) k["decode_attention"] = absorbed(decodes, decodes);
    } else {
        k["attention"] = absorbed(R + decodes, T);
    }
    if (Ta > 0) {  // per-head bf16 GEMMs (k_b and v_b stay bf16): weights, input and output in bf16
        k["bmm_q_absorb"] = {(H * C * nope + H * Ta * nope + H * Ta * C) * 2, 2 * H * Ta * C * nope, true};
        k["bmm_v"] = {(H * V * C + H * Ta * C + H * Ta * V) * 2, 2 * H * Ta * V * C, true};
    }
    // o_proj quantizes its bf16 input in the span (read 2, write 1) and adds into the residual.
    k["o_proj"] = add(gemm(T, D, H * V), {T * H * V * 3 + T * D * 2, 0});
    k["post_norm"] = {T * D * 5, 0};  // the residual read, its e4m3 rows and the bf16 rows the router reads
    k["shared_gate_up"] = gemm(T, 2 * Is, D);
    k["shared_silu_quant"] = {T * Is * 5, 0};
    k["shared_down"] = add(gemm(T, D, Is), {T * D * 2, 0});
    if (ep > 0) {
        k["gate"] = {E * D * 2 + T * D * 2 + T * E * 4, 2 * T * E * D, true};
        k["topk"] = {T * E * 4 + T * K * 8, 0};
        // The emulated backend writes zeros; a real one reads the T·K returned rows and adds them into
        // the residual.
        k["combine_recv"] = {emulated ? T * D * 2 : T * K * D * 2 + T * D * 4, 0};
        const double active = emulated ? EL : std::min(EL, T * K);
        k["grouped_gate_up"] = {active * 2 * Ie * D + EL * (m * D + m * 2 * Ie * 2), EL * 2 * m * 2 * Ie * D};
        k["grouped_silu_quant"] = {EL * m * Ie * 5, 0};
        k["grouped_down"] = {active * D * Ie + EL * (m * Ie + m * D * 2), EL * 2 * m * D * Ie};
    }
    return k;
}

struct Timing {
    std::vector<std::string> names;
    std::vector<double> us;      // per kernel, averaged over replays (with events between kernels)
    double total_us = 0;         // the layer without events between its kernels
    double marked_total_us = 0;  // the layer with them
};

// Captures one layer step as a graph, replays it and averages: once plain (the layer's time), once
// with an event after each kernel (the breakdown; the event nodes add a little time of their own,
// so the kernels' sum exceeds the plain total). hidden is restored from `pristine` before each
// replay, outside the timed span.
// `before_launch` runs before every launch (ranks of a real EP group launch together).
Timing time_layer(CudaLayerExec& exec, const model::DeviceLayer& w, const model::LayerStep& st, uint16_t* hidden,
                  const uint16_t* pristine, size_t hidden_elems, ops::DeviceLatentCache cache, int replays,
                  cudaStream_t s, const std::function<void()>& before_launch = {}) {
    Timing t;
    const auto timed = [&](bool marked) {
        std::vector<cudaEvent_t> events;
        std::vector<std::string> names;
        const auto new_event = [&] {
            cudaEvent_t e;
            FANOUT_CUDA_CHECK(cudaEventCreate(&e));
            events.push_back(e);
            FANOUT_CUDA_CHECK(cudaEventRecordWithFlags(e, s, cudaEventRecordExternal));
        };
        const cudaGraphExec_t ge = capture_graph(s, [&] {
            FANOUT_CUDA_CHECK(cudaMemcpyAsync(hidden, pristine, hidden_elems * 2, cudaMemcpyDeviceToDevice, s));
            exec.begin_step(st);  // the step's, shared by its 61 layers: not the layer's time
            new_event();
            exec.run(w, st, hidden, cache,
                     marked ? model::KernelMark([&](const char* name) {
                         names.emplace_back(name);
                         new_event();
                     })
                            : model::KernelMark{});
            if (!marked) new_event();
        });
        std::vector<double> us(names.size(), 0.0);
        double total = 0;
        for (int r = 0; r < replays + 2; ++r) {
            if (before_launch) before_launch();
            FANOUT_CUDA_CHECK(cudaGraphLaunch(ge, s));
            FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
            if (r < 2) continue;  // warm-up
            float ms = 0;
            FANOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, events.front(), events.back()));
            total += ms * 1000.0 / replays;
            for (size_t i = 0; i < names.size(); ++i) {
                FANOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
                us[i] += ms * 1000.0 / replays;
            }
        }
        cudaGraphExecDestroy(ge);
        for (cudaEvent_t e : events) cudaEventDestroy(e);
        if (!marked) {
            t.total_us = total;
            return;
        }
        // A name marked twice is summed under one name.
        for (size_t i = 0; i < names.size(); ++i) {
            auto it = std::find(t.names.begin(), t.names.end(), names[i]);
            if (it == t.names.end()) {
                t.names.push_back(names[i]);
                t.us.push_back(us[i]);
            } else {
                t.us[it - t.names.begin()] += us[i];
            }
        }
        t.marked_total_us = total;
    };
    if (before_launch) before_launch();
    exec.begin_step(st);
    exec.run(w, st, hidden, cache);  // plans, attributes and workspaces outside the capture
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
    if (exec.expert_parallel()) exec.expert_parallel()->raise_if_failed();
    timed(false);
    timed(true);
    return t;
}

// One GPU's side of the benchmark: a cache of max_batch + decodes requests of kv_len random
// entries (block tables in order), the residual stream and its pristine copy, and the step's
// metadata.
struct Rig {
    Rig(const io::ModelConfig& c, DType kv_dtype, int max_batch, int q, int kv_len, cudaStream_t s, bool mha = false,
        int decodes = 0)
        : q(q),
          kv_len(kv_len),
          decodes(decodes),
          mha(mha),
          per_req((kv_len + kv::kDefaultBlockSize - 1) / kv::kDefaultBlockSize),
          s(s),
          cache(static_cast<size_t>((max_batch + decodes) * per_req * kv::kDefaultBlockSize) *
                static_cast<size_t>(c.kv_entry_dim())),
          hidden(static_cast<size_t>((max_batch * q + decodes) * c.hidden_size)),
          pristine(hidden.size()),
          positions(static_cast<size_t>(max_batch * q + decodes)),
          slots(positions.size()),
          query_start(static_cast<size_t>(max_batch + decodes + 1)),
          kv_start(static_cast<size_t>(max_batch + 1)),
          mha_query_start(static_cast<size_t>(max_batch + 1)),
          kv_lens(static_cast<size_t>(max_batch + decodes)),
          block_table(static_cast<size_t>((max_batch + decodes) * per_req)),
          num_tokens(1),
          table(static_cast<size_t>((max_batch + decodes) * per_req)),
          ctx(s) {
        ops::launch_random_bf16(cache.get(), cache.size(), 1.0f, 11, s);
        if (kv_dtype == DType::kFP8E4M3) {  // the same values in FP8 entries (V3's widths)
            const int64_t entries = static_cast<int64_t>(cache.size()) / c.kv_entry_dim();
            cache_fp8 = DeviceArray<uint8_t>(static_cast<size_t>(entries * ops::kMlaFp8EntryBytes));
            ops::launch_quantize_latent_fp8(cache.get(), entries, cache_fp8.get(), s);
        }
        ops::launch_random_bf16(pristine.get(), pristine.size(), 1.0f, 12, s);
        std::iota(table.begin(), table.end(), 0);
        block_table.upload(table.data(), table.size(), s);
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
    }

    // The step of `decodes` one-token requests, then `batch` requests of q tokens each, every one
    // at the end of kv_len cached positions (the scheduler's order: decodes first). With `mha`
    // the batch's chunks run the MHA form, the decodes the absorbed form.
    model::LayerStep step_for(int batch) {
        const int64_t block = kv::kDefaultBlockSize;
        const int R = decodes + batch;
        std::vector<int32_t> pos, slot, qs{0}, kl, ks{0}, mqs{0};
        for (int r = 0; r < R; ++r) {
            const int n = r < decodes ? 1 : q;
            qs.push_back(qs.back() + n);
            kl.push_back(kv_len);
            if (r >= decodes) {
                ks.push_back(ks.back() + kv_len);
                mqs.push_back(mqs.back() + q);
            }
            for (int i = 0; i < n; ++i) {
                const int p = kv_len - n + i;
                pos.push_back(p);
                slot.push_back(
                    static_cast<int32_t>(table[static_cast<size_t>(r * per_req + p / block)] * block + p % block));
            }
        }
        kv_start.upload(ks.data(), ks.size(), s);
        mha_query_start.upload(mqs.data(), mqs.size(), s);
        positions.upload(pos.data(), pos.size(), s);
        slots.upload(slot.data(), slot.size(), s);
        query_start.upload(qs.data(), qs.size(), s);
        kv_lens.upload(kl.data(), kl.size(), s);
        const int32_t T = qs.back();
        num_tokens.upload(&T, 1, s);
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));  // the uploads read these host vectors
        model::LayerStep st;
        st.T = T;
        st.num_tokens = num_tokens.get();
        st.R = R;
        st.max_q = batch > 0 ? q : 1;
        st.positions = positions.get();
        st.slots = slots.get();
        st.query_start = query_start.get();
        st.kv_len = kv_lens.get();
        st.block_table = block_table.get();
        st.max_blocks = static_cast<int>(per_req);
        if (mha && batch > 0) {
            st.prefill_ctx = batch * kv_len;
            st.mha_request = st.mha_row = decodes;
            st.mha_max_q = q;
            st.absorbed_max_q = decodes > 0 ? 1 : 0;
            st.kv_start = kv_start.get();
            st.mha_query_start = mha_query_start.get();
        }
        return st;
    }

    // The cache the layer reads: FP8 entries when the rig was made with them, else bf16.
    ops::DeviceLatentCache latent() {
        if (cache_fp8.get() != nullptr) return {nullptr, cache_fp8.get()};
        return {cache.get(), nullptr};
    }

    int q, kv_len, decodes;
    bool mha;
    int64_t per_req;
    cudaStream_t s;
    DeviceArray<uint16_t> cache, hidden, pristine;
    DeviceArray<uint8_t> cache_fp8;
    DeviceArray<int32_t> positions, slots, query_start, kv_start, mha_query_start, kv_lens, block_table, num_tokens;
    std::vector<int32_t> table;
    ops::DeviceContext ctx;  // on s: the layer's cuBLASLt, GEMM and MLA scratch
};

}  // namespace

int run_layer_bench(const LayerBenchOptions& opts) {
    require_gpu("fanout bench layer");
    FANOUT_CHECK(opts.query_len >= 1 && opts.kv_len >= opts.query_len && !opts.batches.empty(),
                 "bench layer: query_len {} and kv_len {} (>= query_len) and at least one batch", opts.query_len,
                 opts.kv_len);
    for (int ep : opts.eps)
        FANOUT_CHECK(ep >= 1 && 256 % ep == 0, "bench layer: EP {} must divide DeepSeek-V3's 256 experts", ep);
    FANOUT_CHECK(!opts.mha || (opts.query_len > 4 && opts.comm == "emulated" && !opts.microbatch),
                 "bench layer --mha: the MHA form is for prefill chunks (--query-len > 4, got {}) on the emulated "
                 "backend without --microbatch",
                 opts.query_len);
    FANOUT_CHECK(opts.decodes >= 0 && (opts.decodes == 0 || (opts.comm == "emulated" && !opts.microbatch)),
                 "bench layer --decodes {}: decode requests beside the chunks need the emulated backend without "
                 "--microbatch",
                 opts.decodes);
    cudaDeviceProp prop{};
    FANOUT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const GpuCeilings ceil = measure_gpu_ceilings();
    std::printf("%s: copy %.0f GB/s, FP8 %.0f TFLOP/s, BF16 %.0f TFLOP/s (measured ceilings)\n", prop.name,
                ceil.copy_gbs, ceil.fp8_tflops, ceil.bf16_tflops);
    const auto floor_us = [&](const Cost& k) {
        return std::max(k.bytes / (ceil.copy_gbs * 1e3),
                        k.flops / ((k.bf16 ? ceil.bf16_tflops : ceil.fp8_tflops) * 1e6));
    };

    const io::ModelConfig c = model::preset_config("full-layers", 4);
    const ops::RopeTable rope = model::rope_table(c);
    const int max_batch = *std::max_element(opts.batches.begin(), opts.batches.end());
    const int q = opts.query_len, max_T = max_batch * q + opts.decodes;
    const auto tokens = [&](int batch) { return double(batch) * q + opts.decodes; };  // of a point's step
    cudaStream_t s;
    FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const DType kv_dtype = kv_dtype_from_name(opts.kv_dtype);
    FANOUT_CHECK(kv_dtype != DType::kF32, "bench layer --kv-dtype: the GPU cache holds bf16 or fp8 entries");
    const double entry_bytes =
        static_cast<double>(ops::latent_entry_bytes(c.kv_lora_rank, c.qk_rope_head_dim, kv_dtype));
    std::printf("KV cache: %s entries, %.0f bytes per position and layer\n", opts.kv_dtype.c_str(), entry_bytes);
    Rig rig(c, kv_dtype, max_batch, q, opts.kv_len, s, opts.mha, opts.decodes);

    nlohmann::json points = nlohmann::json::array();
    const auto report = [&](const char* title, int ep, const std::vector<std::pair<int, Timing>>& rows,
                            bool emulated = true) {
        std::printf("\n%s (µs; floor = max(bytes / copy BW, FLOPs / peak) from the ceilings above)\n", title);
        std::printf("%-24s", "kernel \\ batch");
        for (const auto& [b, t] : rows) std::printf(" %8d %6s", b, "floor");
        std::printf("\n");
        for (size_t i = 0; i < rows.front().second.names.size(); ++i) {
            const std::string& name = rows.front().second.names[i];
            std::printf("%-24s", name.c_str());
            for (const auto& [b, t] : rows) {
                const int m = ep > 0 ? model::expected_tokens_per_expert(c, int64_t(tokens(b)), ep) : 0;
                const auto costs =
                    layer_costs(c, b, tokens(b), opts.kv_len, ep, m, entry_bytes, emulated, opts.decodes, opts.mha);
                const auto it = costs.find(name);
                std::printf(" %8.1f %6s", t.us[i],
                            it == costs.end() ? "" : fmt::format("{:.1f}", floor_us(it->second)).c_str());
            }
            std::printf("\n");
        }
        std::printf("%-24s", "sum (events between)");
        for (const auto& [b, t] : rows) std::printf(" %8.1f %6s", t.marked_total_us, "");
        std::printf("\n%-24s", "layer total");
        for (const auto& [b, t] : rows) std::printf(" %8.1f %6s", t.total_us, "");
        std::printf("\n");
    };

    // One JSON point: the layer at `ep` (0: dense) for `batch` requests per GPU, m tokens per local
    // expert (on average); `comm` says what dispatch and combine were, `emulated` whether the
    // emulated backend (m rows per local expert on average, emulated_ep.h) stood in for them.
    const auto add_point = [&](const Timing& t, int ep, int batch, int T, int m, int64_t local, const std::string& comm,
                               bool emulated) {
        nlohmann::json kernels, floors;
        const auto costs = layer_costs(c, batch, T, opts.kv_len, ep, m, entry_bytes, emulated, opts.decodes, opts.mha);
        double grouped = 0;  // the two grouped GEMMs (not the activation between them), as the anchors count
        for (size_t i = 0; i < t.names.size(); ++i) {
            kernels[t.names[i]] = t.us[i];
            if (auto it = costs.find(t.names[i]); it != costs.end()) floors[t.names[i]] = floor_us(it->second);
            if (t.names[i] == "grouped_gate_up" || t.names[i] == "grouped_down") grouped += t.us[i];
        }
        points.push_back({{"ep", ep},
                          {"layer", ep > 0 ? "moe" : "dense"},
                          {"tp", 1},
                          {"batch", batch},
                          {"query_len", q},
                          {"kv_len", opts.kv_len},
                          {"schedule", "no_overlap"},
                          {"attention_form", opts.mha ? "mha" : "absorbed"},
                          {"kv_dtype", opts.kv_dtype},
                          {"decodes", opts.decodes},
                          {"communication", comm},
                          {"tokens_per_expert", m},
                          {"local_experts", local},
                          {"total_us", t.total_us},
                          {"marked_total_us", t.marked_total_us},
                          {"grouped_gemm_us", grouped},
                          {"kernels", kernels},
                          {"floors_us", floors}});
    };
    // Receive rows per local expert of the emulated dispatch at EP-ep: room for the most it gives
    // one expert at the largest batch.
    const auto emulated_room = [&](int ep) {
        return anchor_count_max(model::expected_tokens_per_expert(c, max_T, ep));
    };
    const auto bench_points = [&](int ep) {
        const bool moe = ep > 0;
        const int64_t local = moe ? c.n_routed_experts / ep : 0;
        const int max_m = moe ? emulated_room(ep) : 0;
        model::DeviceLayer w = model::random_layer(c, moe, local, 100 + static_cast<uint64_t>(ep));
        model::LayerLimits lim;  // decode steps; random weights are FP8
        lim.max_tokens = max_T;
        lim.max_masked_tokens = max_T;
        lim.num_local_experts = local;
        lim.max_dispatch_m = max_m;
        if (opts.mha) lim.max_prefill_ctx = int64_t{max_batch} * opts.kv_len;
        CudaLayerExec exec(c, rope, lim, rig.ctx);
        // One rank of EP-N: the emulated backend delivers what N-way dispatch would (emulated_ep.h).
        std::unique_ptr<EmulatedEp> emu;
        if (moe) {
            comm::EpConfig ec = comm::EpConfig::for_rank(ParallelConfig{0, ep, 1}, static_cast<int>(c.n_routed_experts),
                                                         static_cast<int>(c.num_experts_per_tok),
                                                         static_cast<int>(c.hidden_size), max_T, comm::Payload::kFp8);
            ec.max_m = max_m;
            emu = std::make_unique<EmulatedEp>(ec, s);
            exec.set_expert_parallel(emu.get());
        }
        std::vector<std::pair<int, Timing>> rows;
        for (int b : opts.batches) {
            model::LayerStep st = rig.step_for(b);
            const int m = moe ? model::expected_tokens_per_expert(c, int64_t(tokens(b)), ep) : 0;
            if (moe) {
                emu->set_rows(m);
                st.expected_m = m;
            }
            Timing t = time_layer(exec, w, st, rig.hidden.get(), rig.pristine.get(),
                                  static_cast<size_t>(st.T * c.hidden_size), rig.latent(), opts.replays, s);
            add_point(t, moe ? ep : 0, b, st.T, m, local, "not included", true);
            rows.emplace_back(b, std::move(t));
        }
        const std::string mixed =
            opts.decodes > 0 ? fmt::format("; each step also {} one-token decodes ahead of the batch", opts.decodes)
                             : "";
        report(
            moe ? fmt::format("MoE layer, EP{} emulated ({} local experts, m = (batch·{} + {})·8·{}/256 tokens each on "
                              "average, each expert's in [0.7, 1.3]·m{})",
                              ep, local, q, opts.decodes, ep, mixed)
                      .c_str()
                : fmt::format("dense layer (the first 3 of V3's 61; intermediate 18432{})", mixed).c_str(),
            ep, rows);
    };
    bench_points(0);
    for (int ep : opts.eps) bench_points(ep);

    // The two-microbatch schedule on the emulated points: two execs (each its own emulated backend,
    // on the one stream) through model::run_microbatched — the GPU runner's schedule (the runner's
    // two execs share one device context, these one each: on one stream either is the same); one
    // graph per point, timed as a whole.
    if (opts.microbatch) {
        Rig rig_b(c, kv_dtype, max_batch, q, opts.kv_len, s);
        for (int ep : opts.eps) {
            const int64_t local = c.n_routed_experts / ep;
            const int max_m = emulated_room(ep);
            const model::DeviceLayer w = model::random_layer(c, true, local, 100 + static_cast<uint64_t>(ep));
            model::LayerLimits lim;
            lim.max_tokens = max_T;
            lim.max_masked_tokens = max_T;
            lim.num_local_experts = local;
            lim.max_dispatch_m = max_m;
            CudaLayerExec ea(c, rope, lim, rig.ctx), eb(c, rope, lim, rig_b.ctx);
            comm::EpConfig ec = comm::EpConfig::for_rank(ParallelConfig{0, ep, 1}, static_cast<int>(c.n_routed_experts),
                                                         static_cast<int>(c.num_experts_per_tok),
                                                         static_cast<int>(c.hidden_size), max_T, comm::Payload::kFp8);
            ec.max_m = max_m;
            EmulatedEp emu_a(ec, s), emu_b(ec, s);
            ea.set_expert_parallel(&emu_a);
            eb.set_expert_parallel(&emu_b);
            std::printf("\nMoE layer, EP%d emulated, two microbatches (µs; communication not included)\n", ep);
            std::printf("%-8s %12s %12s %8s\n", "batch", "one batch", "microbatch", "ratio");
            for (int b : opts.batches) {
                if (b < 2) continue;  // one request: the second half would be empty
                const int ba = b / 2, bb = b - ba;
                model::LayerStep st[2] = {rig.step_for(ba), rig_b.step_for(bb)};
                CudaLayerExec* ex[2] = {&ea, &eb};
                Rig* rg[2] = {&rig, &rig_b};
                EmulatedEp* emu[2] = {&emu_a, &emu_b};
                for (int i = 0; i < 2; ++i) {
                    const int m = model::expected_tokens_per_expert(c, int64_t{st[i].R} * q, ep);
                    emu[i]->set_rows(m);
                    st[i].expected_m = m;
                }
                const auto layer = [&] {
                    for (int i = 0; i < 2; ++i) {
                        FANOUT_CUDA_CHECK(cudaMemcpyAsync(rg[i]->hidden.get(), rg[i]->pristine.get(),
                                                          static_cast<size_t>(st[i].T * c.hidden_size) * 2,
                                                          cudaMemcpyDeviceToDevice, s));
                        ex[i]->begin_step(st[i]);
                    }
                    model::run_microbatched(w, {model::Microbatch{ex[0], st[0], rg[0]->hidden.get(), rg[0]->latent()},
                                                model::Microbatch{ex[1], st[1], rg[1]->hidden.get(), rg[1]->latent()}});
                };
                layer();  // plans and workspaces outside the capture
                FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
                cudaEvent_t e0, e1;
                FANOUT_CUDA_CHECK(cudaEventCreate(&e0));
                FANOUT_CUDA_CHECK(cudaEventCreate(&e1));
                const cudaGraphExec_t ge = capture_graph(s, [&] {
                    FANOUT_CUDA_CHECK(cudaEventRecordWithFlags(e0, s, cudaEventRecordExternal));
                    layer();
                    FANOUT_CUDA_CHECK(cudaEventRecordWithFlags(e1, s, cudaEventRecordExternal));
                });
                double total = 0;
                for (int r = 0; r < opts.replays + 2; ++r) {
                    FANOUT_CUDA_CHECK(cudaGraphLaunch(ge, s));
                    FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
                    float ms = 0;
                    FANOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 2) total += ms * 1000.0 / opts.replays;
                }
                cudaGraphExecDestroy(ge);
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                double whole = 0;
                for (const auto& p : points)
                    if (p["ep"] == ep && p["batch"] == b && p["schedule"] == "no_overlap") whole = p["total_us"];
                std::printf("%-8d %12.1f %12.1f %8.3f\n", b, whole, total, whole > 0 ? total / whole : 0.0);
                points.push_back({{"ep", ep},
                                  {"layer", "moe"},
                                  {"tp", 1},
                                  {"batch", b},
                                  {"query_len", q},
                                  {"kv_len", opts.kv_len},
                                  {"schedule", "microbatch"},
                                  {"communication", "not included"},
                                  {"local_experts", local},
                                  {"total_us", total},
                                  {"one_batch_us", whole}});
            }
        }
    }

    // Real dispatch and combine: EP over the visible GPUs, one rank per GPU (a thread each, one
    // NCCL communicator), every rank's step the same batch, the routing the router's own.
    if (opts.comm != "emulated") {
        const comm::GpuBackend backend = comm::gpu_backend_from_name(opts.comm);
        int count = 0;
        FANOUT_CUDA_CHECK(cudaGetDeviceCount(&count));
        const int world = opts.gpus > 0 ? opts.gpus : count;
        FANOUT_CHECK(world >= 1 && world <= count && c.n_routed_experts % world == 0,
                     "bench layer --comm {}: {} GPUs of {} visible, dividing {} experts", opts.comm, world, count,
                     c.n_routed_experts);
        const int64_t local = c.n_routed_experts / world;
        comm::LocalGpus gpus(world);
        std::vector<std::vector<std::pair<int, Timing>>> per_rank(static_cast<size_t>(world));
        const auto failures = gpus.run([&](int r) {
            cudaStream_t rs = gpus.stream(r);
            Rig rr(c, kv_dtype, max_batch, q, opts.kv_len, rs);
            const model::DeviceLayer w = model::random_layer(c, true, local, 200 + static_cast<uint64_t>(r));
            model::LayerLimits lim;
            lim.max_tokens = max_T;
            lim.max_masked_tokens = max_T;
            lim.num_local_experts = local;
            lim.max_dispatch_m = world * max_T;
            CudaLayerExec exec(c, rope, lim, rr.ctx);
            auto ep = comm::make_gpu_ep(
                backend,
                comm::EpConfig::for_rank(ParallelConfig{r, world, 1}, static_cast<int>(c.n_routed_experts),
                                         static_cast<int>(c.num_experts_per_tok), static_cast<int>(c.hidden_size),
                                         max_T, comm::Payload::kFp8),
                gpus.comm(r), rs);
            exec.set_expert_parallel(ep.get());
            for (int b : opts.batches) {
                const model::LayerStep st = rr.step_for(b);
                per_rank[static_cast<size_t>(r)].emplace_back(
                    b, time_layer(exec, w, st, rr.hidden.get(), rr.pristine.get(),
                                  static_cast<size_t>(st.T * c.hidden_size), rr.latent(), opts.replays, rs,
                                  [&] { gpus.sync(); }));
            }
        });
        for (const auto& f : failures) FANOUT_CHECK(f.empty(), "bench layer --comm {}: {}", opts.comm, f);
        for (size_t i = 0; i < per_rank[0].size(); ++i) {
            const auto& [b, t] = per_rank[0][i];
            double slowest = 0;
            for (const auto& rank : per_rank) slowest = std::max(slowest, rank[i].second.total_us);
            const int m = model::expected_tokens_per_expert(c, int64_t{b} * q, world);
            add_point(t, world, b, b * q, m, local, comm::gpu_backend_name(backend), false);
            points.back()["slowest_rank_total_us"] = slowest;
        }
        report(fmt::format("MoE layer, EP{} with {} dispatch and combine across {} GPU(s) ({} local experts; rank 0)",
                           world, comm::gpu_backend_name(backend), world, local)
                   .c_str(),
               world, per_rank[0], false);
    }

    // The EP8 point beside the seed and the targets (the one-batch points: the
    // microbatch ones carry no per-kernel split).
    const auto one_batch = [](const nlohmann::json& p) { return p.value("schedule", "") != "microbatch"; };
    for (const auto& p : points)
        if (p["ep"] == 8 && p["batch"] == 128 && one_batch(p)) {
            std::printf(
                "\nEP8, batch 128, query 2, KV 5000 (no communication): layer %.0f µs (target <= %.0f; seed's "
                "H100 layer with communication %.0f), grouped GEMM %.0f µs (target <= %.0f; seed %.0f)\n",
                p["total_us"].get<double>(), kTargetLayerEp8Us, kSeedEp8LayerUs, p["grouped_gemm_us"].get<double>(),
                kTargetGroupedEp8Us, kSeedGroupGemmUs[0][1]);
        }
    for (const auto& p : points)
        if (p["ep"] == 128 && p["batch"] == 128 && one_batch(p))
            std::printf("EP128, batch 128: grouped GEMM %.0f µs (seed %.0f)\n", p["grouped_gemm_us"].get<double>(),
                        kSeedGroupGemmUs[1][1]);
    nlohmann::json out = {{"benchmark", "layer"},
                          {"gpu", prop.name},
                          {"copy_gbs", ceil.copy_gbs},
                          {"fp8_tflops", ceil.fp8_tflops},
                          {"bf16_tflops", ceil.bf16_tflops},
                          {"anchors",
                           {{"seed_ep8_layer_us_h100_with_comm", kSeedEp8LayerUs},
                            {"seed_group_gemm_us_h100", {{"ep8", 555}, {"ep128", 270}}},
                            {"target_grouped_ep8_us", kTargetGroupedEp8Us},
                            {"target_layer_ep8_us", kTargetLayerEp8Us}}},
                          {"points", points}};
    if (!opts.json_out.empty()) {
        std::ofstream(opts.json_out) << out.dump(2) << "\n";
        std::printf("wrote %s\n", opts.json_out.c_str());
    }
    cudaStreamDestroy(s);
    return 0;
}

}  // namespace fanout::bench
