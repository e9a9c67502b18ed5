// The GPU EP backends (`nvlink`, `nccl`; ep_gpu.h) on every visible GPU of this machine: one
// process, one host thread per GPU, NCCL communicators from one unique id. The same steps and
// checks as the host backends (ep_check.h): every rank's inputs come from one seed; each rank
// uploads its own, runs the four halves with device pointers, downloads what it received and what
// it combined, and checks them exactly. Random routing, token counts 0 / max / random per rank,
// several steps through the same endpoints, FP8 and BF16 payloads, odd hidden sizes, V3's shape;
// a whole step captured once in a CUDA graph and replayed with new counts and routing in the same
// buffers; and the dispatch overlap (send → shared expert → recv beats send+recv plus the expert
// alone), timed with CUDA events (2+ GPUs).
#include "fanout/comm/ep_gpu.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ep_check.h"
#include "fanout/comm/local_gpus.h"
#include "fanout/core/cuda_check.h"
#include "fanout/core/cuda_graph.h"
#include "fanout/core/error.h"

namespace fanout::comm::testing {
// ep_gpu_test_kernels.cu
void launch_stand_in_experts(const int32_t* counts, const void* tokens, int payload_bytes, int local_experts, int max_m,
                             int hidden, int expert_begin, uint16_t* out, cudaStream_t stream);
void launch_busy_copy(const void* src, void* dst, size_t bytes, cudaStream_t stream);
}  // namespace fanout::comm::testing

namespace fanout::comm {
namespace {

using testing::RankInput;

int visible_gpus() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // no driver / no device: clear the sticky-less error, report none
        return 0;
    }
    return n;
}

struct CudaFree {
    void operator()(void* p) const { cudaFree(p); }
};
using DeviceBytes = std::unique_ptr<uint8_t, CudaFree>;

DeviceBytes device_bytes(size_t bytes) {
    void* p = nullptr;
    FANOUT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    return DeviceBytes(static_cast<uint8_t*>(p));
}

template <typename T>
void upload(void* dst, const std::vector<T>& src, cudaStream_t s) {
    if (!src.empty())
        FANOUT_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, s));
}

// Every rank's inputs for `step`: per rank 0 tokens, the maximum, or a random count, in turn.
std::vector<RankInput> step_inputs(const EpConfig& cfg, int step, std::mt19937& rng) {
    std::vector<RankInput> inputs;
    for (int r = 0; r < cfg.world; ++r) {
        const int pick = (r + step) % 3;
        const int T = pick == 0 ? 0 : pick == 1 ? cfg.max_tokens_per_rank : int(rng() % (cfg.max_tokens_per_rank + 1));
        inputs.push_back(testing::make_input(cfg, T, rng));
    }
    return inputs;
}

// One rank's device-side buffers for the step's inputs and outputs, sized for the maximum.
struct RankBuffers {
    explicit RankBuffers(const EpConfig& c)
        : cfg(c),
          num_tokens(device_bytes(sizeof(int32_t))),
          tokens(device_bytes(size_t(c.max_tokens_per_rank) * c.payload_bytes())),
          scales(device_bytes(size_t(c.max_tokens_per_rank) * c.scale_blocks() * sizeof(float))),
          topk(device_bytes(size_t(c.max_tokens_per_rank) * c.experts_per_token * sizeof(int32_t))),
          weight(device_bytes(size_t(c.max_tokens_per_rank) * c.experts_per_token * sizeof(float))),
          expert_out(device_bytes(size_t(c.local_experts()) * c.rows_per_expert() * c.hidden * 2)),
          out(device_bytes(size_t(c.max_tokens_per_rank) * c.hidden * 2)) {}

