#include "fanout/comm/mpi_ep.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "fanout/core/api_error.h"
#include "fanout/core/dtype.h"
#include "fanout/core/error.h"

namespace fanout::comm {
namespace {

#define FANOUT_MPI_CHECK(stmt)                                                              \
    do {                                                                                    \
        const int mpi_rc_ = (stmt);                                                         \
        if (mpi_rc_ != MPI_SUCCESS) {                                                       \
            char mpi_msg_[MPI_MAX_ERROR_STRING];                                            \
            int mpi_len_ = 0;                                                               \
            MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);                                 \
            ::fanout::throw_api_error(__FILE__, __LINE__, "MPI", #stmt, mpi_rc_, mpi_msg_); \
        }                                                                                   \
    } while (0)

// Displacements of a count vector.
std::vector<int> prefix(const std::vector<int>& counts) {
    std::vector<int> d(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
    return d;
}
std::vector<int> scaled(const std::vector<int>& counts, int by) {
    std::vector<int> v(counts);
    for (int& c : v) c *= by;
    return v;
}
int sum(const std::vector<int>& v) {
    int s = 0;
    for (int x : v) s += x;
    return s;
}

class MpiEp final : public ExpertParallel {
  public:
    MpiEp(const EpConfig& config, MPI_Comm comm) : config_(config), comm_(comm) {
        validate(config_);
        int rank = 0, size = 0;
        FANOUT_MPI_CHECK(MPI_Comm_rank(comm_, &rank));
        FANOUT_MPI_CHECK(MPI_Comm_size(comm_, &size));
        FANOUT_CHECK(rank == config_.rank && size == config_.world,
                     "EP mpi: config says rank {} of {}, the communicator rank {} of {}", config_.rank, config_.world,
                     rank, size);
        const size_t rows = static_cast<size_t>(config_.local_experts()) * config_.rows_per_expert();
        counts_.assign(static_cast<size_t>(config_.local_experts()), 0);
        tokens_.assign(rows * config_.payload_bytes(), 0);
        if (config_.payload == Payload::kFp8) scales_.assign(rows * config_.scale_blocks(), 0.0f);
        origin_.assign(rows, Origin{});
        pending_.reserve(kMaxPending);  // posted requests' count arrays must not move
    }

    const EpConfig& config() const override { return config_; }

    void dispatch_send(const DispatchInput& in) override {
        const int W = config_.world, K = config_.experts_per_token, L = config_.local_experts();
        const int T = *in.num_tokens;
        FANOUT_CHECK(T >= 0 && T <= config_.max_tokens_per_rank, "EP dispatch: rank {} has {} tokens, outside [0, {}]",
                     config_.rank, T, config_.max_tokens_per_rank);
        const int pb = config_.payload_bytes(), nb = config_.scale_blocks();
        const bool fp8 = config_.payload == Payload::kFp8;
        // Pack per destination, in (token, choice) order.
        std::vector<std::vector<int>> dest(static_cast<size_t>(W));  // entry indices t·K + k
        for (int t = 0; t < T; ++t)
            for (int k = 0; k < K; ++k) {
                const int e = in.topk_idx[static_cast<size_t>(t) * K + k];
                FANOUT_CHECK(e >= 0 && e < config_.num_experts,
                             "EP dispatch: rank {} token {} choice {} names expert {} outside [0, {})", config_.rank, t,
                             k, e, config_.num_experts);
                dest[e / L].push_back(t * K + k);
            }
        send_n_.assign(W, 0);
        for (int d = 0; d < W; ++d) send_n_[d] = static_cast<int>(dest[d].size());
        const int total = sum(send_n_);
        send_meta_.resize(static_cast<size_t>(total) * 3);
        send_payload_.resize(static_cast<size_t>(total) * pb);
        send_scales_.resize(fp8 ? static_cast<size_t>(total) * nb : 0);
        const auto* bytes = static_cast<const uint8_t*>(in.tokens);
        size_t i = 0;
        for (int d = 0; d < W; ++d)
            for (int tk : dest[d]) {
                const int t = tk / K, k = tk % K;
                send_meta_[i * 3] = t;
                send_meta_[i * 3 + 1] = k;
                send_meta_[i * 3 + 2] = in.topk_idx[tk] % L;
                std::memcpy(send_payload_.data() + i * pb, bytes + static_cast<size_t>(t) * pb, pb);
                if (fp8) std::memcpy(send_scales_.data() + i * nb, in.scales + static_cast<size_t>(t) * nb, nb * 4);
                ++i;
            }
        recv_n_.assign(W, 0);
        FANOUT_MPI_CHECK(MPI_Alltoall(send_n_.data(), 1, MPI_INT, recv_n_.data(), 1, MPI_INT, comm_));
        const int rtotal = sum(recv_n_);
        recv_meta_.resize(static_cast<size_t>(rtotal) * 3);
        recv_payload_.resize(static_cast<size_t>(rtotal) * pb);
        recv_scales_.resize(fp8 ? static_cast<size_t>(rtotal) * nb : 0);
        post(send_meta_.data(), send_n_, recv_meta_.data(), recv_n_, 3, MPI_INT);
        post(send_payload_.data(), send_n_, recv_payload_.data(), recv_n_, pb, MPI_BYTE);
        if (fp8) post(send_scales_.data(), send_n_, recv_scales_.data(), recv_n_, nb, MPI_FLOAT);
        tokens_this_step_ = T;
    }

    void dispatch_recv() override {
        wait_all();
        const int M = config_.rows_per_expert(), pb = config_.payload_bytes(), nb = config_.scale_blocks();
        std::fill(counts_.begin(), counts_.end(), 0);
        const std::vector<int> offset = prefix(recv_n_);
        for (int src = 0; src < config_.world; ++src)
            for (int j = 0; j < recv_n_[src]; ++j) {
                const size_t i = static_cast<size_t>(offset[src] + j);
                const int e = recv_meta_[i * 3 + 2];
                const int row = counts_[e]++;
                if (row >= M) continue;  // dropped: its choice contributes nothing to the combine
                const size_t r = static_cast<size_t>(e) * M + row;
                std::memcpy(tokens_.data() + r * pb, recv_payload_.data() + i * pb, pb);
                if (config_.payload == Payload::kFp8)
                    std::memcpy(scales_.data() + r * nb, recv_scales_.data() + i * nb, static_cast<size_t>(nb) * 4);
                origin_[r] = {src, recv_meta_[i * 3], recv_meta_[i * 3 + 1]};
            }
    }

    ExpertBatch recv_batch() const override {
        return {counts_.data(), tokens_.data(), config_.payload == Payload::kFp8 ? scales_.data() : nullptr,
                config_.rows_per_expert()};
    }

    void combine_send(const uint16_t* expert_out) override {
        const int W = config_.world, M = config_.rows_per_expert(), H = config_.hidden;
        std::vector<std::vector<size_t>> back(static_cast<size_t>(W));  // receive rows per source rank
        for (int e = 0; e < config_.local_experts(); ++e)
            for (int row = 0; row < std::min(counts_[e], M); ++row) {
                const size_t r = static_cast<size_t>(e) * M + row;
                back[origin_[r].rank].push_back(r);
            }
        send_n_.assign(W, 0);
        for (int s = 0; s < W; ++s) send_n_[s] = static_cast<int>(back[s].size());
        const int total = sum(send_n_);
        send_meta_.resize(static_cast<size_t>(total) * 2);
        send_rows_.resize(static_cast<size_t>(total) * H);
        size_t i = 0;
        for (int s = 0; s < W; ++s)
            for (size_t r : back[s]) {
                send_meta_[i * 2] = origin_[r].token;
                send_meta_[i * 2 + 1] = origin_[r].choice;
                std::memcpy(send_rows_.data() + i * H, expert_out + r * H, static_cast<size_t>(H) * 2);
                ++i;
            }
        recv_n_.assign(W, 0);
        FANOUT_MPI_CHECK(MPI_Alltoall(send_n_.data(), 1, MPI_INT, recv_n_.data(), 1, MPI_INT, comm_));
        const int rtotal = sum(recv_n_);
        recv_meta_.resize(static_cast<size_t>(rtotal) * 2);
        recv_rows_.resize(static_cast<size_t>(rtotal) * H);
        post(send_meta_.data(), send_n_, recv_meta_.data(), recv_n_, 2, MPI_INT);
        post(send_rows_.data(), send_n_, recv_rows_.data(), recv_n_, H, MPI_UINT16_T);
    }

    void combine_recv(const float* topk_weight, uint16_t* out) override {
        wait_all();
        const int K = config_.experts_per_token, H = config_.hidden, T = tokens_this_step_;
        // Each (token, choice) comes back at most once; sum in choice order, as the local backend does.
        std::vector<int> where(static_cast<size_t>(T) * K, -1);
        for (size_t i = 0; i < recv_meta_.size() / 2; ++i)
            where[static_cast<size_t>(recv_meta_[i * 2]) * K + recv_meta_[i * 2 + 1]] = static_cast<int>(i);
        std::vector<float> acc(static_cast<size_t>(H));
        for (int t = 0; t < T; ++t) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int k = 0; k < K; ++k) {
                const int i = where[static_cast<size_t>(t) * K + k];
                if (i < 0) continue;
                const float w = topk_weight[static_cast<size_t>(t) * K + k];
                for (int d = 0; d < H; ++d) acc[d] += w * bf16_to_f32(recv_rows_[static_cast<size_t>(i) * H + d]);
            }
            for (int d = 0; d < H; ++d) out[static_cast<size_t>(t) * H + d] = f32_to_bf16(acc[d]);
        }
    }

