#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "fanout/ops/cpu_util.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/mla_attention.h"

namespace fanout::ops {
namespace {

void check_metadata(const AttentionMetadata& meta, const LatentCache& cache, int64_t T) {
    FANOUT_CHECK(meta.query_start[0] == 0 && meta.query_start[meta.num_requests] == T,
                 "attention: query_start spans [{}, {}) but there are {} query tokens", meta.query_start[0],
                 meta.query_start[meta.num_requests], T);
    for (int64_t r = 0; r < meta.num_requests; ++r) {
        const int64_t q0 = meta.query_start[r], q1 = meta.query_start[r + 1], kv = meta.kv_len[r];
        FANOUT_CHECK(q0 <= q1 && kv >= q1 - q0 && kv <= meta.max_blocks * cache.block_size,
                     "attention: request {} has {} queries and kv_len {} (cache room {})", r, q1 - q0, kv,
                     meta.max_blocks * cache.block_size);
        for (int64_t t = q0; t < q1; ++t)
            FANOUT_CHECK(meta.positions[t] >= 0 && meta.positions[t] < kv,
                         "attention: token {} at position {} outside its request's kv_len {}", t, meta.positions[t],
                         kv);
        for (int64_t b = 0; b < (kv + cache.block_size - 1) / cache.block_size; ++b) {
            const int32_t block = meta.block_table[r * meta.max_blocks + b];
            FANOUT_CHECK(block >= 0 && block < cache.num_blocks, "attention: request {} block {} is {} of {}", r, b,
                         block, cache.num_blocks);
        }
    }
}

void check_attention_args(const Tensor& q, const LinearWeight& kv_b, const LatentCache& cache,
                          const AttentionMetadata& meta, int64_t kv_lora, int64_t nope, int64_t v_dim,
                          const Tensor& out) {
    check_tensor(q, "mla q", DType::kF32, {-1, -1, -1});
    const int64_t T = q.dim(0), H = q.dim(1), rope = q.dim(2) - nope;
    check_tensor(out, "mla out", DType::kF32, {T, H, v_dim});
    FANOUT_CHECK(rope > 0 && cache.entry_dim == kv_lora + rope && kv_b.in_features == kv_lora &&
                     kv_b.out_features == H * (nope + v_dim),
                 "mla attention: cache entry {} / kv_b [{}, {}] do not fit H={} nope={} rope={} v={}", cache.entry_dim,
                 kv_b.out_features, kv_b.in_features, H, nope, rope, v_dim);
    check_metadata(meta, cache, T);
}

int64_t slot_of(const AttentionMetadata& meta, const LatentCache& cache, int64_t r, int64_t pos) {
    return static_cast<int64_t>(meta.block_table[r * meta.max_blocks + pos / cache.block_size]) * cache.block_size +
           pos % cache.block_size;
}

// Softmax over scores[0, n) in place; returns nothing, scores become probabilities.
void softmax_inplace(float* scores, int64_t n) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, scores[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) scores[j] *= inv;
}

// Entries of one cache layer as f32: its entry bytes and FP8 layout resolved (and checked) once,
// not per entry — attention reads every cached position of every layer through it.
class EntryReader {
  public:
    explicit EntryReader(const LatentCache& cache)
        : cache_(cache),
          bytes_(cache.entry_bytes()),
          fp8_(cache.dtype == DType::kFP8E4M3 ? cache.fp8_layout() : MlaFp8Layout{}) {}
    void read(int64_t slot, float* out) const {
        const char* entry = static_cast<const char*>(cache_.data) + static_cast<size_t>(slot * bytes_);
        if (cache_.dtype == DType::kFP8E4M3)
            dequantize_latent_entry_fp8(reinterpret_cast<const uint8_t*>(entry), fp8_, out);
        else
            convert_to_f32(entry, cache_.dtype, static_cast<size_t>(cache_.entry_dim), out);
    }

  private:
    const LatentCache& cache_;
    int64_t bytes_;
    MlaFp8Layout fp8_;
};

// Request r's cached entries [kv_len, entry_dim] as f32.
std::vector<float> gather_entries(const LatentCache& cache, const AttentionMetadata& meta, int64_t r) {
    const int64_t S = meta.kv_len[r], D = cache.entry_dim;
    const EntryReader reader(cache);
    std::vector<float> out(static_cast<size_t>(S * D));
    for (int64_t j = 0; j < S; ++j) reader.read(slot_of(meta, cache, r, j), out.data() + j * D);
    return out;
}

}  // namespace

