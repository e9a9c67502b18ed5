// Data-parallel engine ranks as processes under `mpirun -np 4` (the `mpi` control plane), with the
// fake model of fake_rank_runner.h. `serve`: rank 0 hands 64 requests of different lengths to the
// least-loaded ranks; every output is exact and every rank ran the same number of steps (idle ranks
// empty ones); rank 0 stops the group and every process exits 0. `fail`: rank 2 throws in its
// fifth step — the job ends (no hang) with "DP rank 2 of 4 failed: injected failure" (ctest
// matches that line).
#include <cstdio>
#include <string>
#include <thread>

#include "fake_rank_runner.h"
#include "fanout/comm/mpi_ep.h"
#include "fanout/engine/dp_group.h"

namespace fanout::engine {
namespace {

int run(const std::string& mode) {
    comm::MpiSession mpi;
    const int rank = mpi.rank(), world = mpi.world();
    testing::Shared shared(world);  // this process's counts: only its own rank's entry moves
    if (mode == "fail") {
        shared.fail_rank = 2;
        shared.fail_at = 5;
    }
    EngineConfig cfg;
    cfg.num_kv_blocks = 64;
    cfg.scheduler = {8, 32, 8};
    cfg.lockstep = true;
    DpRank dp(std::make_unique<Engine>(std::make_unique<testing::FakeRankRunner>(shared, rank), nullptr, cfg),
              comm::make_mpi_control(MPI_COMM_WORLD));
    if (rank != 0) {
        dp.run();
        // Every rank ran every step: the step count travels to rank 0 in a last gather.
        int64_t mine = shared.forwards[rank];
        MPI_Gather(&mine, 1, MPI_INT64_T, nullptr, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
        return 0;
    }
    int failures = 0;
    std::vector<RequestParams> params;
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int i = 0; i < 64; ++i) {
        params.push_back(testing::request(i, 1 + (i * 7) % 23));
        handles.push_back(dp.submit(params.back()));
    }
    std::thread loop([&] { dp.run(); });
    for (size_t i = 0; i < handles.size(); ++i) {
        std::vector<int32_t> got;
        RequestEvent ev;
        while (handles[i]->next(&ev, std::chrono::seconds(60))) {
            got.insert(got.end(), ev.tokens.begin(), ev.tokens.end());
            if (ev.finished) break;
        }
        if (got != testing::expected(params[i].prompt, params[i].max_tokens) || ev.finish_reason != "length") {
            std::fprintf(stderr, "FAIL request %zu: %zu tokens, finish '%s'\n", i, got.size(),
                         ev.finish_reason.c_str());
            ++failures;
        }
    }
    const EngineStats all = dp.stats();
    if (all.requests_finished != 64) {
        std::fprintf(stderr, "FAIL %lld requests finished, want 64\n", (long long)all.requests_finished);
        ++failures;
    }
    dp.stop();
    loop.join();
    std::vector<int64_t> steps(static_cast<size_t>(world));
    int64_t mine = shared.forwards[0];
    MPI_Gather(&mine, 1, MPI_INT64_T, steps.data(), 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    for (int r = 1; r < world; ++r)
        if (steps[r] != steps[0]) {
            std::fprintf(stderr, "FAIL rank %d ran %lld steps, rank 0 %lld\n", r, (long long)steps[r],
                         (long long)steps[0]);
            ++failures;
        }
    std::printf("%s: 64 requests over %d ranks, %lld steps each, %d failures\n", failures ? "FAIL" : "PASS", world,
                (long long)steps[0], failures);
    return failures ? 1 : 0;
}

}  // namespace
}  // namespace fanout::engine

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "serve";
    try {
        return fanout::engine::run(mode);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        fanout::comm::abort_mpi_job(1);
        return 1;
    }
}
