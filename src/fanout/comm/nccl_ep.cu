// The `nccl` EP backend (ep_gpu.h): host-side grouped ncclSend/ncclRecv of FIXED-SIZE per-peer
// packets, so nothing the host enqueues depends on the step's token counts (they stay on the
// device): no host synchronization, capturable in a CUDA graph, replayable with other counts. It
// works over whatever transport NCCL picks (NVLink, IB, sockets): the portable path and the
// baseline for `nvlink`. It is not the fast path: every packet travels at its padded size.
//
// One step, all on the backend's stream `s` except the NCCL exchanges, which run on a side stream
// forked from `s` after packing and joined back by the matching recv half — so work the caller
// enqueues between a send half and its recv half (the shared expert) overlaps the transfer:
//   dispatch_send: route (1 block: per-expert positions in (token, choice) order, packet headers,
//                  each choice's slot) → pack (rows into the per-destination packets) → fork:
//                  grouped send/recv of whole packets with every other rank
//   dispatch_recv: join → unpack (rows into the masked layout, counts)
//   combine_send:  gather (each received row's expert output into the return packet of its
//                  source rank, at the row's index in the source's packet) → fork: grouped
//                  send/recv of whole return packets
//   combine_recv:  join → weighted sum per token into out.
// The packet of a rank to itself is never sent: the unpack and the combine read it in place.
//
// Packets. cap = max_tokens_per_rank · min(top_k, local_experts) rows per (source, destination)
// pair — a token sends at most one row per expert it chose on a rank, since a token's top-k
// experts are distinct (a duplicate is reported by raise_if_failed and its repeats dropped).
//   dispatch packet:  [n, cnt[L]] (16-byte padded header: rows in the packet, rows per local expert)
//                     [cap × {local expert, position at that expert, src token, choice}]
//                     [cap × payload row, padded to 16 bytes] [cap × scale row (fp8), padded to 16]
//                     rows expert-major, each expert's rows in (token, choice) order;
//   return packet:    [cap × int32 valid] (padded to 16) [cap × bf16 row, padded to 16 bytes].
// The receiver places row i of source s's packet at expert e's row Σ_{s'<s} cnt_{s'}[e] + position,
// which is the (source rank, token, choice) order of the masked layout (rows ≥ max_m dropped).
//
// Errors: bad inputs (token count outside [0, max], expert ids outside [0, E), a repeated expert
// in one token) are clamped/dropped on the device and recorded in host-mapped memory;
// raise_if_failed() (after synchronizing the stream) throws naming the first. NCCL host calls fail
// synchronously (thrown at the call); NCCL's own waits on peers are governed by NCCL — a missing
// peer hangs the stream unless NCCL's timeouts/abort fire — and raise_if_failed() also polls
// ncclCommGetAsyncError and throws naming NCCL's error. This backend has no device waits of its
// own, so GpuEpOptions::timeout_ms does not apply to it.
//
// fmt-free (built by nvcc): errors go through fanout/core/api_error.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "fanout/comm/ep_gpu.h"
#include "fanout/comm/nccl_check.h"
#include "fanout/core/api_error.h"
#include "fanout/core/cuda_check.h"

// Wraps an NCCL host call: a failure throws fanout::Error naming the statement and NCCL's message.