void quantize_latent_entry_fp8(const float* entry, const MlaFp8Layout& layout, uint8_t* out) {
    for (int64_t g = 0; g < layout.num_scales(); ++g) {
        const int64_t k0 = g * kFp8Block, k1 = std::min(layout.kv_lora, k0 + kFp8Block);
        float amax = 0.0f;
        for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(entry[k]));
        const float scale = fp8_cache_scale(amax);
        for (int64_t k = k0; k < k1; ++k) out[k] = f32_to_fp8e4m3(entry[k] / scale);
        std::memcpy(out + layout.scale_offset() + 4 * g, &scale, 4);
    }
    for (int64_t d = 0; d < layout.rope; ++d) {
        const uint16_t v = f32_to_bf16(entry[layout.kv_lora + d]);
        std::memcpy(out + layout.rope_offset() + 2 * d, &v, 2);
    }
}

void dequantize_latent_entry_fp8(const uint8_t* in, const MlaFp8Layout& layout, float* entry) {
    for (int64_t g = 0; g < layout.num_scales(); ++g) {
        const int64_t k0 = g * kFp8Block, k1 = std::min(layout.kv_lora, k0 + kFp8Block);
        float scale;
        std::memcpy(&scale, in + layout.scale_offset() + 4 * g, 4);
        for (int64_t k = k0; k < k1; ++k) entry[k] = fp8e4m3_to_f32(in[k]) * scale;
    }
    for (int64_t d = 0; d < layout.rope; ++d) {
        uint16_t v;
        std::memcpy(&v, in + layout.rope_offset() + 2 * d, 2);
        entry[layout.kv_lora + d] = bf16_to_f32(v);
    }
}

int64_t LatentCache::entry_bytes() const {
    const int64_t bytes = latent_entry_bytes(kv_lora, entry_dim - kv_lora, dtype);
    FANOUT_CHECK(bytes > 0,
                 "kv cache: cannot store dtype {} with kv_lora {} of entry {} (f32, bf16, or fp8 with kv_lora % 4 == "
                 "0 and an even rope width)",
                 dtype_name(dtype), kv_lora, entry_dim);
    return bytes;
}

void kv_read(const LatentCache& cache, int64_t slot, float* out) { EntryReader(cache).read(slot, out); }

void kv_append(LatentCache& cache, const Tensor& entries, const int32_t* slots, const Stream& s) {
    check_tensor(entries, "kv_append entries", DType::kF32, {-1, cache.entry_dim});
    const int64_t T = entries.dim(0), D = cache.entry_dim, bytes = cache.entry_bytes();
    const MlaFp8Layout fp8 = cache.dtype == DType::kFP8E4M3 ? cache.fp8_layout() : MlaFp8Layout{};
    const float* src = entries.data_as<float>();
    for (int64_t t = 0; t < T; ++t)
        FANOUT_CHECK(slots[t] >= 0 && slots[t] < cache.num_blocks * cache.block_size,
                     "kv_append: slot {} of token {} outside the cache's {} slots", slots[t], t,
                     cache.num_blocks * cache.block_size);
    parallel_for(s, T, 16, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            char* dst = static_cast<char*>(cache.data) + static_cast<size_t>(slots[t] * bytes);
            const float* e = src + t * D;
            if (cache.dtype == DType::kF32) {
                std::memcpy(dst, e, static_cast<size_t>(bytes));
            } else if (cache.dtype == DType::kBF16) {
                uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
                for (int64_t d = 0; d < D; ++d) d16[d] = f32_to_bf16(e[d]);
            } else {
                quantize_latent_entry_fp8(e, fp8, reinterpret_cast<uint8_t*>(dst));
            }
        }
    });
}

