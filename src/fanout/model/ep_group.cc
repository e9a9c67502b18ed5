#include "fanout/model/ep_group.h"

namespace fanout::model {

EpThreadGroup::EpThreadGroup(std::vector<std::unique_ptr<DeepseekV3>> models, int64_t max_tokens,
                             const ForwardOptions& opts, int threads)
    : models_(std::move(models)), opts_(opts), threads_(std::max(threads, 1)) {
    FANOUT_CHECK(!models_.empty(), "EP group: no ranks");
    const int ep = size();
    fabric_ = std::make_unique<comm::LocalFabric>(models_[0]->ep_config(ParallelConfig{0, ep, 1}, max_tokens));
    microbatch_fabric_ =
        std::make_unique<comm::LocalFabric>(models_[0]->ep_config(ParallelConfig{0, ep, 1}, max_tokens));
    for (int r = 0; r < ep; ++r) {
        endpoints_.push_back(fabric_->endpoint(r));
        microbatch_endpoints_.push_back(microbatch_fabric_->endpoint(r));
    }
    tp_ = models_[0]->weights().parallel.tp;
    for (int r = 0; r < ep; ++r)
        FANOUT_CHECK(models_[r]->weights().parallel.rank == r && models_[r]->weights().parallel.tp == tp_,
                     "EP group: model {} was loaded as rank {} with tp {} (expected rank {}, tp {})", r,
                     models_[r]->weights().parallel.rank, models_[r]->weights().parallel.tp, r, tp_);
    if (tp_ > 1) {
        for (int d = 0; d < ep / tp_; ++d) tp_groups_.push_back(std::make_unique<comm::LocalTpGroup>(tp_));
        for (int r = 0; r < ep; ++r) tp_endpoints_.push_back(tp_groups_[r / tp_]->endpoint(r % tp_));
    }
    pool_ = std::make_unique<ThreadPool>(threads_);
    for (int r = 1; r < ep; ++r) followers_.emplace_back([this, r] { follow(r); });
}

EpThreadGroup::~EpThreadGroup() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : followers_) t.join();
}

void EpThreadGroup::fail(int rank, const std::string& what) {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) return;
    failure_ = fmt::format("EP rank {} of {} failed: {}", rank, size(), what);
    fabric_->abort(failure_);
    microbatch_fabric_->abort(failure_);
    for (auto& g : tp_groups_) g->abort(failure_);
}

void EpThreadGroup::follow(int rank) {
    DeepseekV3& m = *models_[static_cast<size_t>(rank)];
    std::unique_ptr<kv::PagedKvCache> cache = std::make_unique<kv::PagedKvCache>(m.kv_cache_config(1));
    ThreadPool pool(threads_);
    ForwardOptions o = opts_;
    o.ep = endpoints_[static_cast<size_t>(rank)].get();
    o.microbatch_ep = microbatch_endpoints_[static_cast<size_t>(rank)].get();
    if (tp_ > 1) o.tp = tp_endpoints_[static_cast<size_t>(rank)].get();
    const bool runs_lead_step = rank < tp_;  // rank 0's TP group: its step; the others an empty one
    int64_t done = 0;
    for (;;) {
        StepBatch step = StepBatchBuilder(*cache).build();
        {
            std::unique_lock lock(mutex_);
            cv_.wait(lock, [&] { return stopping_ || steps_ > done || !failure_.empty(); });
            if (stopping_ || !failure_.empty()) return;
            // Rank 0 cannot start the next step before this one's exchanges, which need this rank.
            const bool microbatch = microbatch_;
            if (runs_lead_step) {
                step = batch_;
                if (cache->config() != cache_config_) cache = std::make_unique<kv::PagedKvCache>(cache_config_);
            }
            step.microbatch = microbatch;
        }
        ++done;
        try {
            m.forward(step, *cache, o, Stream{&pool});
        } catch (const std::exception& e) {
            fail(rank, e.what());
            return;
        }
    }
}

DeepseekV3::Output EpThreadGroup::forward(const StepBatch& batch, kv::PagedKvCache& cache) {
    {
        std::lock_guard lock(mutex_);
        FANOUT_CHECK(failure_.empty(), "{}", failure_);
        ++steps_;
        microbatch_ = batch.microbatch;
        if (tp_ > 1) {
            batch_ = batch;
            cache_config_ = cache.config();
        }
    }
    cv_.notify_all();
    ForwardOptions o = opts_;
    o.ep = endpoints_[0].get();
    o.microbatch_ep = microbatch_endpoints_[0].get();
    if (tp_ > 1) o.tp = tp_endpoints_[0].get();
    try {
        return models_[0]->forward(batch, cache, o, Stream{pool_.get()});
    } catch (const std::exception& e) {
        fail(0, e.what());
        std::lock_guard lock(mutex_);
        throw Error(failure_);
    }
}

}  // namespace fanout::model
