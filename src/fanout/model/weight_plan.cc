#include "fanout/model/weight_plan.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "fanout/ops/fp8_quant.h"

namespace fanout::model {
namespace {

using ops::LinearWeight;
using steady = std::chrono::steady_clock;

constexpr int kMaxReaders = 8;
constexpr int64_t kBlock = ops::kFp8Block;

double seconds_since(steady::time_point t0) { return std::chrono::duration<double>(steady::now() - t0).count(); }

// The grouped and batched FP8 kernels load tiles with TMA: K and N must be multiples of 16.
bool tma_friendly(int64_t N, int64_t K) { return N % 16 == 0 && K % 16 == 0; }

bool is_float(DType d) { return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32; }

// pread of `n` bytes at file offset `offset`, all of them or an Error naming the file.
void read_fully(int fd, const std::string& path, size_t offset, uint8_t* out, size_t n) {
    size_t done = 0;
    while (done < n) {
        const ssize_t r = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
        if (r < 0 && errno == EINTR) continue;
        FANOUT_CHECK(r > 0, "reading {} bytes at offset {} of {} failed: {}", n, offset + done, path,
                     r == 0 ? "unexpected end of file" : std::strerror(errno));
        done += static_cast<size_t>(r);
    }
}

// The checkpoint's shards opened for pread (closed with it).
class ShardFiles {
  public:
    explicit ShardFiles(const io::Checkpoint& ck) : ck_(ck) {}
    ~ShardFiles() {
        for (int f : fds_)
            if (f >= 0) ::close(f);
    }
    ShardFiles(const ShardFiles&) = delete;
    ShardFiles& operator=(const ShardFiles&) = delete;

    // Opens every shard `ranges` touch (before readers start: fd() is not thread-safe then).
    int fd(int shard) {
        if (fds_.size() <= static_cast<size_t>(shard)) fds_.resize(static_cast<size_t>(shard) + 1, -1);
        int& f = fds_[static_cast<size_t>(shard)];
        if (f < 0) {
            const std::string& path = ck_.shard_path(shard);
            f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
            FANOUT_CHECK(f >= 0, "cannot open {}: {}", path, std::strerror(errno));
            ::posix_fadvise(f, 0, 0, POSIX_FADV_SEQUENTIAL);
        }
        return f;
    }
    void read(const io::Checkpoint::FileRange& at, size_t begin, uint8_t* out, size_t n) {
        read_fully(fd(at.shard), ck_.shard_path(at.shard), at.offset + begin, out, n);
    }

  private:
    const io::Checkpoint& ck_;
    std::vector<int> fds_;
};

// ---------------------------------------------------------------------------------------------
// Planning

class Planner {
  public:
    Planner(const ModelWeights& w, WeightPlan& plan) : w_(w), plan_(plan), files_(w.checkpoint) {}

    int array(size_t bytes) {
        WeightPlan::Array a;
        a.offset = plan_.arena_bytes;
        a.bytes = bytes;
        plan_.arena_bytes += (bytes + WeightPlan::kAlign - 1) / WeightPlan::kAlign * WeightPlan::kAlign;
        plan_.arrays.push_back(std::move(a));
        return static_cast<int>(plan_.arrays.size()) - 1;
    }
    // A whole checkpoint tensor's bytes into array `a` at byte `at`, as they are or (convert: its
    // float dtype) as bf16.
    void fill(int a, size_t at, const void* src, size_t nbytes, DType convert = DType::kU8) {
        plan_.arrays[static_cast<size_t>(a)].fills.push_back({at, src, nbytes, convert, nullptr});
        plan_.stream_bytes += static_cast<double>(nbytes);
    }
    template <typename T>
    int host_array(const std::vector<T>& v) {
        const int a = array(v.size() * sizeof(T));
        auto bytes = std::make_shared<std::vector<uint8_t>>(v.size() * sizeof(T));
        std::memcpy(bytes->data(), v.data(), bytes->size());
        plan_.host_bytes += static_cast<double>(bytes->size());
        plan_.arrays[static_cast<size_t>(a)].fills.push_back({0, nullptr, bytes->size(), DType::kU8, std::move(bytes)});
        return a;
    }
    // A tensor's bytes read now (the host-side rearrangements).
    std::vector<uint8_t> read(const void* src, size_t nbytes) {
        plan_.host_sources.insert(src);
        std::vector<uint8_t> out(nbytes);
        files_.read(w_.checkpoint.locate(src, nbytes), 0, out.data(), nbytes);
        return out;
    }