void mla_attention_mha(const Tensor& q, const LinearWeight& kv_b, Fp8Mode mode, const LatentCache& cache,
                       const AttentionMetadata& meta, int64_t kv_lora, int64_t nope, int64_t v_dim, float scale,
                       Tensor& out, const Stream& s) {
    check_attention_args(q, kv_b, cache, meta, kv_lora, nope, v_dim, out);
    const int64_t H = q.dim(1), qk = q.dim(2), rope = qk - nope, D = cache.entry_dim;
    const float* qp = q.data_as<float>();
    float* op = out.data_as<float>();
    for (int64_t r = 0; r < meta.num_requests; ++r) {
        const int64_t q0 = meta.query_start[r], q1 = meta.query_start[r + 1], S = meta.kv_len[r];
        if (q1 == q0) continue;
        const std::vector<float> entries = gather_entries(cache, meta, r);
        Tensor latent = Tensor::zeros({S, kv_lora}, DType::kF32);
        for (int64_t j = 0; j < S; ++j)
            std::copy_n(entries.data() + j * D, kv_lora, latent.data_as<float>() + j * kv_lora);
        Tensor kv = Tensor::zeros({S, H * (nope + v_dim)}, DType::kF32);  // [S, H, nope + v]
        linear(latent, kv_b, kv, mode, s);
        const float* kvp = kv.data_as<float>();
        parallel_for(s, (q1 - q0) * H, 4, [&](int64_t i0, int64_t i1) {
            std::vector<float> scores(static_cast<size_t>(S));
            for (int64_t i = i0; i < i1; ++i) {
                const int64_t t = q0 + i / H, h = i % H, visible = meta.positions[t] + 1;
                const float* qh = qp + (t * H + h) * qk;
                for (int64_t j = 0; j < visible; ++j) {
                    const float* k_nope = kvp + (j * H + h) * (nope + v_dim);
                    const float* k_pe = entries.data() + j * D + kv_lora;
                    scores[j] = (cpu::dot(qh, k_nope, nope) + cpu::dot(qh + nope, k_pe, rope)) * scale;
                }
                softmax_inplace(scores.data(), visible);
                float* oh = op + (t * H + h) * v_dim;
                std::fill(oh, oh + v_dim, 0.0f);
                for (int64_t j = 0; j < visible; ++j)
                    cpu::axpy(scores[j], kvp + (j * H + h) * (nope + v_dim) + nope, oh, v_dim);
            }
        });
    }
}

void mla_latent_attention_cpu(const float* q_lat, int64_t q_lat_stride_t, int64_t q_lat_stride_h, const float* q_pe,
                              int64_t q_pe_stride_t, int64_t q_pe_stride_h, const LatentCache& cache,
                              const AttentionMetadata& meta, int64_t num_tokens, int64_t num_heads, int64_t kv_lora,
                              float scale, float* out, const Stream& s) {
    const int64_t T = num_tokens, H = num_heads, D = cache.entry_dim, rope = D - kv_lora;
    FANOUT_CHECK(kv_lora > 0 && rope > 0 && H > 0, "mla latent attention: kv_lora {} and cache entry {} (H={})",
                 kv_lora, D, H);
    check_metadata(meta, cache, T);
    if (T == 0) return;
    std::vector<std::vector<float>> entries(static_cast<size_t>(meta.num_requests));
    std::vector<int64_t> request_of(static_cast<size_t>(T));
    for (int64_t r = 0; r < meta.num_requests; ++r) {
        if (meta.query_start[r + 1] > meta.query_start[r]) entries[r] = gather_entries(cache, meta, r);
        for (int64_t t = meta.query_start[r]; t < meta.query_start[r + 1]; ++t) request_of[t] = r;
    }
    parallel_for(s, T * H, 4, [&](int64_t i0, int64_t i1) {
        std::vector<float> scores;
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t t = i / H, h = i % H, visible = meta.positions[t] + 1;
            const float* ql = q_lat + t * q_lat_stride_t + h * q_lat_stride_h;
            const float* qr = q_pe + t * q_pe_stride_t + h * q_pe_stride_h;
            const float* e = entries[request_of[t]].data();
            scores.resize(static_cast<size_t>(visible));
            for (int64_t j = 0; j < visible; ++j)
                scores[j] = (cpu::dot(ql, e + j * D, kv_lora) + cpu::dot(qr, e + j * D + kv_lora, rope)) * scale;
            softmax_inplace(scores.data(), visible);
            float* o = out + i * kv_lora;
            std::fill(o, o + kv_lora, 0.0f);
            for (int64_t j = 0; j < visible; ++j) cpu::axpy(scores[j], e + j * D, o, kv_lora);
        }
    });
}