    // The rank's inputs into the buffers; out poisoned (0xffff: a bf16 NaN).
    void load(const RankInput& in, cudaStream_t s) {
        FANOUT_CUDA_CHECK(cudaMemcpyAsync(num_tokens.get(), &in.T, sizeof(int32_t), cudaMemcpyHostToDevice, s));
        upload(tokens.get(), in.tokens, s);
        upload(scales.get(), in.scales, s);
        upload(topk.get(), in.topk, s);
        upload(weight.get(), in.weight, s);
        FANOUT_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, size_t(cfg.max_tokens_per_rank) * cfg.hidden * 2, s));
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));  // the host vectors may go after this
    }

    DispatchInput input() const {
        return {reinterpret_cast<const int32_t*>(num_tokens.get()), tokens.get(),
                cfg.payload == Payload::kFp8 ? reinterpret_cast<const float*>(scales.get()) : nullptr,
                reinterpret_cast<const int32_t*>(topk.get())};
    }
    const float* weights() const { return reinterpret_cast<const float*>(weight.get()); }
    uint16_t* expert_rows() const { return reinterpret_cast<uint16_t*>(expert_out.get()); }
    uint16_t* combined() const { return reinterpret_cast<uint16_t*>(out.get()); }

    EpConfig cfg;
    DeviceBytes num_tokens, tokens, scales, topk, weight, expert_out, out;
};

// A host copy of recv_batch().
struct HostBatch {
    std::vector<int32_t> counts;
    std::vector<uint8_t> tokens;
    std::vector<float> scales;
    int max_m = 0;

    HostBatch(const EpConfig& c, const ExpertBatch& b, cudaStream_t s) : max_m(b.max_m) {
        const size_t rows = size_t(c.local_experts()) * b.max_m;
        counts.resize(c.local_experts());
        tokens.resize(rows * c.payload_bytes());
        FANOUT_CUDA_CHECK(cudaMemcpyAsync(counts.data(), b.counts, counts.size() * 4, cudaMemcpyDeviceToHost, s));
        FANOUT_CUDA_CHECK(cudaMemcpyAsync(tokens.data(), b.tokens, tokens.size(), cudaMemcpyDeviceToHost, s));
        if (c.payload == Payload::kFp8) {
            scales.resize(rows * c.scale_blocks());
            FANOUT_CUDA_CHECK(cudaMemcpyAsync(scales.data(), b.scales, scales.size() * 4, cudaMemcpyDeviceToHost, s));
        }
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    ExpertBatch view() const { return {counts.data(), tokens.data(), scales.empty() ? nullptr : scales.data(), max_m}; }
};

std::vector<uint16_t> download_combined(const RankBuffers& d, int T, cudaStream_t s) {
    std::vector<uint16_t> out(size_t(T) * d.cfg.hidden);
    if (!out.empty())
        FANOUT_CUDA_CHECK(cudaMemcpyAsync(out.data(), d.combined(), out.size() * 2, cudaMemcpyDeviceToHost, s));
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
    return out;
}

// After a step ran on the device (eagerly or as a graph): what this rank received and combined.
std::string check_step(ExpertParallel& ep, const RankBuffers& d, const std::vector<RankInput>& inputs, cudaStream_t s) {
    const EpConfig& cfg = ep.config();
    const HostBatch hb(cfg, ep.recv_batch(), s);
    const auto out = download_combined(d, inputs[cfg.rank].T, s);
    ep.raise_if_failed();
    std::string f = testing::check_received(cfg, inputs, hb.view(), !cfg.rows_droppable());
    if (f.empty()) f = testing::check_combined(cfg, inputs, hb.max_m, out.data());
    return f;
}

// One rank's step, eagerly, the experts on the host (ep_check.h's stand-ins on the downloaded rows).
std::string eager_step(ExpertParallel& ep, RankBuffers& d, const std::vector<RankInput>& inputs, cudaStream_t s) {
    const EpConfig& cfg = ep.config();
    d.load(inputs[cfg.rank], s);
    ep.dispatch_send(d.input());
    ep.dispatch_recv();
    const HostBatch hb(cfg, ep.recv_batch(), s);
    std::string f = testing::check_received(cfg, inputs, hb.view(), !cfg.rows_droppable());
    upload(d.expert_rows(), testing::stand_in_outputs(cfg, hb.view()), s);
    ep.combine_send(d.expert_rows());
    ep.combine_recv(d.weights(), d.combined());
    const auto out = download_combined(d, inputs[cfg.rank].T, s);
    ep.raise_if_failed();
    if (f.empty()) f = testing::check_combined(cfg, inputs, hb.max_m, out.data());
    if (cfg.payload == Payload::kF32 || !f.empty()) return f;
    // The same returned rows added into a residual (the GPU layer's combine): residual + the sum,
    // and the rows past T (the rest of the residual buffer) left as they were.
    const int T = inputs[cfg.rank].T;
    const size_t all = size_t(cfg.max_tokens_per_rank) * cfg.hidden, mine = size_t(T) * cfg.hidden;
    std::vector<uint16_t> residual(all);
    for (size_t i = 0; i < residual.size(); ++i)
        residual[i] = i < mine ? f32_to_bf16(float(int(i % 23) - 11) / 8.0f) : uint16_t(0x7f00 + i % 97);
    upload(d.combined(), residual, s);
    ep.combine_recv_add(d.weights(), d.combined());
    const auto added = download_combined(d, cfg.max_tokens_per_rank, s);
    ep.raise_if_failed();
    for (size_t i = mine; i < all; ++i)
        if (added[i] != residual[i])
            return "combine_recv_add wrote row " + std::to_string(i / cfg.hidden) + " past the rank's " +
                   std::to_string(T) + " tokens (value " + std::to_string(i % cfg.hidden) + ")";
    return testing::check_combined(cfg, inputs, hb.max_m, added.data(), residual.data());
}

// One whole step on the device: the four halves around the device stand-in experts.
void device_step(ExpertParallel& ep, const RankBuffers& d, cudaStream_t s) {
    const EpConfig& cfg = ep.config();
    ep.dispatch_send(d.input());
    ep.dispatch_recv();
    const ExpertBatch b = ep.recv_batch();
    testing::launch_stand_in_experts(b.counts, b.tokens, cfg.payload_bytes(), cfg.local_experts(), b.max_m, cfg.hidden,
                                     cfg.expert_begin(), d.expert_rows(), s);
    FANOUT_CUDA_CHECK(cudaGetLastError());
    ep.combine_send(d.expert_rows());
    ep.combine_recv(d.weights(), d.combined());
}

EpConfig with_world(EpConfig c, int world) {
    c.world = world;
    return c;
}

class EpGpu : public ::testing::TestWithParam<GpuBackend> {
  protected:
    void SetUp() override {
        world_ = visible_gpus();
        if (world_ == 0) GTEST_SKIP() << "no CUDA device visible";
    }