    // Norms and the router bias: f32 host copies already (load_weights converted and checked them).
    int f32_vector(const Tensor& t) {
        std::vector<float> v(static_cast<size_t>(t.numel()));
        convert_to_f32(t.data(), t.dtype(), v.size(), v.data());
        return host_array(v);
    }

    // `batch` f32 matrices [N, K] quantized per 128×128 block (or in bf16) on the host. Re-quantizing
    // reproduces FP8 values exactly only when the blocks line up; this is for those that straddle.
    MatrixPlan host_matrices(const std::vector<float>& w, int64_t batch, int64_t N, int64_t K, bool fp8) {
        MatrixPlan m{fp8, batch, N, K};
        const size_t per = static_cast<size_t>(N * K);
        if (fp8) {
            const size_t nb = static_cast<size_t>(ops::ceil_div(N, kBlock) * ops::ceil_div(K, kBlock));
            std::vector<uint8_t> q(per * static_cast<size_t>(batch));
            std::vector<float> s(nb * static_cast<size_t>(batch));
            for (int64_t b = 0; b < batch; ++b)
                ops::weight_quant_block(w.data() + b * per, N, K, q.data() + b * per, s.data() + b * nb);
            m.q = host_array(q);
            m.scale = host_array(s);
        } else {
            std::vector<uint16_t> h(w.size());
            for (size_t i = 0; i < w.size(); ++i) h[i] = f32_to_bf16(w[i]);
            m.bf16 = host_array(h);
        }
        return m;
    }

    // `batches` matrices [N, K], each its parts stacked along N (q_a | kv_a, gate | up, one per
    // expert). FP8 parts are streamed as they are when every part but the last fills whole 128-row
    // blocks and `fp8_ok` (the kernels that run it take the shape); float parts are streamed as
    // bf16; anything else is dequantized on the host (and re-quantized when all parts are FP8).
    MatrixPlan stacked(const std::vector<std::vector<const LinearWeight*>>& batches, bool fp8_ok) {
        const auto& first = batches.front();
        const int64_t K = first.front()->in_features;
        int64_t N = 0;
        for (const auto* p : first) N += p->out_features;
        bool all_fp8 = true, all_float = true, aligned = true;
        for (const auto& parts : batches)
            for (size_t i = 0; i < parts.size(); ++i) {
                all_fp8 = all_fp8 && parts[i]->dtype == DType::kFP8E4M3;
                all_float = all_float && is_float(parts[i]->dtype);
                aligned = aligned && (i + 1 == parts.size() || parts[i]->out_features % kBlock == 0);
            }
        const size_t B = batches.size(), per = static_cast<size_t>(N * K), Ku = static_cast<size_t>(K);
        MatrixPlan m{false, static_cast<int64_t>(B), N, K};
        if (all_fp8 && aligned && fp8_ok) {
            const size_t nbK = static_cast<size_t>(ops::ceil_div(K, kBlock));
            const size_t per_s = static_cast<size_t>(ops::ceil_div(N, kBlock)) * nbK;
            m.fp8 = true;
            m.q = array(per * B);
            m.scale = array(per_s * B * sizeof(float));
            for (size_t b = 0; b < B; ++b) {
                size_t row = 0, block_row = 0;
                for (const auto* p : batches[b]) {
                    const size_t rows = static_cast<size_t>(p->out_features);
                    const size_t block_rows = static_cast<size_t>(ops::ceil_div(p->out_features, kBlock));
                    fill(m.q, b * per + row * Ku, p->data, rows * Ku);
                    fill(m.scale, (b * per_s + block_row * nbK) * sizeof(float), p->scale_inv,
                         block_rows * nbK * sizeof(float));
                    row += rows;
                    block_row += block_rows;
                }
            }
            return m;
        }
        if (all_float) {
            m.bf16 = array(per * B * 2);
            for (size_t b = 0; b < B; ++b) {
                size_t row = 0;
                for (const auto* p : batches[b]) {
                    const size_t n = static_cast<size_t>(p->out_features) * Ku;
                    fill(m.bf16, (b * per + row * Ku) * 2, p->data, n * dtype_size(p->dtype), p->dtype);
                    row += static_cast<size_t>(p->out_features);
                }
            }
            return m;
        }
        std::vector<float> w;
        for (const auto& parts : batches)
            for (const auto* p : parts) append_rows(*p, w);
        return host_matrices(w, static_cast<int64_t>(B), N, K, all_fp8 && fp8_ok);
    }
    MatrixPlan single(const LinearWeight& w) { return stacked({{&w}}, true); }

