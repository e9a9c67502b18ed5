#include "fanout/comm/local_ep.h"

#include <algorithm>
#include <cstring>

#include "fanout/core/dtype.h"
#include "fanout/core/error.h"

namespace fanout::comm {

class LocalEndpoint final : public ExpertParallel {
  public:
    LocalEndpoint(LocalFabric& fabric, int rank) : fabric_(fabric), config_(fabric.config_) {
        config_.rank = rank;
        const size_t rows = static_cast<size_t>(config_.local_experts()) * config_.rows_per_expert();
        counts_.assign(static_cast<size_t>(config_.local_experts()), 0);
        tokens_.assign(rows * config_.payload_bytes(), 0);
        if (config_.payload == Payload::kFp8) scales_.assign(rows * config_.scale_blocks(), 0.0f);
        origin_.assign(rows, Origin{});
    }

    const EpConfig& config() const override { return config_; }

    void dispatch_send(const DispatchInput& in) override {
        const int T = *in.num_tokens, K = config_.experts_per_token, L = config_.local_experts();
        FANOUT_CHECK(T >= 0 && T <= config_.max_tokens_per_rank, "EP dispatch: rank {} has {} tokens, outside [0, {}]",
                     config_.rank, T, config_.max_tokens_per_rank);
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
                FANOUT_CHECK(e >= 0 && e < config_.num_experts,
                             "EP dispatch: rank {} token {} choice {} names expert {} "
                             "outside [0, {})",
                             config_.rank, t, k, e, config_.num_experts);
                LocalFabric::Outbox& box = fabric_.outbox_[config_.rank][e / L];
                box.entries.push_back({t, k, e % L});
                box.payload.insert(box.payload.end(), bytes + t * pb, bytes + (t + 1) * pb);
                if (config_.payload == Payload::kFp8)
                    box.scales.insert(box.scales.end(), in.scales + t * nb, in.scales + (t + 1) * nb);
            }
        // This rank's return slots, filled by the experts' ranks in combine_send.
        tokens_this_step_ = T;
        fabric_.returned_[config_.rank].assign(static_cast<size_t>(T) * K * config_.hidden, 0);
        fabric_.returned_valid_[config_.rank].assign(static_cast<size_t>(T) * K, 0);
    }

    void dispatch_recv() override {
        fabric_.barrier_.arrive_and_wait();  // every rank's sends are in the outboxes
        const int M = config_.rows_per_expert();
        const size_t pb = static_cast<size_t>(config_.payload_bytes()),
                     nb = static_cast<size_t>(config_.scale_blocks());
        std::fill(counts_.begin(), counts_.end(), 0);
        for (int src = 0; src < config_.world; ++src) {
            const LocalFabric::Outbox& box = fabric_.outbox_[src][config_.rank];
            for (size_t i = 0; i < box.entries.size(); ++i) {
                const LocalFabric::Entry& en = box.entries[i];
                const int row = counts_[en.local_expert]++;
                if (row >= M) continue;  // dropped: its choice contributes nothing to the combine
                const size_t r = static_cast<size_t>(en.local_expert) * M + row;
                std::memcpy(tokens_.data() + r * pb, box.payload.data() + i * pb, pb);
                if (config_.payload == Payload::kFp8)
                    std::memcpy(scales_.data() + r * nb, box.scales.data() + i * nb, nb * sizeof(float));
                origin_[r] = {src, en.src_token, en.choice};
            }
        }
        fabric_.barrier_.arrive_and_wait();  // every rank has read its inboxes: senders may reuse them
    }

    ExpertBatch recv_batch() const override {
        return {counts_.data(), tokens_.data(), config_.payload == Payload::kFp8 ? scales_.data() : nullptr,
                config_.rows_per_expert()};
    }

    void combine_send(const uint16_t* expert_out) override {
        const int M = config_.rows_per_expert(), K = config_.experts_per_token, H = config_.hidden;
        for (int e = 0; e < config_.local_experts(); ++e)
            for (int row = 0; row < std::min(counts_[e], M); ++row) {
                const size_t r = static_cast<size_t>(e) * M + row;
                const Origin& o = origin_[r];
                const size_t slot = static_cast<size_t>(o.token) * K + o.choice;
                std::memcpy(fabric_.returned_[o.rank].data() + slot * H, expert_out + r * H, H * sizeof(uint16_t));
                fabric_.returned_valid_[o.rank][slot] = 1;
            }
    }

    void combine_recv(const float* topk_weight, uint16_t* out) override {
        fabric_.barrier_.arrive_and_wait();  // every rank's expert outputs are back
        const int K = config_.experts_per_token, H = config_.hidden;
        const std::vector<uint16_t>& ret = fabric_.returned_[config_.rank];
        const std::vector<uint8_t>& valid = fabric_.returned_valid_[config_.rank];
        std::vector<float> acc(static_cast<size_t>(H));
        for (int t = 0; t < tokens_this_step_; ++t) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int k = 0; k < K; ++k) {
                const size_t slot = static_cast<size_t>(t) * K + k;
                if (!valid[slot]) continue;
                const float w = topk_weight[slot];
                for (int d = 0; d < H; ++d) acc[d] += w * bf16_to_f32(ret[slot * H + d]);
            }
            for (int d = 0; d < H; ++d) out[static_cast<size_t>(t) * H + d] = f32_to_bf16(acc[d]);
        }
    }

  private:
    struct Origin {
        int rank = 0, token = 0, choice = 0;
    };
    LocalFabric& fabric_;
    EpConfig config_;
    std::vector<int32_t> counts_;
    std::vector<uint8_t> tokens_;
    std::vector<float> scales_;
    std::vector<Origin> origin_;  // per receive row: where its token came from
    int tokens_this_step_ = 0;
};

LocalFabric::LocalFabric(const EpConfig& config)
    : config_(config),
      barrier_(config.world),
      outbox_(static_cast<size_t>(config.world), std::vector<Outbox>(static_cast<size_t>(config.world))),
      returned_(static_cast<size_t>(config.world)),
      returned_valid_(static_cast<size_t>(config.world)) {
    EpConfig c = config;
    c.rank = 0;
    validate(c);
}

LocalFabric::~LocalFabric() = default;

std::unique_ptr<ExpertParallel> LocalFabric::endpoint(int rank) {
    FANOUT_CHECK(rank >= 0 && rank < config_.world, "EP local: rank {} outside [0, {})", rank, config_.world);
    return std::make_unique<LocalEndpoint>(*this, rank);
}

}  // namespace fanout::comm