  private:
    struct Origin {
        int rank = 0, token = 0, choice = 0;
    };
    static constexpr size_t kMaxPending = 3;  // meta, payload, scales

    // Posts an all-to-all-v of `unit` elements per entry.
    void post(const void* send, const std::vector<int>& send_n, void* recv, const std::vector<int>& recv_n, int unit,
              MPI_Datatype type) {
        FANOUT_CHECK(pending_.size() < kMaxPending, "EP mpi: more than {} exchanges in flight", kMaxPending);
        auto& p = pending_.emplace_back();
        p.send_counts = scaled(send_n, unit);
        p.recv_counts = scaled(recv_n, unit);
        p.send_displs = prefix(p.send_counts);
        p.recv_displs = prefix(p.recv_counts);
        FANOUT_MPI_CHECK(MPI_Ialltoallv(send, p.send_counts.data(), p.send_displs.data(), type, recv,
                                        p.recv_counts.data(), p.recv_displs.data(), type, comm_, &p.request));
    }
    void wait_all() {
        for (auto& p : pending_) FANOUT_MPI_CHECK(MPI_Wait(&p.request, MPI_STATUS_IGNORE));
        pending_.clear();
    }

    struct Pending {
        std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
        MPI_Request request = MPI_REQUEST_NULL;
    };