    // `steps` eager steps of `cfg` (its world replaced by the GPU count) through the same endpoints.
    void run_steps(EpConfig cfg, int steps, unsigned seed) {
        cfg = with_world(cfg, world_);
        LocalGpus g(world_);
        std::vector<std::unique_ptr<ExpertParallel>> eps(world_);
        std::vector<std::unique_ptr<RankBuffers>> bufs(world_);
        auto failures = g.run([&](int r) {
            EpConfig c = cfg;
            c.rank = r;
            eps[r] = make_gpu_ep(GetParam(), c, g.comm(r), g.stream(r));
            bufs[r] = std::make_unique<RankBuffers>(c);
        });
        for (const auto& f : failures) ASSERT_TRUE(f.empty()) << f;
        std::mt19937 rng(seed);
        for (int step = 0; step < steps; ++step) {
            const auto inputs = step_inputs(cfg, step, rng);
            std::vector<std::string> wrong(world_);
            failures = g.run([&](int r) { wrong[r] = eager_step(*eps[r], *bufs[r], inputs, g.stream(r)); });
            for (int r = 0; r < world_; ++r) {
                EXPECT_TRUE(failures[r].empty()) << "step " << step << ": " << failures[r];
                EXPECT_TRUE(wrong[r].empty()) << "step " << step << ": " << wrong[r];
            }
        }
        g.run([&](int r) {
            eps[r].reset();
            bufs[r].reset();
        });
    }

