// Expert-parallel ranks as threads of one process (the CPU path's `--ep N`): N models, each
// holding its block of routed experts (core/parallel.h), joined by the `local` EP backend (two
// fabrics: the second microbatch's exchanges have their own). Rank 0 is driven by the caller — its
// forward() is a step of the group — while ranks 1..N-1 follow on their own threads with an empty
// step each time (microbatched when rank 0's is), serving their experts in every MoE layer's
// dispatch and combine. Models loaded with tp > 1 form TP groups of consecutive ranks (threads'
// TP groups): rank 0's — ranks 0..tp-1 — all run rank 0's step, each with its own copy of its
// cache (same geometry); the others' run empty steps together. The first failure on any rank stops the group
// (LocalFabric::abort): the call in progress and every later one throw an Error naming the rank — never a hang.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fanout/comm/local_ep.h"
#include "fanout/comm/tensor_parallel.h"
#include "fanout/model/deepseek_v3.h"

namespace fanout::model {

class EpThreadGroup {
  public:
    // models[r] loaded with ParallelConfig{r, models.size()}; steps of up to max_tokens tokens on
    // rank 0; `opts` (fp8 mode, attention form) for every rank; `threads` CPU threads per rank.
    EpThreadGroup(std::vector<std::unique_ptr<DeepseekV3>> models, int64_t max_tokens, const ForwardOptions& opts,
                  int threads);
    ~EpThreadGroup();
    EpThreadGroup(const EpThreadGroup&) = delete;
    EpThreadGroup& operator=(const EpThreadGroup&) = delete;

    int size() const { return static_cast<int>(models_.size()); }
    const DeepseekV3& lead() const { return *models_[0]; }
    // One step of the group: rank 0 runs `batch` on `cache` (its own), the others empty steps.
    DeepseekV3::Output forward(const StepBatch& batch, kv::PagedKvCache& cache);

  private:
    void follow(int rank);
    void fail(int rank, const std::string& what);

    std::vector<std::unique_ptr<DeepseekV3>> models_;
    ForwardOptions opts_;
    std::unique_ptr<comm::LocalFabric> fabric_, microbatch_fabric_;
    std::vector<std::unique_ptr<comm::ExpertParallel>> endpoints_, microbatch_endpoints_;
    std::vector<std::unique_ptr<comm::LocalTpGroup>> tp_groups_;       // one per DP group (tp > 1)
    std::vector<std::unique_ptr<comm::TensorParallel>> tp_endpoints_;  // per rank (tp > 1)
    int tp_ = 1;
    StepBatch batch_;                 // rank 0's latest step, which its TP group's ranks run too
    kv::KvCacheConfig cache_config_;  // rank 0's cache geometry, for its TP group's copies
    std::unique_ptr<ThreadPool> pool_;
    std::mutex mutex_;
    std::condition_variable cv_;
    int64_t steps_ = 0;        // steps rank 0 has started
    bool microbatch_ = false;  // whether the latest of them runs as two microbatches
    bool stopping_ = false;
    std::string failure_;
    int threads_ = 1;
    std::vector<std::thread> followers_;
};

}  // namespace fanout::model