    EpConfig config_;
    MPI_Comm comm_;
    std::vector<int32_t> counts_;
    std::vector<uint8_t> tokens_;
    std::vector<float> scales_;
    std::vector<Origin> origin_;
    int tokens_this_step_ = 0;
    std::vector<int> send_n_, recv_n_;
    std::vector<int> send_meta_, recv_meta_;
    std::vector<uint8_t> send_payload_, recv_payload_;
    std::vector<float> send_scales_, recv_scales_;
    std::vector<uint16_t> send_rows_, recv_rows_;
    std::vector<Pending> pending_;  // reserved once: MPI holds pointers into its elements
};

}  // namespace

std::unique_ptr<ExpertParallel> make_mpi_ep(const EpConfig& config, MPI_Comm comm) {
    return std::make_unique<MpiEp>(config, comm);
}

std::vector<uint8_t> mpi_broadcast(std::vector<uint8_t> blob, MPI_Comm comm) {
    uint64_t size = blob.size();
    FANOUT_MPI_CHECK(MPI_Bcast(&size, 1, MPI_UINT64_T, 0, comm));
    FANOUT_CHECK(size <= (uint64_t{1} << 30), "mpi_broadcast: rank 0 announced {} bytes", size);
    blob.resize(static_cast<size_t>(size));
    FANOUT_MPI_CHECK(MPI_Bcast(blob.data(), static_cast<int>(size), MPI_BYTE, 0, comm));
    return blob;
}

}  // namespace fanout::comm
