// The `mpi` control plane (control_plane.h): rank 0's step message by broadcast, the reports by
// gather, on a communicator of their own. Idle ranks poll a non-blocking broadcast with a short
// sleep instead of MPI's busy wait, so a quiet deployment leaves its cores alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <thread>

#include "fanout/comm/control_plane.h"
#include "fanout/comm/mpi_ep.h"
#include "fanout/core/error.h"

namespace fanout::comm {
namespace {

class MpiControl final : public ControlPlane {
  public:
    MpiControl(MPI_Comm comm, std::chrono::milliseconds timeout) : timeout_(timeout) {
        FANOUT_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
        FANOUT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
        FANOUT_MPI_CHECK(MPI_Comm_size(comm_, &world_));
    }
    ~MpiControl() override { MPI_Comm_free(&comm_); }

    int rank() const override { return rank_; }
    int world() const override { return world_; }

    std::vector<uint8_t> broadcast(std::vector<uint8_t> message) override {
        int64_t size = rank_ == 0 ? static_cast<int64_t>(message.size()) : 0;
        MPI_Request req = MPI_REQUEST_NULL;
        FANOUT_MPI_CHECK(MPI_Ibcast(&size, 1, MPI_INT64_T, 0, comm_, &req));
        wait(req, rank_ == 0 ? timeout_ : std::chrono::milliseconds::max(), "rank 0's step message");
        // Every rank has the size now: each refuses a message MPI's int count cannot carry alike.
        FANOUT_CHECK(size <= std::numeric_limits<int>::max(),
                     "control plane: rank 0's step message of {} bytes exceeds one MPI message ({} bytes)", size,
                     std::numeric_limits<int>::max());
        if (rank_ != 0) message.assign(static_cast<size_t>(size), 0);
        FANOUT_MPI_CHECK(MPI_Bcast(message.data(), static_cast<int>(size), MPI_BYTE, 0, comm_));
        return message;
    }

    std::vector<std::vector<uint8_t>> gather(std::vector<uint8_t> message) override {
        if (message.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
            abort(fmt::format("control plane: rank {}'s step report of {} bytes exceeds one MPI message", rank_,
                              message.size()));
        int size = static_cast<int>(message.size());
        std::vector<int> sizes(rank_ == 0 ? static_cast<size_t>(world_) : 0);
        MPI_Request req = MPI_REQUEST_NULL;
        FANOUT_MPI_CHECK(MPI_Igather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_, &req));
        wait(req, timeout_, "every rank's step report");
        std::vector<int> displs(sizes.size(), 0);
        int64_t total = 0;
        for (size_t r = 0; r < sizes.size(); ++r) {
            displs[r] = static_cast<int>(total);
            total += sizes[r];
            if (total > std::numeric_limits<int>::max())  // the others wait in the gather: end the job
                abort(fmt::format("control plane: the ranks' step reports exceed one MPI message ({} bytes by rank {})",
                                  total, r));
        }
        std::vector<uint8_t> all(static_cast<size_t>(total));
        FANOUT_MPI_CHECK(
            MPI_Gatherv(message.data(), size, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, 0, comm_));
        std::vector<std::vector<uint8_t>> out;
        for (size_t r = 0; r < sizes.size(); ++r)
            out.emplace_back(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
        return out;
    }

    [[noreturn]] void abort(const std::string& reason) override {
        std::fprintf(stderr, "fanout: %s\n", reason.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::abort();  // MPI_Abort does not return
    }

    std::string abort_reason() const override { return {}; }  // an abort ends the process

  private:
    // Polls `req` with a sleep that grows to 1 ms; past `timeout`, throws naming `what`.
    void wait(MPI_Request& req, std::chrono::milliseconds timeout, const char* what) {
        const auto start = std::chrono::steady_clock::now();
        auto nap = std::chrono::microseconds(20);
        for (;;) {
            int done = 0;
            FANOUT_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
            if (done) return;
            FANOUT_CHECK(
                timeout == std::chrono::milliseconds::max() || std::chrono::steady_clock::now() - start < timeout,
                "control plane (mpi): rank {} waited {} ms for {}", rank_, timeout.count(), what);
            std::this_thread::sleep_for(nap);
            nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
        }
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, world_ = 1;
    std::chrono::milliseconds timeout_;
};

}  // namespace

bool launched_by_mpi() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
        if (std::getenv(v) != nullptr) return true;
    return false;
}

namespace {
constexpr int kAnnounceTag = 7301;  // an engine rank's address, to the router
}  // namespace

MpiSession::MpiSession(Role role) {
    int inited = 0;
    FANOUT_MPI_CHECK(MPI_Initialized(&inited));
    FANOUT_CHECK(!inited, "MPI is already initialised in this process");
    int provided = 0;
    FANOUT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    FANOUT_CHECK(provided >= MPI_THREAD_SERIALIZED, "this MPI gives thread level {}, fanout needs serialized ({})",
                 provided, MPI_THREAD_SERIALIZED);
    int me = 0, all = 1;
    FANOUT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &me));
    FANOUT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &all));
    // Who is who: one byte each.
    const char mine = role == Role::kRouter ? 'r' : 'e';
    std::vector<char> roles(static_cast<size_t>(all));
    FANOUT_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_CHAR, roles.data(), 1, MPI_CHAR, MPI_COMM_WORLD));
    for (int r = 0; r < all; ++r)
        if (roles[static_cast<size_t>(r)] == 'r') {
            FANOUT_CHECK(router_ < 0, "this launch started more than one fanout router (world ranks {} and {})",
                         router_, r);
            router_ = r;
        }
    FANOUT_CHECK(router_ < 0 || all > 1,
                 "a fanout router under mpirun needs engines beside it (-np 1 fanout router "
                 "... : -np N fanout engine ...)");
    FANOUT_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, mine, me, &comm_));
    owned_.push_back(comm_);
    FANOUT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    FANOUT_MPI_CHECK(MPI_Comm_size(comm_, &world_));
    MPI_Comm host = MPI_COMM_NULL;
    FANOUT_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host));
    owned_.push_back(host);
    FANOUT_MPI_CHECK(MPI_Comm_rank(host, &local_rank_));
    FANOUT_MPI_CHECK(MPI_Comm_size(host, &local_size_));
}