    int world_ = 0;
};

TEST_P(EpGpu, Fp8DispatchBf16CombineSeveralSteps) {
    run_steps({0, 0, 16 * world_, 8, 256, 24, Payload::kFp8, 0}, 5, 7);
}

TEST_P(EpGpu, Bf16PayloadOddHidden) { run_steps({0, 0, 4 * world_, 3, 130, 9, Payload::kBf16, 0}, 4, 11); }

TEST_P(EpGpu, Fp8PayloadOddHidden) { run_steps({0, 0, 4 * world_, 3, 130, 9, Payload::kFp8, 0}, 4, 12); }

TEST_P(EpGpu, RowsPastMaxMAreDroppedNotMisplaced) { run_steps({0, 0, 2 * world_, 2, 64, 16, Payload::kFp8, 3}, 4, 13); }

// More tokens per rank than the ordered dispatch's 256-token chunks and than its row kernels'
// 264 blocks have warps: the one-shot dispatch (nothing droppable) and the ordered one (max_m
// 200, so rows are dropped at world 1).
// 600 tokens per rank: past the nvlink combine's 512-token grid, whose blocks then stride over tokens.
TEST_P(EpGpu, ManyTokensPerRank) {
    run_steps({0, 0, 8 * world_, 4, 64, 600, Payload::kFp8, 0}, 3, 19);
    run_steps({0, 0, 8 * world_, 4, 64, 600, Payload::kFp8, 200}, 3, 23);
}

TEST_P(EpGpu, DeepSeekV3Shape) {
    // hidden 7168, top-8 of 256 experts (needs the GPU count to divide 256).
    if (256 % world_ != 0) GTEST_SKIP() << world_ << " GPUs do not divide 256 experts";
    run_steps({0, 0, 256, 8, 7168, 64, Payload::kFp8, 0}, 3, 17);
}

// One full step (four halves + the device stand-in experts) captured once, replayed with other
// counts and routing written into the same device buffers; every replay checked.
TEST_P(EpGpu, CudaGraphReplaysWithNewCountsAndRouting) {
    for (const EpConfig base : {EpConfig{0, 0, 16 * world_, 8, 256, 32, Payload::kFp8, 0},
                                EpConfig{0, 0, 4 * world_, 3, 130, 9, Payload::kBf16, 0}}) {
        const EpConfig cfg = with_world(base, world_);
        LocalGpus g(world_);
        std::mt19937 rng(23);
        constexpr int kReplays = 4;
        std::vector<std::vector<RankInput>> steps;
        for (int i = 0; i < kReplays + 1; ++i) steps.push_back(step_inputs(cfg, i, rng));
        std::vector<std::vector<std::string>> wrong(kReplays + 1, std::vector<std::string>(world_));
        const auto failures = g.run([&](int r) {
            EpConfig c = cfg;
            c.rank = r;
            const cudaStream_t s = g.stream(r);
            auto ep = make_gpu_ep(GetParam(), c, g.comm(r), s);
            RankBuffers d(c);
            wrong[0][r] = eager_step(*ep, d, steps[0], s);  // warm-up (connections, lazy setup), checked
            const cudaGraphExec_t exec = capture_graph(s, [&] { device_step(*ep, d, s); });
            for (int i = 1; i <= kReplays; ++i) {
                d.load(steps[i][r], s);
                FANOUT_CUDA_CHECK(cudaGraphLaunch(exec, s));
                FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
                wrong[i][r] = check_step(*ep, d, steps[i], s);
            }
            FANOUT_CUDA_CHECK(cudaGraphExecDestroy(exec));
        });
        for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
        for (int i = 0; i <= kReplays; ++i)
            for (const auto& w : wrong[i])
                EXPECT_TRUE(w.empty()) << "hidden " << cfg.hidden << " replay " << i << ": " << w;
    }
}

// Issue 7: send → shared expert → recv takes less than send+recv plus the expert alone. Each of
// (a) dispatch_send; dispatch_recv, (b) the stand-in shared expert (a memory-bound copy sized to
// take about half of (a)) alone, (c) dispatch_send; expert; dispatch_recv is a CUDA graph (with the
// combine after the dispatch, so every replay is a whole step), replayed with the ranks started
// together; medians of the event-timed spans.
TEST_P(EpGpu, SharedExpertOverlapsDispatch) {
    if (world_ < 2) GTEST_SKIP() << "the overlap needs a peer: 1 GPU visible";
    if (256 % world_ != 0) GTEST_SKIP() << world_ << " GPUs do not divide 256 experts";
    const EpConfig cfg{0, world_, 256, 8, 7168, 512, Payload::kFp8, 0};
    LocalGpus g(world_);
    std::mt19937 rng(29);
    std::vector<RankInput> inputs;
    for (int r = 0; r < world_; ++r) inputs.push_back(testing::make_input(cfg, cfg.max_tokens_per_rank, rng));
    std::barrier sync(world_);
    std::vector<std::array<double, 3>> medians(world_);
    const auto failures = g.run([&](int r) {
        EpConfig c = cfg;
        c.rank = r;
        const cudaStream_t s = g.stream(r);
        auto ep = make_gpu_ep(GetParam(), c, g.comm(r), s);
        RankBuffers d(c);
        d.load(inputs[r], s);
        cudaEvent_t e0, e1;
        FANOUT_CUDA_CHECK(cudaEventCreate(&e0));
        FANOUT_CUDA_CHECK(cudaEventCreate(&e1));
        const auto mark = [&](cudaEvent_t e) {
            FANOUT_CUDA_CHECK(cudaEventRecordWithFlags(e, s, cudaEventRecordExternal));
        };
        // Replays `exec` n times, all ranks starting together; the median of e0 → e1 in µs.
        const auto median_us = [&](cudaGraphExec_t exec, int n) {
            std::vector<double> us;
            for (int i = 0; i < n; ++i) {
                FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
                sync.arrive_and_wait();
                FANOUT_CUDA_CHECK(cudaGraphLaunch(exec, s));
                FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
                float ms = 0;
                FANOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                us.push_back(ms * 1000.0);
            }
            std::sort(us.begin(), us.end());
            return us[us.size() / 2];
        };
        const auto combine = [&] {
            ep->combine_send(d.expert_rows());
            ep->combine_recv(d.weights(), d.combined());
        };
        device_step(*ep, d, s);  // warm-up
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
        const cudaGraphExec_t a = capture_graph(s, [&] {
            mark(e0);
            ep->dispatch_send(d.input());
            ep->dispatch_recv();
            mark(e1);
            combine();
        });
        const double a_us = median_us(a, 10);
        // The shared expert: a copy sized from this GPU's copy rate to take about a_us / 2.
        constexpr size_t kProbe = size_t(64) << 20;
        DeviceBytes src = device_bytes(size_t(1) << 30), dst = device_bytes(size_t(1) << 30);
        const auto copy_graph = [&](size_t bytes) {
            return capture_graph(s, [&] {
                mark(e0);
                testing::launch_busy_copy(src.get(), dst.get(), bytes, s);
                mark(e1);
            });
        };
        const cudaGraphExec_t probe = copy_graph(kProbe);
        const double probe_us = median_us(probe, 5);
        const size_t copy_bytes = std::clamp<size_t>(size_t(double(kProbe) * (a_us / 2) / probe_us) / 16 * 16,
                                                     size_t(1) << 20, size_t(1) << 30);
        const cudaGraphExec_t b = copy_graph(copy_bytes);
        const cudaGraphExec_t cg = capture_graph(s, [&] {
            mark(e0);
            ep->dispatch_send(d.input());
            testing::launch_busy_copy(src.get(), dst.get(), copy_bytes, s);
            ep->dispatch_recv();
            mark(e1);
            combine();
        });
        std::vector<double> ta, tb, tc;
        for (int round = 0; round < 5; ++round) {
            ta.push_back(median_us(a, 5));
            tb.push_back(median_us(b, 5));
            tc.push_back(median_us(cg, 5));
        }
        const auto med = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            return v[v.size() / 2];
        };
        medians[r] = {med(ta), med(tb), med(tc)};
        ep->raise_if_failed();
        std::printf(
            "[%s rank %d] (a) send;recv %.1f us  (b) shared expert alone (%.1f MB copy) %.1f us  "
            "(c) send;expert;recv %.1f us  vs (a)+(b) %.1f us\n",
            gpu_backend_name(GetParam()), r, medians[r][0], copy_bytes / 1e6, medians[r][1], medians[r][2],
            medians[r][0] + medians[r][1]);
        for (cudaGraphExec_t e : {a, probe, b, cg}) FANOUT_CUDA_CHECK(cudaGraphExecDestroy(e));
        FANOUT_CUDA_CHECK(cudaEventDestroy(e0));
        FANOUT_CUDA_CHECK(cudaEventDestroy(e1));
    });
    for (const auto& f : failures) ASSERT_TRUE(f.empty()) << f;
    for (int r = 0; r < world_; ++r)
        EXPECT_LT(medians[r][2], medians[r][0] + medians[r][1])
            << "rank " << r << ": the shared expert did not overlap the dispatch";
}

