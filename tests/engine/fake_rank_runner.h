// A fake model for data-parallel group tests (dp_group_test.cc in threads, dp_mpi_test.cc under
// mpirun): next token = (7 * last + position + 3) mod 50 as a one-hot logit, with each rank's
// forward count kept to check lockstep, and a fault to inject.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "fanout/engine/engine.h"

namespace fanout::engine::testing {

// What every fake rank shares: forwards per rank (lockstep means they never differ by more than
// one), and a fault to inject.
struct Shared {
    std::vector<std::atomic<int64_t>> forwards;
    std::atomic<int64_t> skew{0};  // the largest difference seen
    int fail_rank = -1;            // this rank's forward throws at its fail_at-th call
    int64_t fail_at = 0;
    int hang_rank = -1;  // this rank's forward sleeps hang_ms at its fail_at-th call
    int hang_ms = 0;
    std::atomic<int> step_us{200};  // every forward sleeps this long (the others catch up if they can)
    explicit Shared(int world) : forwards(static_cast<size_t>(world)) {}
};

// Next token = (7 * last + position + 3) mod V, as a one-hot logit (engine_test.cc's rule).
class FakeRankRunner : public ModelRunner {
  public:
    static constexpr int64_t kVocab = 50;
    FakeRankRunner(Shared& shared, int rank) : shared_(shared), rank_(rank) {}
    int64_t vocab_size() const override { return kVocab; }
    int64_t max_context() const override { return 4096; }
    std::vector<int64_t> eos_ids() const override { return {49}; }
    kv::KvCacheConfig kv_cache_config(int64_t num_blocks) const override { return {1, 1, 4, num_blocks, DType::kF32}; }
    Tensor forward(const model::StepBatch& b, kv::PagedKvCache&) override {
        const int64_t n = ++shared_.forwards[rank_];
        for (const auto& f : shared_.forwards) {
            const int64_t d = std::abs(n - f.load());
            int64_t seen = shared_.skew.load();
            while (d > seen && !shared_.skew.compare_exchange_weak(seen, d)) {
            }
        }
        if (rank_ == shared_.fail_rank && n == shared_.fail_at) throw Error("injected failure");
        if (rank_ == shared_.hang_rank && n == shared_.fail_at)
            std::this_thread::sleep_for(std::chrono::milliseconds(shared_.hang_ms));
        std::this_thread::sleep_for(std::chrono::microseconds(shared_.step_us.load()));
        Tensor logits = Tensor::zeros({static_cast<int64_t>(b.logit_rows.size()), kVocab}, DType::kF32);
        for (size_t i = 0; i < b.logit_rows.size(); ++i) {
            const int32_t r = b.logit_rows[i];
            logits.data_as<float>()[i * kVocab + next(b.tokens[r], b.positions[r])] = 1.0f;
        }
        return logits;
    }
    static int32_t next(int32_t last, int64_t pos) { return static_cast<int32_t>((7 * last + pos + 3) % kVocab); }

  private:
    Shared& shared_;
    int rank_;
};

inline std::vector<int32_t> expected(const std::vector<int32_t>& prompt, int64_t max_tokens) {
    std::vector<int32_t> out;
    int32_t last = prompt.back();
    for (int64_t pos = static_cast<int64_t>(prompt.size()) - 1; static_cast<int64_t>(out.size()) < max_tokens; ++pos)
        out.push_back(last = FakeRankRunner::next(last, pos));
    return out;
}

inline RequestParams request(int i, int64_t max_tokens) {
    RequestParams p;
    for (int k = 0; k < 3 + i % 7; ++k) p.prompt.push_back((i * 13 + k) % 49);
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    return p;
}

}  // namespace fanout::engine::testing
