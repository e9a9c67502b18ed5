// The `nvlink` EP backend (ep_gpu.h): kernels store straight into the peers' memory through
// NCCL's device API. Every rank allocates one buffer with ncclMemAlloc and registers it as a
// symmetric window, so the same offset means the same thing on every rank; ncclGetPeerPointer
// turns (offset, peer) into an address the SMs can store to over NVLink.
//
// The window (same layout on every rank, `Layout`):
//   counts_all [W][E]        each source's per-expert row totals, broadcast to every rank, so every
//                            rank can compute where its rows go on any destination (ordered)
//   claims     [EL]          rows claimed so far this step per local expert (one-shot)
//   recv rows  [EL][max_m]   payload, fp8 scales, and the row's origin (source, token, choice)
//   returned   [T_max][K][D] expert outputs coming home (bf16)
//   flags      [3][W]        per source: the step whose counts / rows / returns it has finished
//
// Dispatch has two protocols, picked once from the configuration:
//  * one-shot, when no row can be dropped (max_m ≥ world · T_max, the default): one kernel.
//    step += 1; a warp per (token, choice) claims the next row of its expert on the destination
//    with a system-scope atomic add on that rank's `claims`, stores the row there at once; the
//    last block raises the rows flag on every rank. No counts go ahead of the rows, so there is no
//    round trip between the ranks before the first byte moves. Rows land in arrival order; since
//    none is dropped and the grouped GEMM computes each row on its own, results do not depend on
//    that order. dispatch_recv waits for every source's rows flag and takes each local expert's
//    count from `claims`, resetting it for the next step — which no source can reach before this
//    rank's combine_send of this step (it waits for that in its combine), after the reset.
//  * ordered, when max_m is smaller and rows past it must be dropped in (source, token, choice)
//    order, the same on every backend:
//      route_index (per 256-token chunk: each choice's index among the chunk's choices of its
//      expert, and the chunk's per-expert counts) → counts (step += 1; totals to every rank's
//      counts_all; counts flag) → rows (wait for every source's counts; row = Σ counts of lower
//      sources + index among this source's; a warp stores each row into its destination; the
//      last block to finish raises the rows flag on every rank); dispatch_recv waits for every
//      source's rows flag and sums the local experts' counts.
//
// The rest of a step, on the caller's stream, never waiting on the host:
//   combine_send:  a warp per received row stores the expert output into the source's returned
//                  slot (token, choice); the last block raises the returns flag on every rank
//   combine_recv:  wait for every source's returns flag; weighted sum per token in f32 → bf16
//                  (combine_recv_add: starting from the residual's value, written back in place)
// Reuse across steps needs no second buffer: a rank starts step s+1's stores into a peer only
// after that peer's returns of step s reached it (its combine waits for them), and a rank's buffers
// of step s are dead once it raised its returns flag of step s.
//
// Waits poll flags with acquire loads at system scope and give up after the configured timeout:
// the first to give up records (phase, peer, step) in host-mapped memory and raise_if_failed()
// turns it into an error. Only fmt-free headers here.
#include <cuda_bf16.h>
#include <nccl.h>
#include <nccl_device.h>

#include <string>
#include <vector>

#include "fanout/comm/ep_gpu.h"
#include "fanout/comm/nccl_check.h"
#include "fanout/core/api_error.h"
#include "fanout/core/block_scan.cuh"
#include "fanout/core/cuda_check.h"
#include "fanout/core/search.cuh"