    // A matrix as bf16 (the router, the head): streamed unless it is FP8.
    int bf16_matrix(const LinearWeight& w) {
        const size_t n = static_cast<size_t>(w.out_features * w.in_features);
        if (is_float(w.dtype)) {
            const int a = array(n * 2);
            fill(a, 0, w.data, n * dtype_size(w.dtype), w.dtype);
            return a;
        }
        std::vector<float> f;
        append_rows(w, f);
        std::vector<uint16_t> h(f.size());
        for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_bf16(f[i]);
        return host_array(h);
    }

    void split_kv_b(const io::ModelConfig& c, const LinearWeight& kv_b, LayerPlan& d);
    LayerPlan layer(const io::ModelConfig& c, const LayerWeights& lw, int64_t layer_index);

  private:
    void append_rows(const LinearWeight& w, std::vector<float>& out) {
        plan_.host_sources.insert(w.data);
        if (w.scale_inv) plan_.host_sources.insert(w.scale_inv);
        const size_t at = out.size(), K = static_cast<size_t>(w.in_features);
        out.resize(at + static_cast<size_t>(w.out_features) * K);
        for (int64_t r = 0; r < w.out_features; ++r) w.row_f32(r, out.data() + at + static_cast<size_t>(r) * K);
    }

    const ModelWeights& w_;
    WeightPlan& plan_;
    ShardFiles files_;
};

// kv_b [H·(nope + v), C] split into the absorbed form's per-head weights: k_b[h] = W_UK[h]ᵀ
// [C, nope] and v_b[h] = W_UV[h] [v, C], dequantized to bf16 whatever the checkpoint's type — the
// GPU runs these per-head projections in bf16 (cuda_layer.h), as DeepSeek's reference inference
// does with the dequantized kv_b, and as the CPU model's absorbed form reads kv_b.
void Planner::split_kv_b(const io::ModelConfig& c, const LinearWeight& kv_b, LayerPlan& d) {
    const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim, C = c.kv_lora_rank;
    std::vector<float> f, kb, vb;
    append_rows(kv_b, f);  // [H·(nope + v), C]
    kb.reserve(static_cast<size_t>(H * C * nope));
    vb.reserve(static_cast<size_t>(H * v * C));
    for (int64_t h = 0; h < H; ++h) {
        const float* wuk = f.data() + h * (nope + v) * C;
        for (int64_t c2 = 0; c2 < C; ++c2)
            for (int64_t n = 0; n < nope; ++n) kb.push_back(wuk[n * C + c2]);
        vb.insert(vb.end(), wuk + nope * C, wuk + (nope + v) * C);
    }
    d.k_b = host_matrices(kb, H, C, nope, false);
    d.v_b = host_matrices(vb, H, v, C, false);
}

LayerPlan Planner::layer(const io::ModelConfig& c, const LayerWeights& lw, int64_t layer_index) {
    LayerPlan d;
    const AttentionWeights& a = lw.attn;
    d.input_norm = f32_vector(lw.input_norm);
    d.post_norm = f32_vector(lw.post_norm);
    d.kv_a_norm = f32_vector(a.kv_a_norm);
    if (c.q_lora_rank > 0) {
        d.q_a_norm = f32_vector(a.q_a_norm);
        d.qkv_a = stacked({{&a.q_a, &a.kv_a}}, true);
        d.q_b = single(a.q_b);
    } else {
        d.qkv_a = single(a.kv_a);
        d.q_b = single(a.q_proj);
    }
    split_kv_b(c, a.kv_b, d);
    d.kv_b = single(a.kv_b);
    d.o = single(a.o);
    d.moe = lw.is_moe;
    const MlpWeights* mlp = lw.is_moe ? (lw.moe.shared ? &*lw.moe.shared : nullptr) : &lw.mlp;
    if (mlp != nullptr) {
        d.has_mlp = true;
        d.gate_up = stacked({{&mlp->gate, &mlp->up}}, true);
        d.down = single(mlp->down);
    }
    if (lw.is_moe) {
        const MoeWeights& m = lw.moe;
        d.router = bf16_matrix(m.router);
        if (m.bias.defined() && m.bias.numel() > 0) d.router_bias = f32_vector(m.bias);
        const int64_t I = c.moe_intermediate_size, D = c.hidden_size;
        std::vector<std::vector<const LinearWeight*>> gu, dn;
        for (const MlpWeights& e : m.experts) {
            gu.push_back({&e.gate, &e.up});
            dn.push_back({&e.down});
        }
        if (!gu.empty()) {
            // One dtype for a layer's experts, checked before anything is stacked: a mixed layer
            // would be dequantized whole on the host first (~30 GB per V3 layer) and then refused
            // naming expert 0, not the odd tensor.
            const auto name = [&](size_t e, const char* proj) {
                return fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer_index, m.expert_begin + e, proj);
            };
            const bool fp8_0 = m.experts[0].gate.dtype == DType::kFP8E4M3;
            for (size_t e = 0; e < m.experts.size(); ++e)
                for (const auto& [proj, lw] :
                     {std::pair<const char*, const LinearWeight*>{"gate_proj", &m.experts[e].gate},
                      {"up_proj", &m.experts[e].up},
                      {"down_proj", &m.experts[e].down}})
                    FANOUT_CHECK((lw->dtype == DType::kFP8E4M3) == fp8_0,
                                 "{}: '{}' is {} while '{}' is {}: a layer's routed experts must all be FP8 (with "
                                 "weight_scale_inv) or all float",
                                 w_.checkpoint.file_of(name(e, proj)), name(e, proj), dtype_name(lw->dtype),
                                 name(0, "gate_proj"), dtype_name(m.experts[0].gate.dtype));
            // The grouped kernels take FP8 only when both GEMMs' shapes suit TMA.
            const bool fp8_ok = tma_friendly(2 * I, D) && tma_friendly(D, I);
            d.experts_gate_up = stacked(gu, fp8_ok);
            d.experts_down = stacked(dn, fp8_ok);
            const bool fp8 = experts_run_fp8(c);
            FANOUT_CHECK(d.experts_gate_up.fp8 == fp8 && d.experts_down.fp8 == fp8,
                         "{}: the routed experts are stored as {} but config.json {}: every expert weight must be "
                         "FP8 with weight_scale_inv when the config declares a quantization_config, and none "
                         "otherwise",
                         w_.checkpoint.file_of(fmt::format("model.layers.{}.mlp.experts.{}.gate_proj.weight",
                                                           layer_index, m.expert_begin)),
                         dtype_name(m.experts[0].gate.dtype),
                         c.fp8 ? "has a quantization_config (FP8)" : "has no quantization_config");
        }
    }
    return d;
}

}  // namespace

