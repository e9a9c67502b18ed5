#include "fanout/comm/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "fanout/core/error.h"

namespace fanout::comm {

class LocalTpEndpoint : public TensorParallel {
  public:
    LocalTpEndpoint(LocalTpGroup& g, int rank) : g_(g), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return g_.barrier_.size(); }

    void all_reduce_sum(float* data, int64_t n) override {
        g_.slots_[static_cast<size_t>(rank_)] = {data, n};
        g_.barrier_.arrive_and_wait(rank_, "all-reduce");
        std::vector<float> sum(static_cast<size_t>(n), 0.0f);
        for (int r = 0; r < size(); ++r) {
            const LocalTpGroup::Slot& s = g_.slots_[static_cast<size_t>(r)];
            FANOUT_CHECK(s.n == n, "TP local: all-reduce of {} values on rank {}, {} on rank {}", n, rank_, s.n, r);
            for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += s.data[i];
        }
        g_.barrier_.arrive_and_wait(rank_, "all-reduce (read)");  // every rank read every input
        std::copy(sum.begin(), sum.end(), data);
    }

    void all_gather_rows(const float* mine, int64_t rows, int64_t width, float* out) override {
        g_.slots_[static_cast<size_t>(rank_)] = {mine, rows};
        g_.barrier_.arrive_and_wait(rank_, "all-gather");
        int64_t at = 0;
        for (int r = 0; r < size(); ++r) {
            const LocalTpGroup::Slot& s = g_.slots_[static_cast<size_t>(r)];
            if (s.n > 0) std::memcpy(out + at * width, s.data, static_cast<size_t>(s.n * width) * sizeof(float));
            at += s.n;
        }
        g_.barrier_.arrive_and_wait(rank_, "all-gather (read)");  // the inputs may change after this
    }

  private:
    LocalTpGroup& g_;
    int rank_;
};

LocalTpGroup::LocalTpGroup(int tp, std::chrono::milliseconds timeout)
    : barrier_(tp, timeout, "TP local"), slots_(static_cast<size_t>(std::max(tp, 0))) {
    FANOUT_CHECK(tp >= 1, "TP group: {} ranks", tp);
}

std::unique_ptr<TensorParallel> LocalTpGroup::endpoint(int rank) {
    FANOUT_CHECK(rank >= 0 && rank < barrier_.size(), "TP local: rank {} outside [0, {})", rank, barrier_.size());
    return std::make_unique<LocalTpEndpoint>(*this, rank);
}

}  // namespace fanout::comm