namespace fanout::comm {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kChunk = 256;    // tokens per route_index block
constexpr int kMaxWorld = 64;  // ranks of one NVLink domain this backend addresses
constexpr int kMaxLocalExperts = 1024;
constexpr int kRowBlocks = 264;  // blocks of the row kernels: 2 per SM on an H200

enum Phase : int { kPhaseCounts = 0, kPhaseRows = 1, kPhaseReturns = 2 };
constexpr int kBadExpert = 3;  // an ErrorRecord's phase for a choice naming no expert (not a wait)

// The first failure of the backend: a wait that timed out (phase, the peer, the step), or a
// choice naming an expert outside [0, E) (kBadExpert, peer = the choice's index t·K + k,
// value = the id; the choice is dropped and the step completes).
struct ErrorRecord {
    int failed, phase, peer, value;
    unsigned long long step;
};

struct Layout {
    size_t counts_all, claims, recv_tokens, recv_scales, recv_meta, returned, flags, bytes;
};

size_t align_up(size_t x) { return (x + 255) & ~size_t{255}; }

Layout make_layout(const EpConfig& c) {
    const size_t W = c.world, E = c.num_experts, EL = c.local_experts(), M = c.rows_per_expert();
    const size_t nb = c.payload == Payload::kFp8 ? c.scale_blocks() : 0;
    Layout l{};
    size_t at = 0;
    const auto take = [&](size_t bytes) {
        const size_t o = at;
        at = align_up(at + bytes);
        return o;
    };
    l.counts_all = take(W * E * 4);
    l.claims = take(EL * 4);
    l.recv_tokens = take(EL * M * c.payload_bytes());
    l.recv_scales = take(EL * M * nb * 4);
    l.recv_meta = take(EL * M * 4);
    l.returned = take(size_t(c.max_tokens_per_rank) * c.experts_per_token * c.hidden * 2);
    l.flags = take(3 * W * 8);
    l.bytes = at;
    return l;
}

// Everything the kernels need, passed by value.
struct Params {
    int rank, world, E, EL, K, D, T_max, max_m, payload_bytes, nb;
    bool one_shot;  // max_m >= world · T_max: no row can be dropped (see the top of the file)
    Layout layout;
    char* peer_base[kMaxWorld];  // the window on each rank, as this GPU addresses it
    unsigned long long* step;    // this rank's step counter (device memory)
    unsigned int* done;          // block-completion counters of the two row kernels
    int* aborted;                // set by the first wait to time out: every later wait gives up at once
    int32_t* chunk_index;        // [T_max, K]
    int32_t* chunk_counts;       // [chunks, E]
    uint8_t* valid;              // [T_max, K]: the choice's row was not dropped
    int32_t* counts;             // [EL] rows received per local expert (the ExpertBatch's)
    ErrorRecord* error;          // host-mapped
    unsigned long long timeout_ns;
};

__device__ inline unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ inline void store_release_sys(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ inline unsigned long long load_acquire_sys(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

template <typename T>
__device__ inline T* at(const Params& p, int rank, size_t offset) {
    return reinterpret_cast<T*>(p.peer_base[rank] + offset);
}

__device__ inline unsigned long long* flag(const Params& p, int on_rank, int phase, int source) {
    return at<unsigned long long>(p, on_rank, p.layout.flags + (size_t(phase) * p.world + source) * 8);
}

// Thread 0 waits until every source's flag of `phase` (in this rank's window) reaches `step`;
// the block continues after it. False after a timeout (recorded), or at once while it spins once
// any wait of this backend has timed out: a dead peer costs one timeout, not one per block, kernel
// and layer (thousands of blocks a step, each spinning its own). The abort flag is device memory,
// read only while a flag is not there yet, so a wait whose flags have arrived pays nothing for it.
__device__ bool wait_all_sources(const Params& p, int phase, unsigned long long step) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        ok = 1;
        const unsigned long long start = now_ns();
        for (int s = 0; s < p.world && ok; ++s) {
            const unsigned long long* f = flag(p, p.rank, phase, s);
            while (load_acquire_sys(f) < step) {
                if (*reinterpret_cast<volatile int*>(p.aborted) != 0) {
                    ok = 0;
                    break;
                }
                if (now_ns() - start > p.timeout_ns) {
                    if (atomicCAS(&p.error->failed, 0, 1) == 0) {
                        p.error->phase = phase;
                        p.error->peer = s;
                        p.error->step = step;
                        __threadfence_system();
                    }
                    *reinterpret_cast<volatile int*>(p.aborted) = 1;
                    ok = 0;
                    break;
                }
            }
        }
    }
    __syncthreads();
    return ok != 0;
}

// The last block of a grid to get here raises `phase`'s flag for this rank on every rank, after
// every block's stores are visible system-wide; with `publish_step` it also stores `step` as the
// rank's step counter (the one-shot dispatch, whose blocks all read the counter before any gets here).
__device__ void finish_and_signal(const Params& p, unsigned int* done, int phase, unsigned long long step,
                                  bool publish_step = false) {
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x != 0) return;
    if (atomicAdd(done, 1u) != gridDim.x - 1) return;
    *done = 0;  // the next step's launch sees it reset (same stream)
    if (publish_step) *p.step = step;
    __threadfence_system();
    for (int r = 0; r < p.world; ++r) store_release_sys(flag(p, r, phase, p.rank), step);
}