bool experts_run_fp8(const io::ModelConfig& c) {
    const int64_t I = c.moe_intermediate_size, D = c.hidden_size;
    return c.fp8.has_value() && tma_friendly(2 * I, D) && tma_friendly(D, I);
}

int default_weight_readers() {
    return static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 2, kMaxReaders));
}

WeightPlan plan_weights(const io::ModelConfig& c, const ModelWeights& w, bool with_mtp) {
    WeightPlan plan;
    Planner p(w, plan);
    FANOUT_CHECK(is_float(w.embed.dtype()), "embed_tokens: dtype {} is not a float type", dtype_name(w.embed.dtype()));
    const size_t vocab_rows = static_cast<size_t>(w.embed.numel());
    plan.embed = p.array(vocab_rows * 2);
    p.fill(plan.embed, 0, w.embed.data(), w.embed.nbytes(), w.embed.dtype());
    plan.lm_head = p.bf16_matrix(w.lm_head);
    plan.final_norm = p.f32_vector(w.final_norm);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        plan.layers.push_back(p.layer(c, w.layers[static_cast<size_t>(l)], l));
    if (with_mtp) {
        FANOUT_CHECK(w.mtp.has_value(), "this model has no MTP layer (num_nextn_predict_layers = 0)");
        const MtpWeights& m = *w.mtp;
        MtpPlan mp;
        mp.enorm = p.f32_vector(m.enorm);
        mp.hnorm = p.f32_vector(m.hnorm);
        mp.head_norm = p.f32_vector(m.head_norm);
        mp.eh_proj = p.single(m.eh_proj);
        mp.layer = p.layer(c, m.layer, c.num_hidden_layers);
        // The model's own arrays when the MTP layer has none, or copies of them (DeepSeek-V3's).
        if (same_bytes(m.embed, w.embed)) {
            mp.embed = plan.embed;
        } else {
            FANOUT_CHECK(is_float(m.embed.dtype()), "the MTP layer's embed_tokens: dtype {} is not a float type",
                         dtype_name(m.embed.dtype()));
            mp.embed = p.array(static_cast<size_t>(m.embed.numel()) * 2);
            p.fill(mp.embed, 0, m.embed.data(), m.embed.nbytes(), m.embed.dtype());
        }
        mp.head = same_bytes(m.head, w.lm_head) ? plan.lm_head : p.bf16_matrix(m.head);
        plan.mtp = std::move(mp);
    }
    return plan;
}

