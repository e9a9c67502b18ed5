#include "fanout/comm/mpi_ep.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "fanout/comm/host_receiver.h"
#include "fanout/core/api_error.h"
#include "fanout/core/dtype.h"
#include "fanout/core/error.h"

namespace fanout::comm {
namespace {

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

// config, validated, and within MPI's int counts: an exchange posts a rank's rows in one
// all-to-all-v of int counts and displacements (rows × the widest row of meta, payload, scales or
// return rows), and the receive side is sized from it — checked before anything is allocated.
const EpConfig& checked(const EpConfig& config) {
    validate(config);
    const int64_t in = int64_t{config.world} * config.max_tokens_per_rank *
                       std::min(config.experts_per_token, std::max(1, config.local_experts())),
                  out = int64_t{config.max_tokens_per_rank} * config.experts_per_token;
    const int64_t unit = std::max<int64_t>(
        {3, config.payload_bytes(), config.scale_blocks(), int64_t{config.hidden} * config.output_bytes()});
    FANOUT_CHECK(std::max(in, out) * unit <= std::numeric_limits<int>::max(),
                 "EP mpi: up to {} rows of {} bytes in one exchange exceed MPI's int counts ({}): fewer tokens per "
                 "rank ({} now) or a smaller payload",
                 std::max(in, out), unit, std::numeric_limits<int>::max(), config.max_tokens_per_rank);
    return config;
}

class MpiEp final : public ExpertParallel {
  public:
    MpiEp(const EpConfig& config, MPI_Comm comm) : config_(checked(config)), comm_(comm), recv_(config) {
        int rank = 0, size = 0;
        FANOUT_MPI_CHECK(MPI_Comm_rank(comm_, &rank));
        FANOUT_MPI_CHECK(MPI_Comm_size(comm_, &size));
        FANOUT_CHECK(rank == config_.rank && size == config_.world,
                     "EP mpi: config says rank {} of {}, the communicator rank {} of {}", config_.rank, config_.world,
                     rank, size);
        pending_.reserve(kMaxPending);  // posted requests' count arrays must not move
    }

    const EpConfig& config() const override { return config_; }

    void dispatch_send(const DispatchInput& in) override {
        const int W = config_.world, K = config_.experts_per_token, L = config_.local_experts();
        const int T = check_dispatch(config_, in);
        const int pb = config_.payload_bytes(), nb = config_.scale_blocks();
        const bool fp8 = config_.payload == Payload::kFp8;
        // Pack per destination, in (token, choice) order.
        std::vector<std::vector<int>> dest(static_cast<size_t>(W));  // entry indices t·K + k
        for (int t = 0; t < T; ++t)
            for (int k = 0; k < K; ++k) {
                dest[in.topk_idx[static_cast<size_t>(t) * K + k] / L].push_back(t * K + k);
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
        const size_t pb = static_cast<size_t>(config_.payload_bytes()),
                     nb = static_cast<size_t>(config_.scale_blocks());
        const bool fp8 = config_.payload == Payload::kFp8;
        recv_.begin_step();
        const std::vector<int> offset = prefix(recv_n_);
        for (int src = 0; src < config_.world; ++src)
            for (int j = 0; j < recv_n_[src]; ++j) {
                const size_t i = static_cast<size_t>(offset[src] + j);
                recv_.place(recv_meta_[i * 3 + 2], {src, recv_meta_[i * 3], recv_meta_[i * 3 + 1]},
                            recv_payload_.data() + i * pb, fp8 ? recv_scales_.data() + i * nb : nullptr);
            }
    }

    ExpertBatch recv_batch() const override { return recv_.batch(); }

    void combine_send(const void* expert_out) override {
        const int W = config_.world;
        const size_t row_bytes = static_cast<size_t>(config_.hidden) * config_.output_bytes();
        const auto* rows = static_cast<const uint8_t*>(expert_out);
        // Receive rows grouped by the rank their token came from.
        std::vector<std::vector<std::pair<size_t, HostReceiver::Origin>>> back(static_cast<size_t>(W));
        recv_.for_each_row([&](size_t r, const HostReceiver::Origin& o) { back[o.rank].push_back({r, o}); });
        send_n_.assign(W, 0);
        for (int s = 0; s < W; ++s) send_n_[s] = static_cast<int>(back[s].size());
        const int total = sum(send_n_);
        send_meta_.resize(static_cast<size_t>(total) * 2);
        send_rows_.resize(static_cast<size_t>(total) * row_bytes);
        size_t i = 0;
        for (int s = 0; s < W; ++s)
            for (const auto& [r, o] : back[s]) {
                send_meta_[i * 2] = o.token;
                send_meta_[i * 2 + 1] = o.choice;
                std::memcpy(send_rows_.data() + i * row_bytes, rows + r * row_bytes, row_bytes);
                ++i;
            }
        recv_n_.assign(W, 0);
        FANOUT_MPI_CHECK(MPI_Alltoall(send_n_.data(), 1, MPI_INT, recv_n_.data(), 1, MPI_INT, comm_));
        const int rtotal = sum(recv_n_);
        recv_meta_.resize(static_cast<size_t>(rtotal) * 2);
        recv_rows_.resize(static_cast<size_t>(rtotal) * row_bytes);
        post(send_meta_.data(), send_n_, recv_meta_.data(), recv_n_, 2, MPI_INT);
        post(send_rows_.data(), send_n_, recv_rows_.data(), recv_n_, static_cast<int>(row_bytes), MPI_BYTE);
    }

    void combine_recv(const float* topk_weight, void* out) override {
        wait_all();
        const int K = config_.experts_per_token, T = tokens_this_step_;
        const size_t row_bytes = static_cast<size_t>(config_.hidden) * config_.output_bytes();
        // Each (token, choice) comes back at most once; sum in choice order, as the local backend does.
        std::vector<int> where(static_cast<size_t>(T) * K, -1);
        for (size_t i = 0; i < recv_meta_.size() / 2; ++i)
            where[static_cast<size_t>(recv_meta_[i * 2]) * K + recv_meta_[i * 2 + 1]] = static_cast<int>(i);
        combine_rows_bytes(
            config_, T, topk_weight,
            [&](int t, int k) -> const uint8_t* {
                const int i = where[static_cast<size_t>(t) * K + k];
                return i < 0 ? nullptr : recv_rows_.data() + static_cast<size_t>(i) * row_bytes;
            },
            out);
    }

  private:
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
    HostReceiver recv_;
    int tokens_this_step_ = 0;
    std::vector<int> send_n_, recv_n_;
    std::vector<int> send_meta_, recv_meta_;
    std::vector<uint8_t> send_payload_, recv_payload_;
    std::vector<float> send_scales_, recv_scales_;
    std::vector<uint8_t> send_rows_, recv_rows_;  // expert output rows, output_bytes per value
    std::vector<Pending> pending_;                // reserved once: MPI holds pointers into its elements
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