// Copies `bytes` from src to dst with one warp, 16 bytes a lane when both are aligned.
__device__ inline void warp_copy(void* dst, const void* src, int bytes, int lane) {
    if ((bytes % 16) == 0 && (reinterpret_cast<uintptr_t>(dst) % 16) == 0 &&
        (reinterpret_cast<uintptr_t>(src) % 16) == 0) {
        const int4* s = static_cast<const int4*>(src);
        int4* d = static_cast<int4*>(dst);
        for (int i = lane; i < bytes / 16; i += 32) d[i] = s[i];
    } else {
        const uint8_t* s = static_cast<const uint8_t*>(src);
        uint8_t* d = static_cast<uint8_t*>(dst);
        for (int i = lane; i < bytes; i += 32) d[i] = s[i];
    }
}

// Per chunk of kChunk tokens: each choice's index among the chunk's choices of the same expert
// (in (token, choice) order), and the chunk's count per expert.
__global__ void __launch_bounds__(kThreads)
    route_index_kernel(Params p, const int32_t* __restrict__ num_tokens, const int32_t* __restrict__ topk) {
    __shared__ int32_t ids[kChunk * 32];
    const int T = min(max(*num_tokens, 0), p.T_max), t0 = blockIdx.x * kChunk, n = max(0, min(kChunk, T - t0));
    for (int i = threadIdx.x; i < n * p.K; i += kThreads) ids[i] = topk[size_t(t0) * p.K + i];
    __syncthreads();
    for (int e = threadIdx.x; e < p.E; e += kThreads) {
        int count = 0;
        for (int i = 0; i < n * p.K; ++i)
            if (ids[i] == e) p.chunk_index[size_t(t0) * p.K + i] = count++;
        p.chunk_counts[size_t(blockIdx.x) * p.E + e] = count;
    }
}

// One block: the step number, this rank's per-expert totals to every rank, the counts flag.
__global__ void __launch_bounds__(kThreads) counts_kernel(Params p, const int32_t* __restrict__ num_tokens) {
    __shared__ unsigned long long step;
    if (threadIdx.x == 0) step = ++*p.step;
    __syncthreads();
    const int T = min(max(*num_tokens, 0), p.T_max), chunks = (T + kChunk - 1) / kChunk;
    for (int e = threadIdx.x; e < p.E; e += kThreads) {
        int total = 0;
        for (int c = 0; c < chunks; ++c) total += p.chunk_counts[size_t(c) * p.E + e];
        for (int r = 0; r < p.world; ++r) at<int32_t>(p, r, p.layout.counts_all)[size_t(p.rank) * p.E + e] = total;
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0)
        for (int r = 0; r < p.world; ++r) store_release_sys(flag(p, r, kPhaseCounts, p.rank), step);
}

// Records a choice naming no expert (the first failure only) and drops it: no row anywhere, left
// out of the combine.
__device__ void drop_bad_choice(const Params& p, int i, int e, unsigned long long step, int lane) {
    if (lane != 0) return;
    p.valid[i] = 0;
    if (atomicCAS(&p.error->failed, 0, 1) == 0) {
        p.error->phase = kBadExpert;
        p.error->peer = i;
        p.error->value = e;
        p.error->step = step;
        __threadfence_system();
    }
}

