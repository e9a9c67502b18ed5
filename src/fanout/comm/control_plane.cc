#include "fanout/comm/control_plane.h"

#include "fanout/core/error.h"

namespace fanout::comm {

class LocalControl final : public ControlPlane {
  public:
    LocalControl(LocalControlHub& hub, int rank) : hub_(hub), rank_(rank) {}
    int rank() const override { return rank_; }
    int world() const override { return hub_.world_; }
    std::vector<uint8_t> broadcast(std::vector<uint8_t> message) override {
        return hub_.broadcast(rank_, std::move(message));
    }
    std::vector<std::vector<uint8_t>> gather(std::vector<uint8_t> message) override {
        return hub_.gather(rank_, std::move(message));
    }
    void abort(const std::string& reason) override { hub_.abort(reason); }
    std::string abort_reason() const override { return hub_.abort_reason(); }

  private:
    LocalControlHub& hub_;
    int rank_;
};

LocalControlHub::LocalControlHub(int world, std::chrono::milliseconds timeout,
                                 std::function<void(const std::string&)> on_abort)
    : world_(world),
      timeout_(timeout),
      on_abort_(std::move(on_abort)),
      received_(static_cast<size_t>(world), 0),
      reports_(static_cast<size_t>(world)),
      reported_(static_cast<size_t>(world), 0) {
    FANOUT_CHECK(world >= 1, "control plane: world must be >= 1, got {}", world);
}

LocalControlHub::~LocalControlHub() = default;

std::unique_ptr<ControlPlane> LocalControlHub::endpoint(int rank) {
    FANOUT_CHECK(rank >= 0 && rank < world_, "control plane: rank {} outside [0, {})", rank, world_);
    return std::make_unique<LocalControl>(*this, rank);
}

void LocalControlHub::abort(const std::string& reason) {
    std::function<void(const std::string&)> hook;
    {
        std::lock_guard lock(mutex_);
        if (!abort_reason_.empty()) return;
        abort_reason_ = reason.empty() ? std::string("aborted") : reason;
        hook = on_abort_;
    }
    cv_.notify_all();
    if (hook) hook(reason);
}

std::string LocalControlHub::abort_reason() const {
    std::lock_guard lock(mutex_);
    return abort_reason_;
}

std::vector<uint8_t> LocalControlHub::broadcast(int rank, std::vector<uint8_t> message) {
    std::unique_lock lock(mutex_);
    FANOUT_CHECK(abort_reason_.empty(), "{}", abort_reason_);
    if (rank == 0) {
        // The previous message must have been taken by every rank: they take one per step.
        const bool taken = cv_.wait_for(lock, timeout_, [&] {
            if (!abort_reason_.empty()) return true;
            for (int r = 1; r < world_; ++r)
                if (received_[r] < broadcasts_) return false;
            return true;
        });
        FANOUT_CHECK(abort_reason_.empty(), "{}", abort_reason_);
        FANOUT_CHECK(taken, "control plane: a rank did not take step {}'s message within {} ms", broadcasts_,
                     timeout_.count());
        message_ = std::move(message);
        ++broadcasts_;
        received_[0] = broadcasts_;
        cv_.notify_all();
        return message_;
    }
    // Idle ranks wait here for as long as rank 0 has nothing to run.
    cv_.wait(lock, [&] { return !abort_reason_.empty() || broadcasts_ > received_[rank]; });
    FANOUT_CHECK(abort_reason_.empty(), "{}", abort_reason_);
    ++received_[rank];
    std::vector<uint8_t> out = message_;
    cv_.notify_all();
    return out;
}

std::vector<std::vector<uint8_t>> LocalControlHub::gather(int rank, std::vector<uint8_t> message) {
    std::unique_lock lock(mutex_);
    FANOUT_CHECK(abort_reason_.empty(), "{}", abort_reason_);
    if (rank != 0) {
        // The previous round's report must have been collected before this one overwrites it.
        const bool free =
            cv_.wait_for(lock, timeout_, [&] { return !abort_reason_.empty() || collected_ >= reported_[rank]; });
        FANOUT_CHECK(abort_reason_.empty(), "{}", abort_reason_);
        FANOUT_CHECK(free, "control plane: rank 0 did not collect rank {}'s report within {} ms", rank,
                     timeout_.count());
        reports_[rank] = std::move(message);
        ++reported_[rank];
        cv_.notify_all();
        return {};
    }
    reports_[0] = std::move(message);
    reported_[0] = collected_ + 1;
    std::vector<int> missing;
    const bool all = cv_.wait_for(lock, timeout_, [&] {
        if (!abort_reason_.empty()) return true;
        for (int r = 1; r < world_; ++r)
            if (reported_[r] <= collected_) return false;
        return true;
    });
    FANOUT_CHECK(abort_reason_.empty(), "{}", abort_reason_);
    if (!all) {
        for (int r = 1; r < world_; ++r)
            if (reported_[r] <= collected_) missing.push_back(r);
        FANOUT_FAIL("control plane: rank(s) {} sent no report for step {} within {} ms", fmt::join(missing, ", "),
                    collected_ + 1, timeout_.count());
    }
    ++collected_;
    std::vector<std::vector<uint8_t>> out(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) out[r] = std::move(reports_[r]);
    cv_.notify_all();
    return out;
}

}  // namespace fanout::comm
