// The `mpi` TP group (tensor_parallel.h): the TP ranks of a DP group as processes, the collectives
// on a communicator of their own. The all-reduce gathers every rank's partial sums and adds them
// in rank order on every rank — the local group's order, so every rank holds the same bits and
// TP as processes computes what TP as threads does.
#include <climits>
#include <vector>

#include "fanout/comm/mpi_ep.h"
#include "fanout/comm/tensor_parallel.h"
#include "fanout/core/error.h"

namespace fanout::comm {
namespace {

class MpiTensorParallel final : public TensorParallel {
  public:
    explicit MpiTensorParallel(MPI_Comm comm) {
        FANOUT_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
        FANOUT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
        FANOUT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    }
    ~MpiTensorParallel() override { MPI_Comm_free(&comm_); }

    int rank() const override { return rank_; }
    int size() const override { return size_; }

    void all_reduce_sum(float* data, int64_t n) override {
        // Every rank's n first: a mismatch is an error naming both, not a short read.
        std::vector<int64_t> ns(static_cast<size_t>(size_));
        FANOUT_MPI_CHECK(MPI_Allgather(&n, 1, MPI_INT64_T, ns.data(), 1, MPI_INT64_T, comm_));
        for (int r = 0; r < size_; ++r)
            FANOUT_CHECK(ns[static_cast<size_t>(r)] == n, "TP (mpi): all-reduce of {} values on rank {}, {} on rank {}",
                         n, rank_, ns[static_cast<size_t>(r)], r);
        FANOUT_CHECK(n <= INT_MAX, "TP (mpi): an all-reduce of {} values exceeds one MPI message", n);
        std::vector<float> all(static_cast<size_t>(n) * static_cast<size_t>(size_));
        FANOUT_MPI_CHECK(
            MPI_Allgather(data, static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n), MPI_FLOAT, comm_));
        for (int64_t i = 0; i < n; ++i) {
            float sum = 0.0f;
            for (int r = 0; r < size_; ++r) sum += all[static_cast<size_t>(r) * static_cast<size_t>(n) + i];
            data[i] = sum;
        }
    }

    void all_gather_rows(const float* mine, int64_t rows, int64_t width, float* out) override {
        std::vector<int64_t> all_rows(static_cast<size_t>(size_));
        FANOUT_MPI_CHECK(MPI_Allgather(&rows, 1, MPI_INT64_T, all_rows.data(), 1, MPI_INT64_T, comm_));
        std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
        int64_t at = 0;
        for (int r = 0; r < size_; ++r) {
            const int64_t n = all_rows[static_cast<size_t>(r)] * width;
            FANOUT_CHECK(n >= 0 && at + n <= INT_MAX, "TP (mpi): an all-gather of {} values exceeds one MPI message",
                         at + n);
            counts[static_cast<size_t>(r)] = static_cast<int>(n);
            displs[static_cast<size_t>(r)] = static_cast<int>(at);
            at += n;
        }
        FANOUT_MPI_CHECK(MPI_Allgatherv(mine, static_cast<int>(rows * width), MPI_FLOAT, out, counts.data(),
                                        displs.data(), MPI_FLOAT, comm_));
    }

  private:
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<TensorParallel> make_mpi_tp(MPI_Comm comm) { return std::make_unique<MpiTensorParallel>(comm); }

}  // namespace fanout::comm