namespace fanout::comm {
namespace {

constexpr int kRouteThreads = 1024;
constexpr int kCopyThreads = 256;  // 8 warps, a warp per row
constexpr int kWarpsPerBlock = kCopyThreads / 32;

size_t pad16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// What went wrong on the device first (host-mapped; code 0: nothing).
enum ErrorCode : int { kOk = 0, kBadTokenCount = 1, kBadExpert = 2, kRepeatedExpert = 3 };
struct DeviceError {
    int code, token, choice, value;
};

__device__ void record_error(DeviceError* err, int code, int token, int choice, int value) {
    if (atomicCAS(&err->code, 0, -1) == 0) {  // first writer fills the record, then publishes the code
        err->token = token;
        err->choice = choice;
        err->value = value;
        __threadfence_system();
        atomicExch(&err->code, code);
    }
}

// Byte offsets inside one packet; every section starts on 16 bytes.
struct PacketLayout {
    // dispatch
    size_t meta = 0, payload = 0, scales = 0, dispatch_bytes = 0;
    int payload_stride = 0, scale_stride = 0;
    // return
    size_t rows = 0, return_bytes = 0;
    int row_stride = 0;
};

struct Shape {
    int rank, world, num_experts, top_k, local_experts, max_tokens, max_m, cap;
    int payload_bytes, scale_bytes;  // scale_bytes: 0 for a bf16 payload
    int hidden;
};

// Copies `bytes` from src to dst with the lanes of one warp, in the widest access both allow
// (`width`: a power of two ≤ 16 dividing bytes and both addresses).
template <int kWidth>
__device__ void warp_copy_as(void* dst, const void* src, int bytes, int lane) {
    using V = std::conditional_t<
        kWidth == 16, int4,
        std::conditional_t<kWidth == 8, int2,
                           std::conditional_t<kWidth == 4, int, std::conditional_t<kWidth == 2, short, char>>>>;
    auto* d = static_cast<V*>(dst);
    const auto* s = static_cast<const V*>(src);
    for (int i = lane; i < bytes / kWidth; i += 32) d[i] = s[i];
}

__device__ void warp_copy(void* dst, const void* src, int bytes, int width, int lane) {
    switch (width) {
        case 16:
            warp_copy_as<16>(dst, src, bytes, lane);
            break;
        case 8:
            warp_copy_as<8>(dst, src, bytes, lane);
            break;
        case 4:
            warp_copy_as<4>(dst, src, bytes, lane);
            break;
        case 2:
            warp_copy_as<2>(dst, src, bytes, lane);
            break;
        default:
            warp_copy_as<1>(dst, src, bytes, lane);
            break;
    }
}

// The widest access (16, 8, 4, 2 or 1 bytes) that divides `bytes` and the address of `base`, so
// every row base + i·bytes is aligned to it (internal buffers are 256-byte aligned; the caller's
// may not be).
int access_width(int bytes, const void* base = nullptr) {
    for (int w = 16; w > 1; w /= 2)
        if (bytes % w == 0 && reinterpret_cast<uintptr_t>(base) % w == 0) return w;
    return 1;
}

// A dispatch packet's header: [0] rows in the packet, [1 + le] rows for local expert le.
__device__ int* packet_header(uint8_t* packet) { return reinterpret_cast<int*>(packet); }
__device__ const int* packet_header(const uint8_t* packet) { return reinterpret_cast<const int*>(packet); }
// The rows a received packet says it holds, kept within the packet's capacity (a peer's number:
// never a reason to read or write past the buffers).
__device__ int packet_rows(const uint8_t* packet, int cap) { return min(max(packet_header(packet)[0], 0), cap); }

// One block: the step's routing. After it, for every valid choice i = t·K + k,
// slot[i] = dest · cap + (its row in dest's packet); the packets' headers and row metadata are
// written; *step_tokens = T. Uses bits [E, words] and prefix [E, words] as scratch.
__global__ void __launch_bounds__(kRouteThreads)
    route_kernel(Shape sh, const int32_t* num_tokens, const int32_t* topk, uint32_t* bits, uint32_t* prefix,
                 int* expert_offset, int* slot, int* step_tokens, uint8_t* send_packets, PacketLayout lay,
                 DeviceError* err) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, K = sh.top_k, E = sh.num_experts,
              L = sh.local_experts;
    int T = *num_tokens;
    if (T < 0 || T > sh.max_tokens) {
        if (tid == 0) record_error(err, kBadTokenCount, -1, -1, T);
        T = T < 0 ? 0 : sh.max_tokens;
    }
    const int words = (T + 31) / 32;
    for (int i = tid; i < E * words; i += kRouteThreads) bits[i] = 0;
    __syncthreads();
    // Token t chose expert e: bit t of expert e's row. A bit already set is a repeated expert.
    for (int i = tid; i < T * K; i += kRouteThreads) {
        const int t = i / K, e = topk[i];
        if (e < 0 || e >= E) {
            record_error(err, kBadExpert, t, i % K, e);
            continue;
        }
        const uint32_t bit = 1u << (t % 32);
        if (atomicOr(&bits[e * words + t / 32], bit) & bit) record_error(err, kRepeatedExpert, t, i % K, e);
    }
    __syncthreads();
    // prefix[e, w] = tokens before word w that chose e; expert_offset[e] = rows of e (for now).
    for (int e = warp; e < E; e += kRouteThreads / 32) {
        int running = 0;
        for (int base = 0; base < words; base += 32) {
            const int w = base + lane;
            const int v = w < words ? __popc(bits[e * words + w]) : 0;
            int incl = v;
            for (int o = 1; o < 32; o *= 2) {
                const int n = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += n;
            }
            if (w < words) prefix[e * words + w] = running + incl - v;
            running += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) expert_offset[e] = running;
    }
    __syncthreads();
    // Per destination (a warp each): header = rows and rows per local expert; expert_offset[e] =
    // the first row of e's rows in the packet (experts in order).
    for (int d = warp; d < sh.world; d += kRouteThreads / 32) {
        int* hdr = packet_header(send_packets + size_t(d) * lay.dispatch_bytes);
        int running = 0;
        for (int base = 0; base < L; base += 32) {
            const int le = base + lane, e = d * L + le;
            const int v = le < L ? expert_offset[e] : 0;
            int incl = v;
            for (int o = 1; o < 32; o *= 2) {
                const int n = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += n;
            }
            __syncwarp();
            if (le < L) {
                hdr[1 + le] = v;
                expert_offset[e] = running + incl - v;
            }
            running += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) hdr[0] = running;
    }
    __syncthreads();
    // Each choice's row: its expert's first row + the tokens before it that chose the expert.
    for (int i = tid; i < T * K; i += kRouteThreads) {
        const int t = i / K, k = i % K, e = topk[i];
        bool keep = e >= 0 && e < E;
        for (int j = 0; keep && j < k; ++j) keep = topk[t * K + j] != e;  // a repeat: the first copy only
        if (!keep) {
            slot[i] = -1;
            continue;
        }
        const uint32_t word = bits[e * words + t / 32];
        const int pos_e = prefix[e * words + t / 32] + __popc(word & ((1u << (t % 32)) - 1u));
        const int d = e / L, row = expert_offset[e] + pos_e;
        slot[i] = d * sh.cap + row;
        int4* meta = reinterpret_cast<int4*>(send_packets + size_t(d) * lay.dispatch_bytes + lay.meta);
        meta[row] = make_int4(e % L, pos_e, t, k);
    }
    if (tid == 0) *step_tokens = T;
}

// A warp per choice: copies token t's payload (and scales) into its row of the packet.
__global__ void __launch_bounds__(kCopyThreads)
    pack_kernel(Shape sh, const int* step_tokens, const uint8_t* tokens, const float* scales, const int* slot,
                uint8_t* send_packets, PacketLayout lay, int payload_width, int scale_width) {
    const int lane = threadIdx.x % 32, n = *step_tokens * sh.top_k;
    for (int i = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32; i < n; i += gridDim.x * kWarpsPerBlock) {
        const int s = slot[i];
        if (s < 0) continue;
        const int t = i / sh.top_k, d = s / sh.cap, row = s % sh.cap;
        uint8_t* packet = send_packets + size_t(d) * lay.dispatch_bytes;
        warp_copy(packet + lay.payload + size_t(row) * lay.payload_stride, tokens + size_t(t) * sh.payload_bytes,
                  sh.payload_bytes, payload_width, lane);
        if (sh.scale_bytes > 0)
            warp_copy(packet + lay.scales + size_t(row) * lay.scale_stride,
                      reinterpret_cast<const uint8_t*>(scales) + size_t(t) * sh.scale_bytes, sh.scale_bytes,
                      scale_width, lane);
    }
}

// The packet from source s: in the receive buffer, or this rank's own in the send buffer.
__device__ const uint8_t* packet_from(int s, int rank, const uint8_t* send_packets, const uint8_t* recv_packets,
                                      size_t bytes) {
    return (s == rank ? send_packets : recv_packets) + size_t(s) * bytes;
}

// Counts, and a warp per received row: its place in the masked layout (row_of, -1 when dropped
// past max_m) and its payload and scales there.
__global__ void __launch_bounds__(kCopyThreads)
    unpack_kernel(Shape sh, const uint8_t* send_packets, const uint8_t* recv_packets, PacketLayout lay, int* counts,
                  uint8_t* out_tokens, float* out_scales, int* row_of, int payload_width, int scale_width) {
    const int lane = threadIdx.x % 32;
    if (blockIdx.x == 0)
        for (int le = threadIdx.x; le < sh.local_experts; le += kCopyThreads) {
            int c = 0;
            for (int s = 0; s < sh.world; ++s)
                c += packet_header(packet_from(s, sh.rank, send_packets, recv_packets, lay.dispatch_bytes))[1 + le];
            counts[le] = c;
        }
    const int gwarp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, nwarps = gridDim.x * kWarpsPerBlock;
    for (int s = 0; s < sh.world; ++s) {
        const uint8_t* packet = packet_from(s, sh.rank, send_packets, recv_packets, lay.dispatch_bytes);
        const int n = packet_rows(packet, sh.cap);
        for (int i = gwarp; i < n; i += nwarps) {
            const int4 meta = reinterpret_cast<const int4*>(packet + lay.meta)[i];
            // A local expert out of range (a malformed packet) drops the row like one past max_m.
            const int le = min(max(meta.x, 0), sh.local_experts - 1);
            // Rows of expert le from the sources before s.
            int before = 0;
            for (int s2 = lane; s2 < s; s2 += 32)
                before +=
                    packet_header(packet_from(s2, sh.rank, send_packets, recv_packets, lay.dispatch_bytes))[1 + le];
            for (int o = 16; o > 0; o /= 2) before += __shfl_xor_sync(0xffffffffu, before, o);
            const int row = before + meta.y;
            const bool kept = meta.x == le && row >= 0 && row < sh.max_m;
            const size_t dst = size_t(le) * sh.max_m + row;
            if (lane == 0) row_of[size_t(s) * sh.cap + i] = kept ? int(dst) : -1;
            if (!kept) continue;
            warp_copy(out_tokens + dst * sh.payload_bytes, packet + lay.payload + size_t(i) * lay.payload_stride,
                      sh.payload_bytes, payload_width, lane);
            if (sh.scale_bytes > 0)
                warp_copy(reinterpret_cast<uint8_t*>(out_scales) + dst * sh.scale_bytes,
                          packet + lay.scales + size_t(i) * lay.scale_stride, sh.scale_bytes, scale_width, lane);
        }
    }
}

// A warp per received row: its expert output into the return packet of its source, at the row's
// index in the source's dispatch packet, with a valid flag (0 for a row dropped past max_m).
__global__ void __launch_bounds__(kCopyThreads)
    gather_kernel(Shape sh, const uint8_t* send_packets, const uint8_t* recv_packets, PacketLayout lay,
                  const int* row_of, const uint16_t* expert_out, uint8_t* return_packets, int row_width) {
    const int lane = threadIdx.x % 32, row_bytes = sh.hidden * 2;
    const int gwarp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, nwarps = gridDim.x * kWarpsPerBlock;
    for (int s = 0; s < sh.world; ++s) {
        const int n = packet_rows(packet_from(s, sh.rank, send_packets, recv_packets, lay.dispatch_bytes), sh.cap);
        uint8_t* ret = return_packets + size_t(s) * lay.return_bytes;
        for (int i = gwarp; i < n; i += nwarps) {
            const int r = row_of[size_t(s) * sh.cap + i];
            if (lane == 0) reinterpret_cast<int*>(ret)[i] = r >= 0;
            if (r >= 0)
                warp_copy(ret + lay.rows + size_t(i) * lay.row_stride, expert_out + size_t(r) * sh.hidden, row_bytes,
                          row_width, lane);
        }
    }
}

// A block per token: out[t] = Σ_k weight[t, k] · (its returned row) — from out[t] when `add` — f32
// sums, bf16 out.
template <int kVec>  // bf16 values per access: 8 when hidden % 8 == 0, else 1
__global__ void __launch_bounds__(kCopyThreads)
    combine_kernel(Shape sh, const int* step_tokens, const int* slot, const float* weight, const uint8_t* return_send,
                   const uint8_t* return_recv, PacketLayout lay, uint16_t* out, bool add) {
    const int T = *step_tokens, K = sh.top_k, H = sh.hidden;
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        for (int c0 = threadIdx.x * kVec; c0 < H; c0 += kCopyThreads * kVec) {
            float acc[kVec];
            if (add && kVec == 8) {  // same thread, same elements as the store below
                const int4 v = *reinterpret_cast<const int4*>(out + size_t(t) * H + c0);
                const auto* h = reinterpret_cast<const __nv_bfloat16*>(&v);
                for (int j = 0; j < kVec; ++j) acc[j] = __bfloat162float(h[j]);
            } else {
                for (int j = 0; j < kVec; ++j)
                    acc[j] =
                        add ? __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(out + size_t(t) * H + c0 + j))
                            : 0.0f;
            }
            for (int k = 0; k < K; ++k) {
                const int s = slot[t * K + k];
                if (s < 0) continue;
                const int d = s / sh.cap, i = s % sh.cap;
                const uint8_t* ret = (d == sh.rank ? return_send : return_recv) + size_t(d) * lay.return_bytes;
                if (reinterpret_cast<const int*>(ret)[i] == 0) continue;  // dropped at the expert's rank
                const float w = weight[t * K + k];
                const auto* row = reinterpret_cast<const __nv_bfloat16*>(ret + lay.rows + size_t(i) * lay.row_stride);
                if constexpr (kVec == 8) {
                    const int4 v = *reinterpret_cast<const int4*>(row + c0);
                    const auto* h = reinterpret_cast<const __nv_bfloat16*>(&v);
                    for (int j = 0; j < 8; ++j) acc[j] += w * __bfloat162float(h[j]);
                } else {
                    acc[0] += w * __bfloat162float(row[c0]);
                }
            }
            if constexpr (kVec == 8) {
                int4 v;
                auto* h = reinterpret_cast<__nv_bfloat16*>(&v);
                for (int j = 0; j < 8; ++j) h[j] = __float2bfloat16_rn(acc[j]);
                *reinterpret_cast<int4*>(out + size_t(t) * H + c0) = v;
            } else {
                const __nv_bfloat16 h = __float2bfloat16_rn(acc[0]);
                out[size_t(t) * H + c0] = *reinterpret_cast<const uint16_t*>(&h);
            }
        }
    }
}