// Two steps queued back to back with no host sync between them, the first with no tokens on every
// rank but 0, whose experts are slow (a long copy on its stream before them): an idle rank's
// combine must still wait for the peers' returns, or its second dispatch lands in rank 0's rows
// while rank 0 still computes the first step's experts on them (nvlink; the review of the
// twentieth session). Both steps checked: rank 0's first combine, every rank's second.
TEST_P(EpGpu, AnIdleRankWaitsBeforeItsNextDispatch) {
    if (world_ < 2) GTEST_SKIP() << "needs a peer (2+ GPUs)";
    const EpConfig cfg = with_world({0, 0, 4 * world_, 4, 256, 64, Payload::kFp8, 0}, world_);
    LocalGpus g(world_);
    std::mt19937 rng(41);
    std::vector<RankInput> first, second;
    for (int r = 0; r < world_; ++r)
        first.push_back(testing::make_input(cfg, r == 0 ? cfg.max_tokens_per_rank : 0, rng));
    for (int r = 0; r < world_; ++r) second.push_back(testing::make_input(cfg, cfg.max_tokens_per_rank, rng));
    std::vector<std::string> wrong(world_);
    const auto failures = g.run([&](int r) {
        EpConfig c = cfg;
        c.rank = r;
        const cudaStream_t s = g.stream(r);
        auto ep = make_gpu_ep(GetParam(), c, g.comm(r), s);
        RankBuffers d1(c), d2(c);
        d1.load(first[r], s);
        d2.load(second[r], s);
        DeviceBytes src = device_bytes(size_t(256) << 20), dst = device_bytes(size_t(256) << 20);
        g.sync();
        ep->dispatch_send(d1.input());
        ep->dispatch_recv();
        if (r == 0)  // ~1 ms on an H200: far longer than the idle ranks' way to their next dispatch
            for (int i = 0; i < 8; ++i) testing::launch_busy_copy(src.get(), dst.get(), size_t(256) << 20, s);
        const ExpertBatch b = ep->recv_batch();
        testing::launch_stand_in_experts(b.counts, b.tokens, c.payload_bytes(), c.local_experts(), b.max_m, c.hidden,
                                         c.expert_begin(), d1.expert_rows(), s);
        FANOUT_CUDA_CHECK(cudaGetLastError());
        ep->combine_send(d1.expert_rows());
        ep->combine_recv(d1.weights(), d1.combined());
        device_step(*ep, d2, s);
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
        ep->raise_if_failed();
        if (r == 0) {
            const auto out = download_combined(d1, first[0].T, s);
            wrong[r] = testing::check_combined(c, first, b.max_m, out.data());
            if (!wrong[r].empty()) wrong[r] = "first step: " + wrong[r];
        }
        if (wrong[r].empty()) {
            const std::string w = check_step(*ep, d2, second, s);
            if (!w.empty()) wrong[r] = "second step: " + w;
        }
    });
    for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
    for (int r = 0; r < world_; ++r) EXPECT_TRUE(wrong[r].empty()) << "rank " << r << ": " << wrong[r];
}