// ---------------------------------------------------------------------------------------------
// Streaming

void stream_weights(const WeightPlan& plan, const ModelWeights& w, WeightTarget& target, int readers,
                    const LoadProgress& progress, StreamStats* stats) {
    const auto t0 = steady::now();
    const io::Checkpoint& ck = w.checkpoint;

    // A range of a checkpoint tensor, with the check its bytes get (-1: none).
    struct Range {
        const WeightPlan::Fill* fill;
        size_t arena_at;
        io::Checkpoint::FileRange at;
        int64_t check = -1;
        std::atomic<int> chunks_left{0};
    };
    std::unordered_map<const void*, size_t> check_of;
    for (size_t i = 0; i < w.unchecked.size(); ++i) check_of[w.unchecked[i].data] = i;
    std::vector<bool> streamed(w.unchecked.size(), false);
    std::vector<std::unique_ptr<Range>> ranges;
    ShardFiles files(ck);
    for (const auto& a : plan.arrays)
        for (const auto& f : a.fills) {
            if (f.host) {
                target.write(a.offset + f.at, f.host->data(), f.host->size());
                continue;
            }
            auto r = std::make_unique<Range>();
            r->fill = &f;
            r->arena_at = a.offset + f.at;
            r->at = ck.locate(f.src, f.nbytes);
            files.fd(r->at.shard);
            const auto it = check_of.find(f.src);
            if (it != check_of.end() && w.unchecked[it->second].nbytes() == f.nbytes) {
                r->check = static_cast<int64_t>(it->second);
                streamed[it->second] = true;
            }
            ranges.push_back(std::move(r));
        }
    // Tensors only the host preparation read are checked over the mapping (small); what the plan
    // does not hold is not read.
    std::vector<WeightCheck> rest;
    for (size_t i = 0; i < w.unchecked.size(); ++i)
        if (!streamed[i] && plan.host_sources.count(w.unchecked[i].data)) rest.push_back(w.unchecked[i]);
    check_weight_values(ck, rest);

    // Chunks in file order, so the readers together sweep each shard front to back.
    struct Chunk {
        Range* range;
        size_t begin, end;  // source bytes of the range
    };
    std::vector<Chunk> chunks;
    double total_bytes = 0;
    for (auto& r : ranges) {
        int n = 0;
        for (size_t b = 0; b < r->fill->nbytes; b += WeightTarget::kStagingBytes, ++n)
            chunks.push_back({r.get(), b, std::min(r->fill->nbytes, b + WeightTarget::kStagingBytes)});
        r->chunks_left = n;
        total_bytes += static_cast<double>(r->fill->nbytes);
    }
    std::sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) {
        return std::tie(a.range->at.shard, a.range->at.offset, a.begin) <
               std::tie(b.range->at.shard, b.range->at.offset, b.begin);
    });

    const int num_readers = readers > 0 ? readers : default_weight_readers();
    // Reader r's slice: the chunks whose first byte falls in the r-th of num_readers equal parts
    // of the bytes, in file order.
    std::vector<size_t> slice(static_cast<size_t>(num_readers) + 1, chunks.size());
    {
        double at = 0;
        int r = 0;
        slice[0] = 0;
        for (size_t i = 0; i < chunks.size(); ++i) {
            while (r + 1 < num_readers && at >= total_bytes * (r + 1) / num_readers)
                slice[static_cast<size_t>(++r)] = i;
            at += static_cast<double>(chunks[i].end - chunks[i].begin);
        }
        while (r + 1 < num_readers) slice[static_cast<size_t>(++r)] = chunks.size();
    }
    std::atomic<double> bytes_done{0};
    std::atomic<int64_t> ranges_done{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    std::condition_variable cv;
    int running = num_readers;
    std::exception_ptr error;
    // The first bad value each reader found, as (check index, element); the smallest index is reported.
    std::vector<std::pair<int64_t, int64_t>> bad(static_cast<size_t>(num_readers), {-1, -1});
    double read_s = 0, check_s = 0, wait_s = 0;

    const auto reader_main = [&](int id) {
        double my_read = 0, my_check = 0, my_wait = 0;
        try {
            target.begin_reader(id);
            ShardFiles my_files(ck);  // this reader's own descriptors: its own readahead state
            int slot = 0;
            bool used[2] = {false, false};
            const size_t end = slice[static_cast<size_t>(id) + 1];
            for (size_t i = slice[static_cast<size_t>(id)]; i < end && !failed; ++i, slot ^= 1) {
                const Chunk& ch = chunks[i];
                Range& r = *ch.range;
                if (i + 1 < end) {  // the kernel reads the next chunk while this one is handled
                    const Chunk& nx = chunks[i + 1];
                    ::posix_fadvise(my_files.fd(nx.range->at.shard), static_cast<off_t>(nx.range->at.offset + nx.begin),
                                    static_cast<off_t>(nx.end - nx.begin), POSIX_FADV_WILLNEED);
                }
                auto t = steady::now();
                if (used[slot]) target.wait(id, slot);
                my_wait += seconds_since(t);
                t = steady::now();
                const size_t n = ch.end - ch.begin;
                uint8_t* buf = target.staging(id, slot);
                my_files.read(r.at, ch.begin, buf, n);
                my_read += seconds_since(t);
                t = steady::now();
                if (r.check >= 0) {
                    const WeightCheck& wc = w.unchecked[static_cast<size_t>(r.check)];
                    const size_t es = dtype_size(wc.dtype);
                    const int64_t e = first_bad_weight_value(wc, buf, static_cast<int64_t>(ch.begin / es),
                                                             static_cast<int64_t>(n / es));
                    auto& b = bad[static_cast<size_t>(id)];
                    if (e >= 0 && (b.first < 0 || r.check < b.first)) b = {r.check, e};
                }
                size_t out_n = n, out_at = ch.begin;
                const DType from = r.fill->convert;
                if (from == DType::kF32 || from == DType::kF16) {
                    // To bf16 in place: each output lies at or before its input.
                    const size_t es = dtype_size(from), count = n / es;
                    for (size_t k = 0; k < count; ++k) {
                        float v;
                        if (from == DType::kF32) {
                            std::memcpy(&v, buf + 4 * k, 4);
                        } else {
                            uint16_t h;
                            std::memcpy(&h, buf + 2 * k, 2);
                            v = f16_to_f32(h);
                        }
                        const uint16_t o = f32_to_bf16(v);
                        std::memcpy(buf + 2 * k, &o, 2);
                    }
                    out_n = count * 2;
                    out_at = ch.begin / es * 2;
                }
                my_check += seconds_since(t);
                target.copy(id, slot, r.arena_at + out_at, out_n);
                used[slot] = true;
                bytes_done.fetch_add(static_cast<double>(n));
                if (--r.chunks_left == 0) ++ranges_done;
            }
            target.finish(id);
        } catch (...) {
            failed = true;
            std::lock_guard lock(mu);
            if (!error) error = std::current_exception();
        }
        std::lock_guard lock(mu);
        read_s += my_read;
        check_s += my_check;
        wait_s += my_wait;
        --running;
        cv.notify_all();
    };
    std::vector<std::thread> threads;
    for (int i = 0; i < num_readers; ++i) threads.emplace_back(reader_main, i);
    {
        std::unique_lock lock(mu);
        while (running > 0) {
            cv.wait_for(lock, std::chrono::milliseconds(250));
            if (progress && running > 0) {
                lock.unlock();
                progress({"reading weights", ranges_done.load(), static_cast<int64_t>(ranges.size()), bytes_done.load(),
                          total_bytes});
                lock.lock();
            }
        }
    }
    for (auto& t : threads) t.join();
    if (error) std::rethrow_exception(error);
    std::pair<int64_t, int64_t> first{-1, -1};
    for (const auto& b : bad)
        if (b.first >= 0 && (first.first < 0 || b.first < first.first)) first = b;
    if (first.first >= 0) fail_weight_value(ck, w.unchecked[static_cast<size_t>(first.first)], first.second);
    if (progress)
        progress({"reading weights", static_cast<int64_t>(ranges.size()), static_cast<int64_t>(ranges.size()),
                  total_bytes, total_bytes});
    if (stats) {
        stats->seconds = seconds_since(t0);
        stats->bytes = total_bytes;
        stats->host_bytes = plan.host_bytes;
        stats->readers = num_readers;
        stats->tensors = static_cast<int64_t>(ranges.size());
        stats->read_seconds = read_s;
        stats->check_seconds = check_s;
        stats->copy_wait_seconds = wait_s;
    }
}

}  // namespace fanout::model
