// Tensor-parallel attention's collectives (issue 18 part 3): the tp ranks of one DP group split
// the attention heads; after o_proj each rank holds a partial sum over its heads, and the MoE half
// of the layer runs on a slice of the tokens per rank (rank r's rows [T·r/tp, T·(r+1)/tp)), whose
// results every rank needs again for the next layer's attention.
//
// `local` (threads of one process) and `mpi` (processes, mpi_ep.h's make_mpi_tp) on the CPU path;
// on GPUs these will be NCCL's all-reduce / all-gather on the DP group's communicator.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fanout/comm/thread_barrier.h"

namespace fanout::comm {

class TensorParallel {
  public:
    virtual ~TensorParallel() = default;
    virtual int rank() const = 0;  // in the TP group
    virtual int size() const = 0;
    // data[0, n) summed over the group's ranks in rank order, on every rank (the same bits everywhere).
    virtual void all_reduce_sum(float* data, int64_t n) = 0;
    // out [Σ rows, width]: every rank's `rows` rows of `mine`, in rank order, on every rank.
    virtual void all_gather_rows(const float* mine, int64_t rows, int64_t width, float* out) = 0;
};

// Rank r's slice of T tokens for the MoE half: [T·r/tp, T·(r+1)/tp).
inline int64_t tp_slice_begin(int64_t T, int r, int tp) { return T * r / tp; }

// The TP group as threads: tp endpoints over shared memory, halves synchronized by a barrier.
class LocalTpGroup {
  public:
    explicit LocalTpGroup(int tp, std::chrono::milliseconds timeout = std::chrono::minutes(10));
    // Rank r's endpoint; the group must outlive it.
    std::unique_ptr<TensorParallel> endpoint(int rank);
    // Every wait from now on throws fanout::Error("TP local: " + reason).
    void abort(const std::string& reason) { barrier_.abort(reason); }

  private:
    friend class LocalTpEndpoint;
    struct Slot {
        const float* data = nullptr;
        int64_t n = 0;  // floats (all-reduce) or rows (all-gather)
    };
    ThreadBarrier barrier_;
    std::vector<Slot> slots_;  // [rank], written by that rank only, between barriers
};

}  // namespace fanout::comm
