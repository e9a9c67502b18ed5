// sample_with_uniform on the device (sampling_cuda.h). One 1024-thread block per row.
//
// The CPU rule walks the tokens sorted by (scaled logit descending, id ascending). Sorting 129K
// values per row is not needed: every question the rule asks — where does the top-k set end,
// where does the running probability first reach top_p · total, where does it first exceed
// u · total — is "the first element, in that order, whose running weight reaches a target". With
// logits mapped to order-preserving 32-bit keys, the boundary's key is found bit by bit from the
// top (32 block-wide sums of the weight of keys ≥ a candidate), then the tie at that key is
// resolved in id order with a block scan. Sums are in f64 like the CPU's.
//
// A draft row (SamplingRow::draft >= 0) checks the draft: accepted when u · total < its weight,
// else the pick above over the kept set with the draft left out, at u_residual · (total − its weight).
//
// A row's logit_bias is added to its logits in place first (each id once, so the block's threads
// never write the same element), which gives every later read the CPU's logits[i] + bias.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/pdl.cuh"
#include "fanout/ops/sampling_cuda.h"

namespace fanout::ops {
namespace {

constexpr int kThreads = 1024;

__device__ inline uint32_t order_key(float f) {
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The set kept so far: the elements at or before (key, id) in the walk order, or all of them.
struct Boundary {
    uint32_t key = 0;
    int id = 0;
    bool all = true;
    int exclude = -1;  // an id left out of the set (a rejected draft)
    __device__ bool keeps(uint32_t k, int i) const { return i != exclude && (all || k > key || (k == key && i <= id)); }
};

struct Row {
    const float* logits;
    int vocab;
    float temperature;
    float max_scaled;  // the largest scaled logit (probability weights are exp(l - max))
    __device__ float scaled(int i) const { return logits[i] / temperature; }
    __device__ double weight(int i, bool probability) const {
        return probability ? static_cast<double>(expf(scaled(i) - max_scaled)) : 1.0;
    }
};

using Reduce = cub::BlockReduce<double, kThreads>;
using Scan = cub::BlockScan<double, kThreads>;

union Shared {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
};

__device__ double block_total(double v, Shared& sh, double* bcast) {
    const double t = Reduce(sh.reduce).Sum(v);
    if (threadIdx.x == 0) *bcast = t;
    __syncthreads();
    const double r = *bcast;
    __syncthreads();
    return r;
}

// The weight of the kept elements with key >= cand (or of all kept elements when cand == 0).
__device__ double weight_from(const Row& row, const Boundary& set, bool probability, uint64_t cand, Shared& sh,
                              double* bcast) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < row.vocab; i += kThreads) {
        const uint32_t k = order_key(row.scaled(i));
        if (k >= cand && set.keeps(k, i)) acc += row.weight(i, probability);
    }
    return block_total(acc, sh, bcast);
}

// The first kept element, in walk order, at which the running weight reaches `target` (>=) or,
// when strict, exceeds it (>). found = false when the whole set does not.
__device__ Boundary select(const Row& row, const Boundary& set, bool probability, double target, bool strict,
                           bool& found, Shared& sh, double* bcast, int* found_id) {
    const auto reaches = [&](double w) { return strict ? w > target : w >= target; };
    found = reaches(weight_from(row, set, probability, 0, sh, bcast));
    Boundary b;
    b.all = false;
    if (!found) return b;
    // The largest key whose weight-from still reaches the target is the boundary's key.
    uint32_t key = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = key | (1u << bit);
        if (reaches(weight_from(row, set, probability, cand, sh, bcast))) key = cand;
    }
    const double above = key == 0xffffffffu ? 0.0 : weight_from(row, set, probability, uint64_t{key} + 1, sh, bcast);
    // Ties at `key` in id order: the first whose running weight, on top of `above`, reaches the target.
    if (threadIdx.x == 0) *found_id = -1;
    __syncthreads();
    double running = above;
    for (int base = 0; base < row.vocab; base += kThreads) {
        const int i = base + threadIdx.x;
        double w = 0.0;
        if (i < row.vocab) {
            const uint32_t k = order_key(row.scaled(i));
            if (k == key && set.keeps(k, i)) w = row.weight(i, probability);
        }
        double excl, chunk;
        Scan(sh.scan).ExclusiveSum(w, excl, chunk);
        if (w > 0.0 && reaches(running + excl + w) && !reaches(running + excl)) *found_id = i;
        __syncthreads();
        running += chunk;
        if (*found_id >= 0) break;
    }
    b.key = key;
    b.id = *found_id;
    return b;
}