// One warp stores choice i (token t) into row `row` of local expert `el` on rank `dst`, or marks it
// dropped past max_m.
__device__ inline void store_row(const Params& p, int i, int t, int dst, int el, int row,
                                 const uint8_t* __restrict__ tokens, const float* __restrict__ scales, int lane) {
    const bool kept = row >= 0 && row < p.max_m;
    if (lane == 0) p.valid[i] = kept;
    if (!kept) return;
    const size_t slot = size_t(el) * p.max_m + row;
    warp_copy(at<uint8_t>(p, dst, p.layout.recv_tokens) + slot * p.payload_bytes, tokens + size_t(t) * p.payload_bytes,
              p.payload_bytes, lane);
    if (p.nb > 0)
        for (int b = lane; b < p.nb; b += 32)
            at<float>(p, dst, p.layout.recv_scales)[slot * p.nb + b] = scales[size_t(t) * p.nb + b];
    if (lane == 0) at<int32_t>(p, dst, p.layout.recv_meta)[slot] = (p.rank * p.T_max + t) * p.K + i % p.K;
}

// Ordered: a warp per (token, choice): its row's place on the destination, then the row itself.
__global__ void __launch_bounds__(kThreads)
    dispatch_rows_kernel(Params p, const int32_t* __restrict__ num_tokens, const uint8_t* __restrict__ tokens,
                         const float* __restrict__ scales, const int32_t* __restrict__ topk) {
    const unsigned long long step = *p.step;
    if (wait_all_sources(p, kPhaseCounts, step)) {
        const int T = min(max(*num_tokens, 0), p.T_max), lane = threadIdx.x % 32;
        // counts_all was stored by other GPUs: read it through L2 (__ldcg).
        const int32_t* counts_all = at<int32_t>(p, p.rank, p.layout.counts_all);
        for (int i = blockIdx.x * kWarps + threadIdx.x / 32; i < T * p.K; i += gridDim.x * kWarps) {
            const int t = i / p.K, e = topk[i];
            if (e < 0 || e >= p.E) {  // route_index counted it nowhere
                drop_bad_choice(p, i, e, step, lane);
                continue;
            }
            // Rows of lower sources first, then this source's earlier choices of e.
            int row = p.chunk_index[i];
            for (int c = 0; c < t / kChunk; ++c) row += p.chunk_counts[size_t(c) * p.E + e];
            for (int s = 0; s < p.rank; ++s) row += __ldcg(counts_all + size_t(s) * p.E + e);
            store_row(p, i, t, e / p.EL, e % p.EL, row, tokens, scales, lane);
        }
    }
    finish_and_signal(p, p.done, kPhaseRows, step);
}

// One-shot: a warp per (token, choice) claims its row on the destination and stores it.
__global__ void __launch_bounds__(kThreads)
    dispatch_one_shot_kernel(Params p, const int32_t* __restrict__ num_tokens, const uint8_t* __restrict__ tokens,
                             const float* __restrict__ scales, const int32_t* __restrict__ topk) {
    const unsigned long long step = *p.step + 1;  // published by the last block, after every block read it
    const int T = min(max(*num_tokens, 0), p.T_max), lane = threadIdx.x % 32;
    for (int i = blockIdx.x * kWarps + threadIdx.x / 32; i < T * p.K; i += gridDim.x * kWarps) {
        const int t = i / p.K, e = topk[i], dst = e / p.EL, el = e % p.EL;
        if (e < 0 || e >= p.E) {
            drop_bad_choice(p, i, e, step, lane);
            continue;
        }
        int row = 0;
        if (lane == 0) row = atomicAdd_system(at<int>(p, dst, p.layout.claims) + el, 1);
        // Past max_m only if a token named an expert twice (the router never does): dropped.
        store_row(p, i, t, dst, el, __shfl_sync(0xffffffffu, row, 0), tokens, scales, lane);
    }
    finish_and_signal(p, p.done, kPhaseRows, step, true);
}

