// `fanout bench comm` (CUDA builds): the GPU EP backends' dispatch and combine (ep_gpu.h) on every
// visible GPU of this machine — one process, a host thread per GPU — at DeepSeek-V3's shape
// (hidden 7168, top-8 of 256 experts, uniform random routing; FP8 dispatch with 1×128 scales, BF16
// combine), for a sweep of tokens per rank. Each step is a CUDA graph (events between the halves),
// replayed with the ranks started together: µs for each half and each pair (medians), and GB/s
// counting only the bytes that cross to another GPU. Beside them, measured in the same run: the
// peer copy bandwidth (cudaMemcpyPeerAsync, every GPU sending to the next at once) and NCCL's
// ncclAlltoAll of the same crossing volume padded to the largest pair; and the pplx-kernels
// anchors of REFERENCE.md §3 (same 2×H200 machine) with issue 7's targets.
#pragma once

#include <string>
#include <vector>

namespace fanout::bench {

struct CommBenchOptions {
    std::vector<std::string> backends = {"nvlink", "nccl"};
    std::vector<int> tokens = {1, 8, 32, 128, 512, 4096};  // tokens per rank
    // Tokens per rank each backend is built for (a server's step budget, max_batched_tokens);
    // 0: each point's own token count.
    int capacity = 0;
    int hidden = 7168;
    int experts = 256;
    int topk = 8;
    int replays = 50;  // timed graph replays per figure (medians)
    std::string json_out = "comm_bench.json";
};

// Prints the table; writes opts.json_out when set. Returns 0, or throws fanout::Error.
int run_comm_bench(const CommBenchOptions& opts);

}  // namespace fanout::bench