// Bad inputs do not fail inside the calls (the device owns the counts): the step completes on
// every rank and raise_if_failed() names the fault afterwards — both backends (the nvlink one's
// stores would otherwise go to a peer that does not exist).
TEST_P(EpGpu, BadExpertIdIsReportedAfterTheStep) {
    const EpConfig cfg{0, world_, 4 * world_, 2, 64, 4, Payload::kFp8, 0};
    LocalGpus g(world_);
    std::mt19937 rng(31);
    std::vector<RankInput> inputs;
    for (int r = 0; r < world_; ++r) inputs.push_back(testing::make_input(cfg, 3, rng));
    inputs[0].topk[1] = cfg.num_experts;  // rank 0, token 0, choice 1
    std::string message;
    const auto failures = g.run([&](int r) {
        EpConfig c = cfg;
        c.rank = r;
        auto ep = make_gpu_ep(GetParam(), c, g.comm(r), g.stream(r));
        RankBuffers d(c);
        d.load(inputs[r], g.stream(r));
        device_step(*ep, d, g.stream(r));
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(g.stream(r)));
        if (r != 0) return ep->raise_if_failed();
        try {
            ep->raise_if_failed();
        } catch (const Error& e) {
            message = e.what();
        }
    });
    for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
    EXPECT_NE(message.find("token 0 choice 1 names an expert outside"), std::string::npos) << message;
}