// One block: wait for every source's rows, then the local experts' counts (one-shot: the claims,
// reset for the next step; ordered: the sum of every source's counts).
__global__ void __launch_bounds__(kThreads) dispatch_wait_kernel(Params p) {
    const unsigned long long step = *p.step;
    if (!wait_all_sources(p, kPhaseRows, step)) return;
    const int32_t* counts_all = at<int32_t>(p, p.rank, p.layout.counts_all);
    int* claims = at<int>(p, p.rank, p.layout.claims);
    for (int el = threadIdx.x; el < p.EL; el += kThreads) {
        int total = 0;
        if (p.one_shot)
            total = atomicExch_system(claims + el, 0);
        else
            for (int s = 0; s < p.world; ++s) total += __ldcg(counts_all + size_t(s) * p.E + p.rank * p.EL + el);
        p.counts[el] = total;
    }
}

// A warp per received row: the expert's output back to the row's source, at (token, choice).
// Each block first lays the local experts' stored rows end to end (a prefix over their counts in
// shared memory), so the warps walk only the rows that arrived — not every expert's max_m slots,
// which with the default max_m (world · T_max) are mostly empty.
__global__ void __launch_bounds__(kThreads)
    combine_rows_kernel(Params p, const __nv_bfloat16* __restrict__ expert_out) {
    __shared__ int first[kMaxLocalExperts + 1];  // first[el]: stored rows of the experts before el
    const unsigned long long step = *p.step;
    const int lane = threadIdx.x % 32, row_bytes = p.D * 2;
    block_count_prefix<kThreads>(p.counts, p.EL, p.max_m, first);
    const int32_t* meta = at<int32_t>(p, p.rank, p.layout.recv_meta);
    for (int j = blockIdx.x * kWarps + threadIdx.x / 32; j < first[p.EL]; j += gridDim.x * kWarps) {
        const int el = segment_of(first, p.EL, j);
        const size_t i = size_t(el) * p.max_m + (j - first[el]);
        const int origin = __ldcg(meta + i), src = origin / (p.T_max * p.K), tk = origin % (p.T_max * p.K);
        warp_copy(at<uint8_t>(p, src, p.layout.returned) + size_t(tk) * row_bytes, expert_out + i * p.D, row_bytes,
                  lane);
    }
    finish_and_signal(p, p.done + 1, kPhaseReturns, step);
}

// A block per (token, 1024 values): wait for every rank's returns, then the weighted sum. (A grid
// of at most kRowBlocks rows striding over the tokens measured slower: 19.5 against 12.7 µs at 128
// tokens, 87 against 56 at 512, world 1 — PERF.md, 2026-12-03.) Past kCombineTokens tokens each
// block takes tokens t, t + kCombineTokens, ...: the grid follows T_max, the step budget a server
// builds the backend for (thousands of tokens), not the step's T, and a decode step would
// otherwise launch thousands of blocks that find nothing to do.
constexpr int kCombineChunk = 1024, kCombineTokens = 512;

__global__ void __launch_bounds__(kThreads)
    combine_reduce_kernel(Params p, const int32_t* __restrict__ num_tokens, const float* __restrict__ weight,
                          __nv_bfloat16* __restrict__ out, bool add) {
    const int T = min(max(*num_tokens, 0), p.T_max);
    // A rank without tokens still waits (blocks of token 0): its next dispatch may store into a
    // peer only once that peer's returns of this step arrived — after the peer reset its claims
    // and read its rows (see the top of the file).
    if (static_cast<int>(blockIdx.x) >= max(T, 1)) return;
    const unsigned long long step = *p.step;
    if (!wait_all_sources(p, kPhaseReturns, step)) return;
    const int end = min(p.D, static_cast<int>(blockIdx.y + 1) * kCombineChunk);
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        // Stored by other GPUs during this kernel's wait: read through L2 (__ldcg), never a stale L1 line.
        const unsigned short* ret = at<unsigned short>(p, p.rank, p.layout.returned) + size_t(t) * p.K * p.D;
        for (int d = blockIdx.y * kCombineChunk + threadIdx.x; d < end; d += kThreads) {
            float acc = add ? __bfloat162float(out[size_t(t) * p.D + d]) : 0.0f;  // same thread, same element
            for (int k = 0; k < p.K; ++k)
                if (p.valid[size_t(t) * p.K + k])
                    acc += weight[size_t(t) * p.K + k] *
                           __bfloat162float(__ushort_as_bfloat16(__ldcg(ret + size_t(k) * p.D + d)));
            out[size_t(t) * p.D + d] = __float2bfloat16(acc);
        }
    }
}