struct CudaFree {
    void operator()(void* p) const { cudaFree(p); }
};
template <typename T>
using DevicePtr = std::unique_ptr<T, CudaFree>;

template <typename T>
DevicePtr<T> device_alloc(size_t count) {
    void* p = nullptr;
    FANOUT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
    return DevicePtr<T>(static_cast<T*>(p));
}

const char* error_text(int code) {
    switch (code) {
        case kBadTokenCount:
            return "has a token count outside [0, max_tokens_per_rank]";
        case kBadExpert:
            return "names an expert outside [0, num_experts)";
        case kRepeatedExpert:
            return "chose the same expert twice (top-k experts must be distinct)";
        default:
            return "failed";
    }
}

class NcclEp final : public ExpertParallel {
  public:
    NcclEp(const EpConfig& c, ncclComm_t comm, cudaStream_t stream) : config_(c), comm_(comm), stream_(stream) {
        const int L = c.local_experts(), K = c.experts_per_token, T = c.max_tokens_per_rank, M = c.rows_per_expert();
        shape_ = {c.rank,
                  c.world,
                  c.num_experts,
                  K,
                  L,
                  T,
                  M,
                  T * std::min(K, L),
                  c.payload_bytes(),
                  c.payload == Payload::kFp8 ? c.scale_blocks() * 4 : 0,
                  c.hidden};
        const size_t cap = size_t(shape_.cap);
        lay_.payload_stride = int(pad16(shape_.payload_bytes));
        lay_.scale_stride = int(pad16(shape_.scale_bytes));
        lay_.meta = pad16(sizeof(int) * (1 + size_t(L)));
        lay_.payload = lay_.meta + cap * 16;
        lay_.scales = lay_.payload + cap * lay_.payload_stride;
        lay_.dispatch_bytes = lay_.scales + cap * lay_.scale_stride;
        lay_.row_stride = int(pad16(size_t(c.hidden) * 2));
        lay_.rows = pad16(cap * sizeof(int));
        lay_.return_bytes = lay_.rows + cap * lay_.row_stride;
        payload_width_ = access_width(shape_.payload_bytes);
        scale_width_ = access_width(std::max(shape_.scale_bytes, 4));

        FANOUT_CUDA_CHECK(cudaGetDevice(&device_));
        FANOUT_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_));
        const size_t W = size_t(c.world), words = (size_t(T) + 31) / 32, E = size_t(c.num_experts);
        bits_ = device_alloc<uint32_t>(E * words);
        prefix_ = device_alloc<uint32_t>(E * words);
        expert_offset_ = device_alloc<int>(E);
        slot_ = device_alloc<int>(size_t(T) * K);
        step_tokens_ = device_alloc<int>(1);
        send_ = device_alloc<uint8_t>(W * lay_.dispatch_bytes);
        recv_ = device_alloc<uint8_t>(W * lay_.dispatch_bytes);
        row_of_ = device_alloc<int>(W * cap);
        return_send_ = device_alloc<uint8_t>(W * lay_.return_bytes);
        return_recv_ = device_alloc<uint8_t>(W * lay_.return_bytes);
        counts_ = device_alloc<int>(size_t(L));
        tokens_ = device_alloc<uint8_t>(size_t(L) * M * shape_.payload_bytes);
        if (shape_.scale_bytes > 0) scales_ = device_alloc<float>(size_t(L) * M * c.scale_blocks());
        // Before the first step: no rows anywhere (a recv_batch() read before any step sees zeros).
        FANOUT_CUDA_CHECK(cudaMemsetAsync(counts_.get(), 0, sizeof(int) * L, stream_));
        FANOUT_CUDA_CHECK(cudaMemsetAsync(step_tokens_.get(), 0, sizeof(int), stream_));
        // The device buffers above free themselves (members) if what follows throws; these do not.
        try {
            FANOUT_CUDA_CHECK(
                cudaHostAlloc(reinterpret_cast<void**>(&error_), sizeof(DeviceError), cudaHostAllocMapped));
            *error_ = {};
            FANOUT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_dev_), error_, 0));
            FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
            for (cudaEvent_t* e : {&dispatch_fork_, &dispatch_join_, &combine_fork_, &combine_join_})
                FANOUT_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
        } catch (...) {
            release();
            throw;
        }
    }

    ~NcclEp() override { release(); }

    const EpConfig& config() const override { return config_; }
    void* device_stream() const override { return stream_; }

    void dispatch_send(const DispatchInput& in) override {
        FANOUT_DEVICE_REQUIRE(in.num_tokens != nullptr && in.topk_idx != nullptr,
                              "EP nccl: dispatch input needs num_tokens and topk_idx");
        FANOUT_DEVICE_REQUIRE(in.tokens != nullptr && (shape_.scale_bytes == 0 || in.scales != nullptr),
                              "EP nccl: dispatch input needs tokens (and scales for an fp8 payload)");
        route_kernel<<<1, kRouteThreads, 0, stream_>>>(shape_, in.num_tokens, in.topk_idx, bits_.get(), prefix_.get(),
                                                       expert_offset_.get(), slot_.get(), step_tokens_.get(),
                                                       send_.get(), lay_, error_dev_);
        FANOUT_CUDA_CHECK_LAUNCH("route_kernel");
        pack_kernel<<<grid_for(size_t(shape_.max_tokens) * shape_.top_k), kCopyThreads, 0, stream_>>>(
            shape_, step_tokens_.get(), static_cast<const uint8_t*>(in.tokens), in.scales, slot_.get(), send_.get(),
            lay_, access_width(shape_.payload_bytes, in.tokens),
            access_width(std::max(shape_.scale_bytes, 4), in.scales));
        FANOUT_CUDA_CHECK_LAUNCH("pack_kernel");
        exchange(send_.get(), recv_.get(), lay_.dispatch_bytes, dispatch_fork_, dispatch_join_);
    }

    void dispatch_recv() override {
        FANOUT_CUDA_CHECK(cudaStreamWaitEvent(stream_, dispatch_join_, 0));
        unpack_kernel<<<grid_for(size_t(config_.world) * shape_.cap), kCopyThreads, 0, stream_>>>(
            shape_, send_.get(), recv_.get(), lay_, counts_.get(), tokens_.get(), scales_.get(), row_of_.get(),
            payload_width_, scale_width_);
        FANOUT_CUDA_CHECK_LAUNCH("unpack_kernel");
    }

    ExpertBatch recv_batch() const override { return {counts_.get(), tokens_.get(), scales_.get(), shape_.max_m}; }

    void combine_send(const void* expert_out_bytes) override {
        const auto* expert_out = static_cast<const uint16_t*>(expert_out_bytes);  // bf16 (no f32 payload here)
        FANOUT_DEVICE_REQUIRE(expert_out != nullptr, "EP nccl: combine_send needs expert outputs");
        gather_kernel<<<grid_for(size_t(config_.world) * shape_.cap), kCopyThreads, 0, stream_>>>(
            shape_, send_.get(), recv_.get(), lay_, row_of_.get(), expert_out, return_send_.get(),
            access_width(config_.hidden * 2, expert_out));
        FANOUT_CUDA_CHECK_LAUNCH("gather_kernel");
        exchange(return_send_.get(), return_recv_.get(), lay_.return_bytes, combine_fork_, combine_join_);
    }

    void combine_recv(const float* topk_weight, void* out) override { reduce(topk_weight, out, false); }
    void combine_recv_add(const float* topk_weight, void* residual) override { reduce(topk_weight, residual, true); }

    void raise_if_failed() override {
        ncclResult_t async = ncclSuccess;
        FANOUT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
        if (async != ncclSuccess && async != ncclInProgress) {
            const std::string msg = std::string("EP nccl rank ") + std::to_string(config_.rank) +
                                    ": the communicator failed asynchronously: " + ncclGetErrorString(async) + " (" +
                                    ncclGetLastError(comm_) + ")";
            ::fanout::throw_message(__FILE__, __LINE__, msg.c_str());
        }
        const volatile DeviceError* mapped = error_;  // written by the device
        const DeviceError e{mapped->code, mapped->token, mapped->choice, mapped->value};
        if (e.code > 0) {
            *error_ = {};  // reported once
            std::string msg = std::string("EP nccl dispatch: rank ") + std::to_string(config_.rank);
            if (e.code == kBadTokenCount)
                msg += " has " + std::to_string(e.value) + " tokens, outside [0, " +
                       std::to_string(config_.max_tokens_per_rank) + "] (clamped)";
            else
                msg += " token " + std::to_string(e.token) + " choice " + std::to_string(e.choice) + " " +
                       error_text(e.code) + ": expert " + std::to_string(e.value) + " (the choice was dropped)";
            ::fanout::throw_message(__FILE__, __LINE__, msg.c_str());
        }
    }

  private:
    // Destructors do not throw: release what exists, ignore the codes.
    void release() {
        for (cudaEvent_t* e : {&dispatch_fork_, &dispatch_join_, &combine_fork_, &combine_join_}) {
            if (*e != nullptr) cudaEventDestroy(*e);
            *e = nullptr;
        }
        if (side_ != nullptr) cudaStreamDestroy(side_);
        if (error_ != nullptr) cudaFreeHost(error_);
        side_ = nullptr;
        error_ = nullptr;
    }

    // combine_recv(_add): the weighted sum of the returned rows into out, or added to it.
    void reduce(const float* topk_weight, void* out_bytes, bool add) {
        auto* out = static_cast<uint16_t*>(out_bytes);
        FANOUT_DEVICE_REQUIRE(topk_weight != nullptr && out != nullptr, "EP nccl: combine_recv needs weights and out");
        FANOUT_CUDA_CHECK(cudaStreamWaitEvent(stream_, combine_join_, 0));
        const int grid = std::min(shape_.max_tokens, sms_ * 4);
        if (config_.hidden % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0)
            combine_kernel<8><<<grid, kCopyThreads, 0, stream_>>>(shape_, step_tokens_.get(), slot_.get(), topk_weight,
                                                                  return_send_.get(), return_recv_.get(), lay_, out,
                                                                  add);
        else
            combine_kernel<1><<<grid, kCopyThreads, 0, stream_>>>(shape_, step_tokens_.get(), slot_.get(), topk_weight,
                                                                  return_send_.get(), return_recv_.get(), lay_, out,
                                                                  add);
        FANOUT_CUDA_CHECK_LAUNCH("combine_kernel");
    }

    int grid_for(size_t rows) const {
        const size_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
        return int(std::max<size_t>(1, std::min<size_t>(blocks, size_t(sms_) * 8)));
    }

    // Whole packets to and from every other rank on the side stream, forked after the packing
    // on stream_ and joined by the recv half (`join`).
    void exchange(const uint8_t* send, uint8_t* recv, size_t bytes, cudaEvent_t fork, cudaEvent_t join) {
        FANOUT_CUDA_CHECK(cudaEventRecord(fork, stream_));
        FANOUT_CUDA_CHECK(cudaStreamWaitEvent(side_, fork, 0));
        if (config_.world > 1) {
            FANOUT_NCCL_CHECK(ncclGroupStart());
            ncclResult_t r = ncclSuccess;
            for (int p = 0; p < config_.world && r == ncclSuccess; ++p) {
                if (p == config_.rank) continue;
                r = ncclSend(send + size_t(p) * bytes, bytes, ncclUint8, p, comm_, side_);
                if (r == ncclSuccess) r = ncclRecv(recv + size_t(p) * bytes, bytes, ncclUint8, p, comm_, side_);
            }
            const ncclResult_t end = ncclGroupEnd();
            FANOUT_NCCL_CHECK(r);
            FANOUT_NCCL_CHECK(end);
        }
        FANOUT_CUDA_CHECK(cudaEventRecord(join, side_));
    }

    EpConfig config_;
    ncclComm_t comm_;
    cudaStream_t stream_;
    cudaStream_t side_ = nullptr;
    cudaEvent_t dispatch_fork_ = nullptr, dispatch_join_ = nullptr, combine_fork_ = nullptr, combine_join_ = nullptr;
    Shape shape_{};
    PacketLayout lay_{};
    int payload_width_ = 1, scale_width_ = 4;  // for the receive buffers (unpack)
    int device_ = 0, sms_ = 1;
    DevicePtr<uint32_t> bits_, prefix_;
    DevicePtr<int> expert_offset_, slot_, step_tokens_, row_of_, counts_;
    DevicePtr<uint8_t> send_, recv_, return_send_, return_recv_, tokens_;
    DevicePtr<float> scales_;
    DeviceError* error_ = nullptr;      // host view (mapped)
    DeviceError* error_dev_ = nullptr;  // device view
};

}  // namespace

std::unique_ptr<ExpertParallel> make_nccl_ep(const EpConfig& config, ncclComm_t comm, cudaStream_t stream,
                                             const GpuEpOptions& /*options: no device waits of its own*/) {
    return std::make_unique<NcclEp>(config, comm, stream);
}

}  // namespace fanout::comm
