// Memory feasibility per GPU for a DeepSeek-V3 deployment (issue 8): the FP8 checkpoint's weights
// as EP and TP place them, the latent KV cache per token of 61 layers × one entry (bf16: 576 values,
// 1,152 bytes, 70,272 per token; FP8: ops::MlaFp8Layout's 656 bytes, 40,016 per token), and a
// reserve for the CUDA context, activations and EP buffers.
//
// Placement (the seed's): each GPU holds 256/EP routed experts of every MoE layer (and of the MTP
// layer) and a copy of the shared experts; attention runs data-parallel, TP-sharding q_b, kv_b
// and o_proj by heads while the latent projections (q_a, kv_a) and the KV cache are replicated
// on each TP rank; the 3 dense layers' MLPs, embeddings and LM head are sharded by TP.
#pragma once

#include "fanout/core/dtype.h"
#include "fanout/plan/hardware.h"

namespace fanout::plan {

struct MemoryPlan {
    double weights;  // bytes per GPU
    double kv_per_request;
    double kv;       // bytes per GPU for the requests it serves
    double reserve;  // context, activations, communication buffers
    double total() const { return weights + kv + reserve; }
};

constexpr double kReserveBytes = 6e9;  // CUDA context + activations + EP buffers (an estimate)

// Bytes of one layer's latent KV entry stored as `kv_dtype` (kBF16 or kFP8E4M3; the planner
// models GPU deployments), and of one token's over the 61 layers. Throws for another dtype.
double kv_entry_bytes(DType kv_dtype);
double kv_bytes_per_token(DType kv_dtype);

// `requests_per_gpu` requests of `kv_len` tokens each, on a GPU of an EP group of `ep` with
// attention TP `tp` (a TP group serves tp × requests_per_gpu requests and each rank stores the
// whole latent KV of them), the cache's entries stored as `kv_dtype`.
MemoryPlan plan_memory(int ep, int tp, int requests_per_gpu, int kv_len, DType kv_dtype = DType::kBF16);

// The most requests per GPU that fit `hw` (0 when the weights alone do not).
int max_requests_per_gpu(const Hardware& hw, int ep, int tp, int kv_len, DType kv_dtype = DType::kBF16);

// The same per engine instance (DP group): `batch` requests of an instance whose `tp` ranks each
// store the whole latent KV of them (the cost model's unit, cost_model.h).
MemoryPlan plan_memory_instance(int ep, int tp, double batch, int kv_len, DType kv_dtype = DType::kBF16);
int max_batch_per_instance(const Hardware& hw, int ep, int tp, int kv_len, DType kv_dtype = DType::kBF16);

}  // namespace fanout::plan
