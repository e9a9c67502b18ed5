#include "fanout/model/weight_upload.h"

#include <algorithm>
#include <array>

#include "fanout/core/cuda_check.h"

namespace fanout::model {
namespace {

// Reader r's CUDA stream and two pinned staging buffers; the arena is on the device.
class CudaTarget : public WeightTarget {
  public:
    CudaTarget(uint8_t* arena, int readers, int device) : arena_(arena), device_(device), readers_(readers) {}
    ~CudaTarget() override {
        for (auto& r : readers_) {
            if (r.stream) cudaStreamSynchronize(r.stream);
            for (int i = 0; i < 2; ++i) {
                if (r.copied[i]) cudaEventDestroy(r.copied[i]);
                if (r.staging[i]) cudaFreeHost(r.staging[i]);
            }
            if (r.stream) cudaStreamDestroy(r.stream);
        }
    }
    void begin_reader(int reader) override {
        FANOUT_CUDA_CHECK(cudaSetDevice(device_));  // the current device is per thread
        Reader& r = readers_[static_cast<size_t>(reader)];
        FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
        for (int i = 0; i < 2; ++i) {
            FANOUT_CUDA_CHECK(
                cudaHostAlloc(reinterpret_cast<void**>(&r.staging[i]), kStagingBytes, cudaHostAllocDefault));
            FANOUT_CUDA_CHECK(cudaEventCreateWithFlags(&r.copied[i], cudaEventDisableTiming));
        }
    }
    uint8_t* staging(int reader, int slot) override { return readers_[static_cast<size_t>(reader)].staging[slot]; }
    void wait(int reader, int slot) override {
        FANOUT_CUDA_CHECK(cudaEventSynchronize(readers_[static_cast<size_t>(reader)].copied[slot]));
    }
    void copy(int reader, int slot, size_t arena_at, size_t n) override {
        Reader& r = readers_[static_cast<size_t>(reader)];
        FANOUT_CUDA_CHECK(cudaMemcpyAsync(arena_ + arena_at, r.staging[slot], n, cudaMemcpyHostToDevice, r.stream));
        FANOUT_CUDA_CHECK(cudaEventRecord(r.copied[slot], r.stream));
    }
    void finish(int reader) override {
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(readers_[static_cast<size_t>(reader)].stream));
    }
    void write(size_t arena_at, const uint8_t* host, size_t n) override {
        FANOUT_CUDA_CHECK(cudaMemcpy(arena_ + arena_at, host, n, cudaMemcpyHostToDevice));
    }

  private:
    struct Reader {
        cudaStream_t stream = nullptr;
        std::array<uint8_t*, 2> staging{};
        std::array<cudaEvent_t, 2> copied{};
    };
    uint8_t* arena_;
    int device_;
    std::vector<Reader> readers_;
};

// Views of the plan's arrays in the arena.
class ArenaViews {
  public:
    ArenaViews(const WeightPlan& plan, uint8_t* base) : plan_(plan), base_(base) {}
    template <typename T>
    DeviceArray<T> view(int a) const {
        if (a < 0) return {};
        const WeightPlan::Array& arr = plan_.arrays[static_cast<size_t>(a)];
        return DeviceArray<T>::view(reinterpret_cast<T*>(base_ + arr.offset), arr.bytes / sizeof(T));
    }
    DeviceWeight matrix(const MatrixPlan& m) const {
        DeviceWeight d;
        d.fp8 = m.fp8;
        d.batch = m.batch;
        d.N = m.N;
        d.K = m.K;
        d.q = view<uint8_t>(m.q);
        d.scale = view<float>(m.scale);
        d.bf16 = view<uint16_t>(m.bf16);
        return d;
    }
    DeviceLayer layer(const LayerPlan& p) const {
        DeviceLayer d;
        d.input_norm = view<float>(p.input_norm);
        d.post_norm = view<float>(p.post_norm);
        d.q_a_norm = view<float>(p.q_a_norm);
        d.kv_a_norm = view<float>(p.kv_a_norm);
        d.qkv_a = matrix(p.qkv_a);
        d.q_b = matrix(p.q_b);
        d.k_b = matrix(p.k_b);
        d.v_b = matrix(p.v_b);
        d.kv_b = matrix(p.kv_b);
        d.o = matrix(p.o);
        d.moe = p.moe;
        d.has_mlp = p.has_mlp;
        d.gate_up = matrix(p.gate_up);
        d.down = matrix(p.down);
        d.router = view<uint16_t>(p.router);
        d.router_bias = view<float>(p.router_bias);
        d.has_bias = p.router_bias >= 0;
        d.experts_gate_up = matrix(p.experts_gate_up);
        d.experts_down = matrix(p.experts_down);
        return d;
    }

  private:
    const WeightPlan& plan_;
    uint8_t* base_;
};

}  // namespace

DeviceModelWeights upload_model_weights(const io::ModelConfig& c, const ModelWeights& w, const LoadProgress& progress,
                                        StreamStats* stats, bool with_mtp) {
    const WeightPlan plan = plan_weights(c, w, with_mtp);
    DeviceModelWeights d;
    d.arena = DeviceArray<uint8_t>(plan.arena_bytes);
    int device = 0;
    FANOUT_CUDA_CHECK(cudaGetDevice(&device));
    {
        const int readers = default_weight_readers();
        CudaTarget target(d.arena.get(), readers, device);
        stream_weights(plan, w, target, readers, progress, stats);
    }
    const ArenaViews v(plan, d.arena.get());
    d.embed = v.view<uint16_t>(plan.embed);
    d.lm_head = v.view<uint16_t>(plan.lm_head);
    d.final_norm = v.view<float>(plan.final_norm);
    for (const LayerPlan& l : plan.layers) d.layers.push_back(v.layer(l));
    if (plan.mtp) {
        DeviceMtp m;
        m.enorm = v.view<float>(plan.mtp->enorm);
        m.hnorm = v.view<float>(plan.mtp->hnorm);
        m.head_norm = v.view<float>(plan.mtp->head_norm);
        m.eh_proj = v.matrix(plan.mtp->eh_proj);
        m.layer = v.layer(plan.mtp->layer);
        m.embed = v.view<uint16_t>(plan.mtp->embed);
        m.head = v.view<uint16_t>(plan.mtp->head);
        d.mtp = std::move(m);
    }
    return d;
}

}  // namespace fanout::model