__global__ void peer_bases_kernel(ncclWindow_t win, int world, char** out) {
    const int r = threadIdx.x;
    if (r < world) out[r] = static_cast<char*>(ncclGetPeerPointer(win, 0, r));
}

const char* phase_name(int phase) {
    switch (phase) {
        case kPhaseCounts:
            return "dispatch (waiting for its token counts)";
        case kPhaseRows:
            return "dispatch (waiting for its rows)";
        default:
            return "combine (waiting for the expert outputs it holds)";
    }
}

class NvlinkEp final : public ExpertParallel {
  public:
    NvlinkEp(const EpConfig& c, ncclComm_t comm, cudaStream_t stream, const GpuEpOptions& o)
        : config_(c), comm_(comm), stream_(stream) {
        FANOUT_DEVICE_REQUIRE(c.world <= kMaxWorld, "nvlink EP: at most " + std::to_string(kMaxWorld) + " ranks, got " +
                                                        std::to_string(c.world));
        FANOUT_DEVICE_REQUIRE(c.local_experts() <= kMaxLocalExperts,
                              "nvlink EP: at most " + std::to_string(kMaxLocalExperts) + " experts per rank, got " +
                                  std::to_string(c.local_experts()));
        FANOUT_DEVICE_REQUIRE(c.experts_per_token <= 32,
                              "nvlink EP: top-k at most 32, got " + std::to_string(c.experts_per_token));
        ncclTeam_t lsa = ncclTeamLsa(comm);
        FANOUT_DEVICE_REQUIRE(lsa.nRanks == c.world,
                              "nvlink EP: the " + std::to_string(c.world) + " ranks are not one NVLink (LSA) domain (" +
                                  std::to_string(lsa.nRanks) + " ranks reachable by load/store); use the nccl backend");
        try {
            init(c, comm, o);
        } catch (...) {
            // No destructor runs for a throwing constructor: free what is this rank's alone. A
            // registered window stays (deregistering is collective, and the other ranks are not
            // here); the communicator's destruction or abort releases it.
            cudaFree(scratch_);
            if (error_host_ != nullptr) cudaFreeHost(error_host_);
            if (window_ == nullptr && window_mem_ != nullptr) ncclMemFree(window_mem_);
            throw;
        }
    }

    // Destructors do not throw: release what exists, ignore the codes.
    ~NvlinkEp() override {
        cudaStreamSynchronize(stream_);
        ncclCommWindowDeregister(comm_, window_);
        ncclMemFree(window_mem_);
        cudaFree(scratch_);
        cudaFreeHost(error_host_);
    }

    const EpConfig& config() const override { return config_; }
    void* device_stream() const override { return stream_; }