void mha_prefill_cpu(const float* q, int64_t q_stride_t, int64_t q_stride_h, const float* k_nope, int64_t k_stride_t,
                     int64_t k_stride_h, const float* k_pe, int64_t k_pe_stride_t, const float* v, int64_t v_stride_t,
                     int64_t v_stride_h, int64_t num_tokens, int64_t ctx_len, int64_t num_heads, int64_t nope,
                     int64_t rope, int64_t v_dim, float scale, float* out, const Stream& s) {
    const int64_t T = num_tokens, H = num_heads, prefix = ctx_len - num_tokens;
    FANOUT_CHECK(T >= 0 && prefix >= 0 && H > 0 && nope > 0 && rope > 0 && v_dim > 0,
                 "mha prefill: T={} ctx_len={} H={} nope={} rope={} v_dim={}", T, ctx_len, H, nope, rope, v_dim);
    parallel_for(s, T * H, 4, [&](int64_t i0, int64_t i1) {
        std::vector<float> scores(static_cast<size_t>(ctx_len));
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t t = i / H, h = i % H, visible = prefix + t + 1;
            const float* qh = q + t * q_stride_t + h * q_stride_h;
            for (int64_t j = 0; j < visible; ++j)
                scores[j] = (cpu::dot(qh, k_nope + j * k_stride_t + h * k_stride_h, nope) +
                             cpu::dot(qh + nope, k_pe + j * k_pe_stride_t, rope)) *
                            scale;
            softmax_inplace(scores.data(), visible);
            float* o = out + i * v_dim;
            std::fill(o, o + v_dim, 0.0f);
            for (int64_t j = 0; j < visible; ++j) cpu::axpy(scores[j], v + j * v_stride_t + h * v_stride_h, o, v_dim);
        }
    });
}

void mla_attention_absorbed(const Tensor& q, const LinearWeight& kv_b, const LatentCache& cache,
                            const AttentionMetadata& meta, int64_t kv_lora, int64_t nope, int64_t v_dim, float scale,
                            Tensor& out, const Stream& s) {
    check_attention_args(q, kv_b, cache, meta, kv_lora, nope, v_dim, out);
    const int64_t T = q.dim(0), H = q.dim(1), qk = q.dim(2);
    if (T == 0) return;
    const float* qp = q.data_as<float>();
    float* op = out.data_as<float>();
    // q_lat[t, h] = W_UK[h]ᵀ q_nope[t, h]: [T, H, kv_lora].
    std::vector<float> q_lat(static_cast<size_t>(T * H * kv_lora)), o_lat(q_lat.size());
    parallel_for(s, H, 1, [&](int64_t h0, int64_t h1) {
        std::vector<float> w_uk(static_cast<size_t>(nope * kv_lora));
        for (int64_t h = h0; h < h1; ++h) {
            for (int64_t d = 0; d < nope; ++d) kv_b.row_f32(h * (nope + v_dim) + d, w_uk.data() + d * kv_lora);
            for (int64_t t = 0; t < T; ++t) {
                const float* qh = qp + (t * H + h) * qk;
                float* ql = q_lat.data() + (t * H + h) * kv_lora;
                std::fill(ql, ql + kv_lora, 0.0f);
                for (int64_t d = 0; d < nope; ++d) cpu::axpy(qh[d], w_uk.data() + d * kv_lora, ql, kv_lora);
            }
        }
    });
    mla_latent_attention_cpu(q_lat.data(), H * kv_lora, kv_lora, qp + nope, H * qk, qk, cache, meta, T, H, kv_lora,
                             scale, o_lat.data(), s);
    // out[t, h] = W_UV[h] o_lat[t, h].
    parallel_for(s, H, 1, [&](int64_t h0, int64_t h1) {
        std::vector<float> w_uv(static_cast<size_t>(v_dim * kv_lora));
        for (int64_t h = h0; h < h1; ++h) {
            for (int64_t d = 0; d < v_dim; ++d) kv_b.row_f32(h * (nope + v_dim) + nope + d, w_uv.data() + d * kv_lora);
            for (int64_t t = 0; t < T; ++t) {
                const float* ol = o_lat.data() + (t * H + h) * kv_lora;
                float* oh = op + (t * H + h) * v_dim;
                for (int64_t d = 0; d < v_dim; ++d) oh[d] = cpu::dot(w_uv.data() + d * kv_lora, ol, kv_lora);
            }
        }
    });
}

}  // namespace fanout::ops