// NOTE: logits is written (the biases) and then read by the same block, so it is neither const nor
// __restrict__: the reads must not go through the read-only cache.
__global__ void __launch_bounds__(kThreads)
    sample_kernel(float* logits, int vocab, const SamplingRow* __restrict__ params,
                  const LogitBias* __restrict__ logit_bias, int32_t* __restrict__ tokens) {
    pdl_enter();
    __shared__ Shared sh;
    __shared__ double bcast;
    __shared__ int found_id;
    __shared__ float best_value;
    __shared__ int best_id;
    const SamplingRow p = params[blockIdx.x];
    float* l = logits + static_cast<size_t>(blockIdx.x) * vocab;
    if (p.bias_count > 0) {
        for (int j = threadIdx.x; j < p.bias_count; j += kThreads) {
            const LogitBias e = logit_bias[p.bias_begin + j];
            if (e.id >= 0 && e.id < vocab) l[e.id] += e.bias;
        }
        __syncthreads();  // after this, every thread reads the biased row
    }
    // The argmax (ties to the lower id): the greedy answer, and the max for the probabilities; and
    // the CPU's precondition on the logits (sampling.h): no NaN or +inf, one above -inf at least.
    const bool greedy = p.temperature < kGreedyTemperature;
    float bv = -INFINITY;
    int bi = vocab;
    bool bad = false;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const float raw = l[i], v = greedy ? raw : raw / p.temperature;
        bad = bad || isnan(raw) || raw == INFINITY;
        if (v > bv || bi == vocab) {
            bv = v;
            bi = i;
        }
    }
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0) tokens[blockIdx.x] = kNotFinite;
        return;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (threadIdx.x == 0) {
        best_value = -INFINITY;
        best_id = vocab;
    }
    __syncthreads();
    __shared__ float warp_v[kThreads / 32];
    __shared__ int warp_i[kThreads / 32];
    if (threadIdx.x % 32 == 0) {
        warp_v[threadIdx.x / 32] = bv;
        warp_i[threadIdx.x / 32] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 0; w < kThreads / 32; ++w)
            if (warp_i[w] < vocab &&
                (best_id == vocab || warp_v[w] > best_value || (warp_v[w] == best_value && warp_i[w] < best_id))) {
                best_value = warp_v[w];
                best_id = warp_i[w];
            }
    }
    __syncthreads();
    if (best_value == -INFINITY) {  // every logit -inf
        if (threadIdx.x == 0) tokens[blockIdx.x] = kNotFinite;
        return;
    }
    if (greedy || p.top_k == 1) {
        if (threadIdx.x == 0) tokens[blockIdx.x] = best_id;
        return;
    }
    const Row row{l, vocab, p.temperature, best_value};
    Boundary set;  // all
    bool found = false;
    if (p.top_k > 0 && p.top_k < vocab) {
        set = select(row, set, false, static_cast<double>(p.top_k), false, found, sh, &bcast, &found_id);
        if (!found) set.all = true;
    }
    double total = weight_from(row, set, true, 0, sh, &bcast);
    if (p.top_p < 1.0f) {
        const Boundary cut = select(row, set, true, p.top_p * total, false, found, sh, &bcast, &found_id);
        if (found) {
            set = cut;
            total = weight_from(row, set, true, 0, sh, &bcast);
        }
    }
    if (p.draft >= 0 && p.draft < vocab) {
        const double w_draft = set.keeps(order_key(row.scaled(p.draft)), p.draft) ? row.weight(p.draft, true) : 0.0;
        if (p.uniform * total < w_draft) {
            if (threadIdx.x == 0) tokens[blockIdx.x] = p.draft;
            return;
        }
        // Rejected: the kept set without the draft (select() returns a boundary without the
        // exclusion, so the rounding fallback below is the only other place it matters).
        Boundary rest = set;
        rest.exclude = p.draft;
        const Boundary pick =
            select(row, rest, true, p.uniform_residual * (total - w_draft), true, found, sh, &bcast, &found_id);
        if (threadIdx.x != 0) return;
        if (found) {
            tokens[blockIdx.x] = pick.id;
        } else {
            // u · rest reached the whole rest only through rounding (u_residual within ~1e-11 of
            // 1). The CPU takes the last kept token that is not the draft, which is not tracked
            // here: the set's boundary, or its argmax when that is the draft — the draft itself
            // only when it is the argmax of a set kept whole, an error of that rounding's size.
            const int last = set.all ? best_id : set.id;
            tokens[blockIdx.x] = last != p.draft ? last : best_id;
        }
        return;
    }
    const Boundary pick = select(row, set, true, p.uniform * total, true, found, sh, &bcast, &found_id);
    if (threadIdx.x != 0) return;
    if (found) {
        tokens[blockIdx.x] = pick.id;
    } else {
        // u · total reached the whole set's weight only through rounding: the CPU takes the last kept.
        tokens[blockIdx.x] = set.all ? best_id : set.id;
    }
}

}  // namespace

void launch_sample(float* logits, int rows, int vocab, const SamplingRow* params, const LogitBias* logit_bias,
                   int32_t* tokens, void* cuda_stream) {
    FANOUT_DEVICE_REQUIRE(vocab > 0, "sample: empty logits (vocab " + std::to_string(vocab) + ")");
    if (rows <= 0) return;
    launch_pdl(sample_kernel, rows, kThreads, 0, static_cast<cudaStream_t>(cuda_stream), logits, vocab, params,
               logit_bias, tokens);
}

}  // namespace fanout::ops