// No silent hangs (nvlink): rank 0 dispatches while the others skip the step; its device-side
// waits give up after timeout_ms and raise_if_failed() names the peer it waited for.
TEST_P(EpGpu, AMissingPeerIsATimeoutNamingIt) {
    if (GetParam() != GpuBackend::kNvlink) GTEST_SKIP() << "the nccl backend's waits are NCCL's own";
    if (world_ < 2) GTEST_SKIP() << "needs a peer to miss (2+ GPUs)";
    const EpConfig cfg{0, world_, 4 * world_, 2, 64, 4, Payload::kFp8, 0};
    LocalGpus g(world_);
    std::mt19937 rng(37);
    std::vector<RankInput> inputs;
    for (int r = 0; r < world_; ++r) inputs.push_back(testing::make_input(cfg, 3, rng));
    std::string message;
    std::barrier done(world_);
    const auto failures = g.run([&](int r) {
        EpConfig c = cfg;
        c.rank = r;
        GpuEpOptions o;
        o.timeout_ms = 200;
        auto ep = make_gpu_ep(GetParam(), c, g.comm(r), g.stream(r), o);  // collective: every rank
        RankBuffers d(c);
        if (r == 0) {
            d.load(inputs[r], g.stream(r));
            device_step(*ep, d, g.stream(r));
            FANOUT_CUDA_CHECK(cudaStreamSynchronize(g.stream(r)));
            try {
                ep->raise_if_failed();
            } catch (const Error& e) {
                message = e.what();
            }
        }
        done.arrive_and_wait();  // no rank frees its window while rank 0's kernels may still store into it
    });
    for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
    // Nothing droppable, so the one-shot dispatch: its first wait is for the peers' rows. (The
    // ordered protocol's first, for their token counts, was this test's until the one-shot
    // dispatch came; two GPUs had not been lent since.)
    EXPECT_NE(message.find("timed out in dispatch (waiting for its rows) waiting for rank 1"), std::string::npos)
        << "rank 0's error: '" << message << "'";
}

INSTANTIATE_TEST_SUITE_P(Backends, EpGpu, ::testing::Values(GpuBackend::kNvlink, GpuBackend::kNccl),
                         [](const ::testing::TestParamInfo<GpuBackend>& p) {
                             return std::string(gpu_backend_name(p.param));
                         });

}  // namespace
}  // namespace fanout::comm
