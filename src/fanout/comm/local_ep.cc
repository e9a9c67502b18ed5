#include "fanout/comm/local_ep.h"

#include <cstring>

#include "fanout/comm/host_receiver.h"
#include "fanout/core/error.h"

namespace fanout::comm {

class LocalEndpoint final : public ExpertParallel {
  public:
    LocalEndpoint(LocalFabric& fabric, int rank)
        : fabric_(fabric), config_(with_rank(fabric.config_, rank)), recv_(config_) {}

    const EpConfig& config() const override { return config_; }

    void dispatch_send(const DispatchInput& in) override {
        const int T = check_dispatch(config_, in), K = config_.experts_per_token, L = config_.local_experts();
        const size_t pb = static_cast<size_t>(config_.payload_bytes()),
                     nb = static_cast<size_t>(config_.scale_blocks());
        for (auto& box : fabric_.outbox_[config_.rank]) {
            box.entries.clear();
            box.payload.clear();
            box.scales.clear();
        }
        const auto* bytes = static_cast<const uint8_t*>(in.tokens);
        for (int t = 0; t < T; ++t)
            for (int k = 0; k < K; ++k) {
                const int e = in.topk_idx[static_cast<size_t>(t) * K + k];
                LocalFabric::Outbox& box = fabric_.outbox_[config_.rank][e / L];
                box.entries.push_back({t, k, e % L});
                box.payload.insert(box.payload.end(), bytes + t * pb, bytes + (t + 1) * pb);
                if (config_.payload == Payload::kFp8)
                    box.scales.insert(box.scales.end(), in.scales + t * nb, in.scales + (t + 1) * nb);
            }
        // This rank's return slots, filled by the experts' ranks in combine_send.
        tokens_this_step_ = T;
        fabric_.returned_[config_.rank].assign(static_cast<size_t>(T) * K * config_.hidden * config_.output_bytes(), 0);
        fabric_.returned_valid_[config_.rank].assign(static_cast<size_t>(T) * K, 0);
    }

    void dispatch_recv() override {
        fabric_.barrier_.arrive_and_wait(config_.rank, "dispatch");  // every rank's sends are in the outboxes
        const size_t pb = static_cast<size_t>(config_.payload_bytes()),
                     nb = static_cast<size_t>(config_.scale_blocks());
        const bool fp8 = config_.payload == Payload::kFp8;
        recv_.begin_step();
        for (int src = 0; src < config_.world; ++src) {
            const LocalFabric::Outbox& box = fabric_.outbox_[src][config_.rank];
            for (size_t i = 0; i < box.entries.size(); ++i) {
                const LocalFabric::Entry& en = box.entries[i];
                recv_.place(en.local_expert, {src, en.src_token, en.choice}, box.payload.data() + i * pb,
                            fp8 ? box.scales.data() + i * nb : nullptr);
            }
        }
        fabric_.barrier_.arrive_and_wait(config_.rank, "dispatch (inboxes read)");  // senders may reuse them
    }

    ExpertBatch recv_batch() const override { return recv_.batch(); }

    void combine_send(const void* expert_out) override {
        const int K = config_.experts_per_token;
        const size_t row_bytes = static_cast<size_t>(config_.hidden) * config_.output_bytes();
        const auto* rows = static_cast<const uint8_t*>(expert_out);
        recv_.for_each_row([&](size_t r, const HostReceiver::Origin& o) {
            const size_t slot = static_cast<size_t>(o.token) * K + o.choice;
            std::memcpy(fabric_.returned_[o.rank].data() + slot * row_bytes, rows + r * row_bytes, row_bytes);
            fabric_.returned_valid_[o.rank][slot] = 1;
        });
    }

    void combine_recv(const float* topk_weight, void* out) override {
        fabric_.barrier_.arrive_and_wait(config_.rank, "combine");  // every rank's expert outputs are back
        const int K = config_.experts_per_token;
        const size_t row_bytes = static_cast<size_t>(config_.hidden) * config_.output_bytes();
        const std::vector<uint8_t>& ret = fabric_.returned_[config_.rank];
        const std::vector<uint8_t>& valid = fabric_.returned_valid_[config_.rank];
        combine_rows_bytes(
            config_, tokens_this_step_, topk_weight,
            [&](int t, int k) -> const uint8_t* {
                const size_t slot = static_cast<size_t>(t) * K + k;
                return valid[slot] ? ret.data() + slot * row_bytes : nullptr;
            },
            out);
    }

  private:
    static EpConfig with_rank(EpConfig c, int rank) {
        c.rank = rank;
        return c;
    }

    LocalFabric& fabric_;
    EpConfig config_;
    HostReceiver recv_;
    int tokens_this_step_ = 0;
};

LocalFabric::LocalFabric(const EpConfig& config, std::chrono::milliseconds timeout)
    : config_(config),
      barrier_(config.world, timeout, "EP local"),
      outbox_(static_cast<size_t>(config.world), std::vector<Outbox>(static_cast<size_t>(config.world))),
      returned_(static_cast<size_t>(config.world)),
      returned_valid_(static_cast<size_t>(config.world)) {
    EpConfig c = config;
    c.rank = 0;
    validate(c);
}

LocalFabric::~LocalFabric() = default;

void LocalFabric::abort(const std::string& reason) { barrier_.abort(reason); }

std::unique_ptr<ExpertParallel> LocalFabric::endpoint(int rank) {
    FANOUT_CHECK(rank >= 0 && rank < config_.world, "EP local: rank {} outside [0, {})", rank, config_.world);
    return std::make_unique<LocalEndpoint>(*this, rank);
}

}  // namespace fanout::comm
