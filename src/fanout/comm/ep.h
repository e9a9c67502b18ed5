// Expert-parallel dispatch / combine: the interface every backend implements (issue 7).
//
// An EP group of `world` ranks shares `num_experts` experts, rank r holding the contiguous block
// [r·E/world, (r+1)·E/world). Each step, every rank dispatches its tokens (T ≤ max_tokens_per_rank,
// T may be 0) to the ranks that hold their top-k experts, runs its local experts on what it
// received, and combines: each expert output goes back to its token's rank, which adds the k of
// them weighted by the routing weights, in the token's original order.
//
// The four halves are separate calls so that work can run between send and recv (the seed's
// dispatch overlap and microbatch schedules need exactly this):
//   dispatch_send → [shared expert] → dispatch_recv → experts on recv_batch() → combine_send →
//   [other work] → combine_recv (or combine_recv_add: the sum added into the residual).
// Every rank makes the same calls in the same order; a rank with no tokens still takes part.
//
// Memory: all pointers are in the backend's memory space (host for `local` and `mpi`, device for
// the GPU backends), and so is the token count, so GPU backends never synchronize with the host
// and can be captured in a CUDA graph. Receive and return buffers are allocated once, for the
// configured maximum. The receive side is the masked layout of the grouped GEMM
// (`launch_grouped_gemm_fp8_masked`): per local expert a count and `max_m` rows, rows in
// (source rank, token, choice) order. Rows beyond max_m are dropped (and contribute nothing to
// the combine); with max_m = world · max_tokens_per_rank (the default) nothing can be dropped,
// and then a GPU backend may deliver an expert's rows in any order (the nvlink backend: arrival
// order, which saves the ranks a round trip) — each row's expert output does not depend on its
// place, so results do not either.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fanout/core/parallel.h"

namespace fanout::comm {

// What dispatch carries: e4m3 + 1×128 scales, bf16, or f32 — the CPU model's exact path (host
// backends only), with f32 expert outputs and combined rows too.
enum class Payload { kFp8, kBf16, kF32 };

struct EpConfig {
    int rank = 0;
    int world = 1;
    int num_experts = 0;
    int experts_per_token = 0;  // top-k
    int hidden = 0;
    int max_tokens_per_rank = 0;
    Payload payload = Payload::kFp8;
    int max_m = 0;  // receive rows per local expert; 0: world · max_tokens_per_rank

    // The deployment's split (core/parallel.h): the one definition of each rank's experts.
    ParallelConfig parallel() const { return {rank, world, 1}; }
    int local_experts() const { return static_cast<int>(parallel().experts(num_experts).size()); }
    int expert_begin() const { return static_cast<int>(parallel().experts(num_experts).begin); }
    // The EP group of the deployment `p` for a model's routing and widths.
    static EpConfig for_rank(const ParallelConfig& p, int num_experts, int experts_per_token, int hidden,
                             int max_tokens_per_rank, Payload payload) {
        EpConfig c;
        c.rank = p.rank;
        c.world = p.world();
        c.num_experts = num_experts;
        c.experts_per_token = experts_per_token;
        c.hidden = hidden;
        c.max_tokens_per_rank = max_tokens_per_rank;
        c.payload = payload;
        return c;
    }
    int rows_per_expert() const { return max_m > 0 ? max_m : world * max_tokens_per_rank; }
    // Whether a step can drop rows: fewer receive rows per expert than every rank's tokens. When it
    // cannot (the default), a GPU backend may deliver an expert's rows in any order (see the top).
    bool rows_droppable() const { return int64_t{rows_per_expert()} < int64_t{world} * max_tokens_per_rank; }
    int scale_blocks() const { return (hidden + 127) / 128; }
    int payload_bytes() const {
        return payload == Payload::kFp8 ? hidden : payload == Payload::kBf16 ? 2 * hidden : 4 * hidden;
    }
    // Bytes of one value of an expert output and of the combined rows: f32 with the f32 payload,
    // else bf16.
    int output_bytes() const { return payload == Payload::kF32 ? 4 : 2; }
};

// Throws fanout::Error naming the first bad field (world ≥ 1, 0 ≤ rank < world, experts divisible
// by world, 1 ≤ top-k ≤ experts, hidden ≥ 1, max tokens ≥ 1).
void validate(const EpConfig& c);

// This rank's tokens for one step.
struct DispatchInput {
    const int32_t* num_tokens;  // T, in backend memory
    const void* tokens;         // [T, hidden] e4m3 bytes or bf16
    const float* scales;        // [T, ceil(hidden/128)], fp8 payload only
    const int32_t* topk_idx;    // [T, top_k], expert ids in [0, num_experts)
};

// The receive buffers, owned by the backend (valid for its lifetime).
struct ExpertBatch {
    const int32_t* counts;  // [local_experts]: rows received per expert (may exceed max_m)
    const void* tokens;     // [local_experts, max_m, hidden] e4m3 or bf16
    const float* scales;    // [local_experts, max_m, ceil(hidden/128)], fp8 payload only
    int max_m;
};

class ExpertParallel {
  public:
    virtual ~ExpertParallel() = default;
    virtual const EpConfig& config() const = 0;

    virtual void dispatch_send(const DispatchInput& in) = 0;
    // After it returns, recv_batch() holds this rank's expert inputs for the step.
    virtual void dispatch_recv() = 0;
    virtual ExpertBatch recv_batch() const = 0;
    // expert_out: [local_experts, max_m, hidden] of output values (bf16, or f32 with the f32
    // payload: output_bytes()), row for row the outputs of recv_batch().
    virtual void combine_send(const void* expert_out) = 0;
    // out[t] = Σ_k topk_weight[t, k] · (expert output for token t's k-th choice) summed in f32 in
    // choice order, [T, hidden] of output values, for this rank's T tokens of the step (the
    // dispatch input's order).
    virtual void combine_recv(const float* topk_weight, void* out) = 0;
    // residual[t] (bf16 [T, hidden]) += the same sum: the combine and the residual add in one pass,
    // accumulated in f32 from the residual's value in choice order and rounded once — the local
    // un-permute's arithmetic. The GPU backends' (the GPU layer's combine); the host backends hand
    // back outputs for the CPU model's own add, and throw here.
    virtual void combine_recv_add(const float* topk_weight, void* residual);
    // GPU backends: after the caller synchronized the stream, throws fanout::Error if a device-side
    // wait timed out (naming the peer and the phase). Host backends fail inside the calls instead.
    virtual void raise_if_failed() {}
    // GPU backends: the stream (a cudaStream_t) every call enqueues on, which the caller's kernels
    // around the calls must share (the dispatch reads the top-k the caller just wrote); nullptr for
    // host backends.
    virtual void* device_stream() const { return nullptr; }
};

}  // namespace fanout::comm
