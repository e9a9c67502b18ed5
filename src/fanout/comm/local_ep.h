// The `local` EP backend: the ranks are threads of one process and the "network" is host memory.
// It is the reference for the other backends (every rank's result is checkable with full
// knowledge) and runs the CPU engine's expert parallelism. A LocalFabric is created once for the
// group; each rank's thread takes its endpoint and makes the calls of ExpertParallel (ep.h); the
// halves synchronize through a barrier of `world` threads.
#pragma once

#include <barrier>
#include <cstdint>
#include <memory>
#include <vector>

#include "fanout/comm/ep.h"

namespace fanout::comm {

class LocalFabric {
  public:
    // `config.rank` is ignored: endpoint(r) makes rank r's view.
    explicit LocalFabric(const EpConfig& config);
    ~LocalFabric();
    LocalFabric(const LocalFabric&) = delete;
    LocalFabric& operator=(const LocalFabric&) = delete;

    // Rank r's endpoint; the fabric must outlive it. Call once per rank.
    std::unique_ptr<ExpertParallel> endpoint(int rank);

  private:
    friend class LocalEndpoint;
    struct Entry {  // one (token, choice) on its way to a rank
        int32_t src_token, choice, local_expert;
    };
    struct Outbox {  // from one rank to one rank, written by the sender only
        std::vector<Entry> entries;
        std::vector<uint8_t> payload;  // payload_bytes per entry
        std::vector<float> scales;     // scale_blocks per entry (fp8)
    };

    EpConfig config_;
    std::barrier<> barrier_;
    std::vector<std::vector<Outbox>> outbox_;           // [src][dst]
    std::vector<std::vector<uint8_t>> returned_;        // [src] [T, K, hidden] expert outputs (output_bytes each)
    std::vector<std::vector<uint8_t>> returned_valid_;  // [src] [T, K]
};

}  // namespace fanout::comm