    void dispatch_send(const DispatchInput& in) override {
        num_tokens_ = in.num_tokens;
        if (params_.one_shot) {
            dispatch_one_shot_kernel<<<rows_blocks(size_t(params_.T_max) * params_.K), kThreads, 0, stream_>>>(
                params_, in.num_tokens, static_cast<const uint8_t*>(in.tokens), in.scales, in.topk_idx);
            FANOUT_CUDA_CHECK_LAUNCH("dispatch_one_shot_kernel");
            return;
        }
        const int chunks = (params_.T_max + kChunk - 1) / kChunk;
        route_index_kernel<<<chunks, kThreads, 0, stream_>>>(params_, in.num_tokens, in.topk_idx);
        FANOUT_CUDA_CHECK_LAUNCH("route_index_kernel");
        counts_kernel<<<1, kThreads, 0, stream_>>>(params_, in.num_tokens);
        FANOUT_CUDA_CHECK_LAUNCH("counts_kernel");
        dispatch_rows_kernel<<<rows_blocks(size_t(params_.T_max) * params_.K), kThreads, 0, stream_>>>(
            params_, in.num_tokens, static_cast<const uint8_t*>(in.tokens), in.scales, in.topk_idx);
        FANOUT_CUDA_CHECK_LAUNCH("dispatch_rows_kernel");
    }

    void dispatch_recv() override {
        dispatch_wait_kernel<<<1, kThreads, 0, stream_>>>(params_);
        FANOUT_CUDA_CHECK_LAUNCH("dispatch_wait_kernel");
    }

    ExpertBatch recv_batch() const override { return batch_; }

    void combine_send(const void* expert_out) override {
        // Rows received: at most every choice of every rank, and at most the slots.
        const size_t most =
            std::min(size_t(params_.EL) * params_.max_m, size_t(params_.world) * params_.T_max * params_.K);
        combine_rows_kernel<<<rows_blocks(most), kThreads, 0, stream_>>>(params_,
                                                                         static_cast<const __nv_bfloat16*>(expert_out));
        FANOUT_CUDA_CHECK_LAUNCH("combine_rows_kernel");
    }

    void combine_recv(const float* topk_weight, void* out) override { reduce(topk_weight, out, false); }
    void combine_recv_add(const float* topk_weight, void* residual) override { reduce(topk_weight, residual, true); }

    void raise_if_failed() override {
        const volatile ErrorRecord& v = *error_host_;  // written by the device through the mapping
        if (!v.failed) return;
        ErrorRecord e;
        e.phase = v.phase;
        e.peer = v.peer;
        e.value = v.value;
        e.step = v.step;
        if (e.phase == kBadExpert)
            ::fanout::throw_message(
                __FILE__, __LINE__,
                ("nvlink EP rank " + std::to_string(config_.rank) + ": token " +
                 std::to_string(e.peer / config_.experts_per_token) + " choice " +
                 std::to_string(e.peer % config_.experts_per_token) + " names an expert outside [0, " +
                 std::to_string(config_.num_experts) + ") (" + std::to_string(e.value) + ") at step " +
                 std::to_string(e.step) + "; the choice was dropped")
                    .c_str());
        ::fanout::throw_message(__FILE__, __LINE__,
                                ("nvlink EP rank " + std::to_string(config_.rank) + ": timed out in " +
                                 phase_name(e.phase) + " waiting for rank " + std::to_string(e.peer) + " at step " +
                                 std::to_string(e.step) + " (is that rank running the same steps?)")
                                    .c_str());
    }

