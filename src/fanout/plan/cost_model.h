// The planner's cost model (issue 8): one decode step of DeepSeek-V3 on one GPU of an
// (EP, DP, TP) deployment, built kernel by kernel from the seed's 5-stage layer.
//
//   stage 1  input norm, qkv_a, q_a norm, latent norms + RoPE + KV append, q_b, q-absorb BMM
//   stage 2  MLA attention, v BMM, o_proj, (TP reduce-scatter), post norm, router gate + top-k
//   stage 3  permute (FP8 quant + layout), dispatch send, shared expert
//   stage 4  dispatch recv, grouped gate/up, silu·mul·quant, grouped down, combine send
//   stage 5  combine recv, unpermute (weighted sum of the copies), (TP all-gather)
//
// Units: a "batch" is the requests of one engine instance (one DP group of `tp` GPUs), as in the
// seed's "EP8 DP1 TP8 batch 1: the whole batch has 2 tokens"; at TP1 it is the batch per GPU.
// Every TP rank computes the replicated latent (qkv_a, KV) for the whole batch and 1/tp of the
// heads; after o_proj the instance's tokens are split over its tp ranks for the MoE part (each
// rank gates, runs the shared expert and dispatches batch·query/tp tokens) and all-gathered after
// combine. Routing is modelled as uniform: expert e gets λ = global tokens × 8 / 256 tokens on
// average, a GPU's experts are active with probability 1 − e^−λ, and a token's 8 copies go to
// other GPUs in proportion (8 per token, no per-rank deduplication, as the seed's m formula).
// Times are the mean GPU's (routing imbalance is not modelled).
#pragma once

#include <string>
#include <vector>

#include "fanout/plan/efficiency.h"
#include "fanout/plan/hardware.h"
#include "fanout/plan/memory.h"

namespace fanout::plan {

enum class Schedule { kNoOverlap, kDispatchOverlap, kMicroBatch };
const char* schedule_name(Schedule s);  // "no_overlap", "dispatch_overlap", "microbatch"
Schedule parse_schedule(const std::string& name);

enum class AttentionForm { kAuto, kAbsorbed, kMha };

struct Deployment {
    int ep = 8;
    int tp = 1;
    int batch = 1;         // requests per engine instance (DP group)
    int kv_len = 5000;     // context tokens per request
    int draft_tokens = 1;  // MTP draft tokens per step: query length = 1 + draft_tokens
    double acceptance = 0.6;
    Schedule schedule = Schedule::kDispatchOverlap;
    // How attention runs: as the GPU runner picks (kAuto: the MHA form for prefill chunks — more
    // than 4 query tokens — whose contexts fit its 16,384-key buffers, else the absorbed form),
    // or the form a benchmark ran.
    AttentionForm attention = AttentionForm::kAuto;
    // The KV cache's entries: kBF16 or kFP8E4M3 (memory.h's sizes; the FP8 cache's attention runs
    // at Profile::attention_fp8_curve where calibrated).
    DType kv_dtype = DType::kBF16;

    int query_len() const { return 1 + draft_tokens; }
    bool mha_form() const;
    int dp() const { return ep / tp; }
};

// Throws fanout::Error naming the bad field (EP not dividing 256, TP not in 1/2/4/8 or above EP or
// the node, batch < 1, microbatch with batch < 2, acceptance outside [0, 1], ...).
void validate(const Deployment& d, const Hardware& hw);

struct KernelCost {
    std::string name;
    int stage = 0;     // 1..5 as above; 0 for per-step kernels outside the layers
    std::string kind;  // gemm, grouped, attention, elementwise, comm
    double bytes = 0, flops = 0;
    double us = 0;
};

// The kernels of one MoE layer (or, with `dense`, one of the 3 dense layers) for `batch`
// requests per instance (fractional for a microbatch half).
std::vector<KernelCost> layer_kernels(const Deployment& d, const Hardware& hw, const Profile& prof, double batch,
                                      bool dense = false);

// The layer's kernels without its communication (dispatch, combine, TP collectives), one after
// another: what `fanout bench layer` measures when a point says "communication": "not included".
// Under the microbatch schedule, both halves' kernels (batch / 2 each): with nothing to hide,
// the split's cost alone.
double layer_compute_us(const Deployment& d, const Hardware& hw, const Profile& prof, bool dense = false);

// One MoE layer under the deployment's schedule, with the seed's breakdown columns.
struct LayerTime {
    double total_us = 0;
    double dispatch_us = 0;  // exposed (not hidden behind compute) under the schedule
    double combine_us = 0;
    double grouped_gemm_us = 0;  // both grouped GEMMs (two halves under microbatch)
    double gemm_us = 0;          // dense GEMMs and BMMs
    double attention_us = 0;
    std::vector<KernelCost> kernels;  // full batch (for microbatch: one half, run twice)
};
LayerTime moe_layer_time(const Deployment& d, const Hardware& hw, const Profile& prof);

struct Prediction {
    Deployment d;
    std::string hardware;
    double moe_layer_us = 0, dense_layer_us = 0, mtp_us = 0, head_us = 0, step_us = 0;
    double tokens_per_step = 0;  // 1 + a + a² + … (each draft accepted given the ones before)
    double speed = 0;            // output tok/s per request
    double throughput_gpu = 0;   // output tok/s per GPU
    double throughput_node = 0;  // output tok/s per machine (gpus_per_node GPUs)
    MemoryPlan memory;
    double memory_total = 0;  // bytes per GPU
    int max_batch = 0;        // requests per instance that fit
    bool fits = false;
};
Prediction predict(const Deployment& d, const Hardware& hw, const Profile& prof);

}  // namespace fanout::plan