MpiSession::~MpiSession() {
    // Leaving on an error (this rank failed before or between collectives): the other ranks may be
    // waiting in one, and MPI_Finalize would wait for them. The error's handler prints it and ends
    // the job (abort_mpi_job).
    if (std::uncaught_exceptions() > 0) return;
    for (MPI_Comm& c : owned_) MPI_Comm_free(&c);
    MPI_Finalize();
}

MPI_Comm MpiSession::split(int color, int key) {
    MPI_Comm c = MPI_COMM_NULL;
    FANOUT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &c));
    owned_.push_back(c);
    return c;
}

void MpiSession::announce(const std::string& address) const {
    if (router_ < 0) return;
    FANOUT_MPI_CHECK(
        MPI_Send(address.data(), static_cast<int>(address.size()), MPI_CHAR, router_, kAnnounceTag, MPI_COMM_WORLD));
}

std::vector<std::string> MpiSession::collect_announcements(
    const std::function<void(int got, int want)>& progress) const {
    int all = 1;
    FANOUT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &all));
    const int want = all - world_;  // every process that is not a router
    std::vector<std::pair<int, std::string>> got;
    auto last = std::chrono::steady_clock::now();
    while (static_cast<int>(got.size()) < want) {
        int flag = 0;
        MPI_Status st;
        FANOUT_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kAnnounceTag, MPI_COMM_WORLD, &flag, &st));
        if (!flag) {
            if (std::chrono::steady_clock::now() - last > std::chrono::seconds(30)) {
                last = std::chrono::steady_clock::now();
                if (progress) progress(static_cast<int>(got.size()), want);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            continue;
        }
        int n = 0;
        FANOUT_MPI_CHECK(MPI_Get_count(&st, MPI_CHAR, &n));
        FANOUT_CHECK(n >= 0 && n < 1024, "world rank {} announced an address of {} bytes", st.MPI_SOURCE, n);
        std::string a(static_cast<size_t>(n), '\0');
        FANOUT_MPI_CHECK(
            MPI_Recv(a.data(), n, MPI_CHAR, st.MPI_SOURCE, kAnnounceTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        got.emplace_back(st.MPI_SOURCE, std::move(a));
    }
    std::sort(got.begin(), got.end());
    std::vector<std::string> out;
    for (auto& [rank, a] : got)
        if (!a.empty()) out.push_back(std::move(a));
    return out;
}

void abort_mpi_job(int code) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

std::unique_ptr<ControlPlane> make_mpi_control(MPI_Comm comm, std::chrono::milliseconds timeout) {
    return std::make_unique<MpiControl>(comm, timeout);
}

}  // namespace fanout::comm