  private:
    void init(const EpConfig& c, ncclComm_t comm, const GpuEpOptions& o) {
        const Layout layout = make_layout(c);
        FANOUT_NCCL_CHECK(ncclMemAlloc(&window_mem_, layout.bytes));
        // Zeroed before the (collective) registration, so no peer can store into it earlier.
        FANOUT_CUDA_CHECK(cudaMemset(window_mem_, 0, layout.bytes));
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        FANOUT_NCCL_CHECK(ncclCommWindowRegister(comm, window_mem_, layout.bytes, &window_, NCCL_WIN_COLL_SYMMETRIC));

        Params& p = params_;
        p.rank = c.rank;
        p.world = c.world;
        p.E = c.num_experts;
        p.EL = c.local_experts();
        p.K = c.experts_per_token;
        p.D = c.hidden;
        p.T_max = c.max_tokens_per_rank;
        p.max_m = c.rows_per_expert();
        p.one_shot = !c.rows_droppable();
        p.payload_bytes = c.payload_bytes();
        p.nb = c.payload == Payload::kFp8 ? c.scale_blocks() : 0;
        p.layout = layout;
        p.timeout_ns = static_cast<unsigned long long>(o.timeout_ms) * 1000000ull;
        const size_t choices = size_t(p.T_max) * p.K, chunks = (p.T_max + kChunk - 1) / kChunk;
        FANOUT_CUDA_CHECK(cudaMalloc(&scratch_, 64 + choices * 4 + chunks * p.E * 4 + choices + size_t(p.EL) * 4 +
                                                    size_t(kMaxWorld) * sizeof(char*)));
        // On the stream every kernel of this backend runs on (the legacy stream's memset would not
        // be ordered before them), waited for below.
        FANOUT_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, 64, stream_));
        char* s = static_cast<char*>(scratch_);
        p.step = reinterpret_cast<unsigned long long*>(s);
        p.done = reinterpret_cast<unsigned int*>(s + 16);
        p.aborted = reinterpret_cast<int*>(s + 32);
        s += 64;
        char** bases = reinterpret_cast<char**>(s);
        s += size_t(kMaxWorld) * sizeof(char*);
        p.chunk_index = reinterpret_cast<int32_t*>(s);
        s += choices * 4;
        p.chunk_counts = reinterpret_cast<int32_t*>(s);
        s += chunks * p.E * 4;
        p.counts = reinterpret_cast<int32_t*>(s);
        s += size_t(p.EL) * 4;
        p.valid = reinterpret_cast<uint8_t*>(s);
        FANOUT_CUDA_CHECK(cudaHostAlloc(&error_host_, sizeof(ErrorRecord), cudaHostAllocMapped));
        *error_host_ = {};
        FANOUT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&p.error), error_host_, 0));
        peer_bases_kernel<<<1, kMaxWorld, 0, stream_>>>(window_, c.world, bases);
        FANOUT_CUDA_CHECK_LAUNCH("peer_bases_kernel");
        FANOUT_CUDA_CHECK(
            cudaMemcpyAsync(p.peer_base, bases, size_t(c.world) * sizeof(char*), cudaMemcpyDeviceToHost, stream_));
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream_));
        char* mine = static_cast<char*>(window_mem_);
        batch_.counts = p.counts;
        batch_.tokens = mine + layout.recv_tokens;
        batch_.scales = p.nb > 0 ? reinterpret_cast<const float*>(mine + layout.recv_scales) : nullptr;
        batch_.max_m = p.max_m;
    }

    void reduce(const float* topk_weight, void* out, bool add) {
        FANOUT_DEVICE_REQUIRE(num_tokens_ != nullptr, "nvlink EP: combine_recv before dispatch_send");
        const dim3 grid(std::min(params_.T_max, kCombineTokens), (params_.D + kCombineChunk - 1) / kCombineChunk);
        combine_reduce_kernel<<<grid, kThreads, 0, stream_>>>(params_, num_tokens_, topk_weight,
                                                              static_cast<__nv_bfloat16*>(out), add);
        FANOUT_CUDA_CHECK_LAUNCH("combine_reduce_kernel");
    }
    // Enough warps for `items` rows, at most kRowBlocks blocks (grid-stride beyond).
    static int rows_blocks(size_t items) {
        return static_cast<int>(std::max<size_t>(1, std::min<size_t>(kRowBlocks, (items + kWarps - 1) / kWarps)));
    }

    EpConfig config_;
    ncclComm_t comm_;
    cudaStream_t stream_;
    void* window_mem_ = nullptr;
    ncclWindow_t window_{};
    void* scratch_ = nullptr;
    ErrorRecord* error_host_ = nullptr;
    Params params_{};
    ExpertBatch batch_{};
    const int32_t* num_tokens_ = nullptr;
};

}  // namespace

std::unique_ptr<ExpertParallel> make_nvlink_ep(const EpConfig& config, ncclComm_t comm, cudaStream_t stream,
                                               const GpuEpOptions& options) {
    return std::make_unique<NvlinkEp>(config, comm, stream, options);
}

}  // namespace fanout::comm
