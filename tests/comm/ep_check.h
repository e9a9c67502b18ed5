// Shared by the EP backend tests: every rank's inputs for a step, generated from one seed so that
// any rank (thread or process) knows all of them, and one rank's whole step — dispatch, a check of
// exactly what it received, stand-in experts (a different value per expert, so a row sent to the
// wrong expert shows), combine, a check of the combined output. Returns "" or the first failure.
// The checks are separate functions on host views (check_received, stand_in_outputs,
// check_combined) so the GPU backends' test can run the step on the device and check downloads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fanout/comm/ep.h"
#include "fanout/core/dtype.h"

namespace fanout::comm::testing {

struct RankInput {
    int T = 0;
    std::vector<uint8_t> tokens;  // [T, payload_bytes]
    std::vector<float> scales;    // [T, blocks]
    std::vector<int32_t> topk;    // [T, K], distinct experts per token
    std::vector<float> weight;    // [T, K]
};

inline RankInput make_input(const EpConfig& c, int T, std::mt19937& rng) {
    RankInput in;
    in.T = T;
    const int K = c.experts_per_token;
    in.tokens.resize(size_t(T) * c.payload_bytes());
    for (auto& b : in.tokens) b = uint8_t(rng() % 0x78);  // finite e4m3 / small bf16 halves
    if (c.payload == Payload::kBf16)
        for (size_t i = 1; i < in.tokens.size(); i += 2) in.tokens[i] = 0x3f;  // bf16 high bytes: values near 1
    in.scales.resize(size_t(T) * c.scale_blocks());
    for (auto& s : in.scales) s = float(rng() % 1000) / 997.0f;
    in.topk.resize(size_t(T) * K);
    in.weight.resize(size_t(T) * K);
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
            int e;
            bool dup;
            do {
                e = int(rng() % c.num_experts);
                dup = false;
                for (int j = 0; j < k; ++j) dup |= in.topk[size_t(t) * K + j] == e;
            } while (dup);
            in.topk[size_t(t) * K + k] = e;
            in.weight[size_t(t) * K + k] = float(rng() % 1000) / 1000.0f;
        }
    return in;
}

// The stand-in expert: bf16 of (first payload byte of the row + expert id + column) / 64.
inline float expert_value(uint8_t first_byte, int expert, int col) {
    return (float(first_byte) + expert + col) / 64.0f;
}

// Every rank's inputs for `step`: token counts random in [0, max] and zero for some ranks.
inline std::vector<RankInput> make_step_inputs(const EpConfig& cfg, int step, std::mt19937& rng) {
    std::vector<RankInput> inputs;
    for (int r = 0; r < cfg.world; ++r) {
        const int T = (r + step) % 3 == 0 ? 0 : int(rng() % (cfg.max_tokens_per_rank + 1));
        inputs.push_back(make_input(cfg, T, rng));
    }
    return inputs;
}

// What this rank received, in a host view of recv_batch(): local expert e holds, in (source rank,
// token, choice) order, every choice naming it (the first max_m of them), and counts[e] of them.
// With `any_order` the rows may be any permutation of those (each payload with its scales).
inline std::string check_received(const EpConfig& cfg, const std::vector<RankInput>& inputs, const ExpertBatch& b,
                                  bool any_order = false) {
    const int r = cfg.rank, W = cfg.world, K = cfg.experts_per_token, L = cfg.local_experts();
    const size_t pb = size_t(cfg.payload_bytes()), nb = size_t(cfg.scale_blocks());
    const size_t sb = cfg.payload == Payload::kFp8 ? nb * sizeof(float) : 0;  // scale bytes per row
    std::string failure;
    const auto* got = static_cast<const uint8_t*>(b.tokens);
    // A row as bytes: payload, then its scales.
    const auto row_bytes = [&](const uint8_t* payload, const float* scales) {
        std::string s(reinterpret_cast<const char*>(payload), pb);
        if (sb > 0) s.append(reinterpret_cast<const char*>(scales), sb);
        return s;
    };
    for (int e = 0; e < L; ++e) {
        const int expert = r * L + e;
        std::vector<std::string> want, have;
        for (int src = 0; src < W; ++src)
            for (int t = 0; t < inputs[src].T; ++t)
                for (int k = 0; k < K; ++k)
                    if (inputs[src].topk[size_t(t) * K + k] == expert)
                        want.push_back(row_bytes(inputs[src].tokens.data() + t * pb,
                                                 sb > 0 ? inputs[src].scales.data() + t * nb : nullptr));
        const int count = int(want.size()), kept = std::min(count, b.max_m);
        if (b.counts[e] != count) {
            failure = "rank " + std::to_string(r) + " expert " + std::to_string(expert) + ": count " +
                      std::to_string(b.counts[e]) + ", want " + std::to_string(count);
            continue;
        }
        for (int row = 0; row < kept; ++row) {
            const size_t dst = size_t(e) * b.max_m + row;
            have.push_back(row_bytes(got + dst * pb, sb > 0 ? b.scales + dst * nb : nullptr));
        }
        want.resize(size_t(kept));
        if (any_order) {
            std::sort(want.begin(), want.end());
            std::sort(have.begin(), have.end());
        }
        for (int row = 0; row < kept; ++row)
            if (have[size_t(row)] != want[size_t(row)]) {
                failure = "rank " + std::to_string(r) + " expert " + std::to_string(expert) + " row " +
                          std::to_string(row) + ": wrong payload" + (any_order ? " (rows compared sorted)" : "");
                break;
            }
    }
    return failure;
}

// The stand-in experts' outputs for a host view of recv_batch(): [local_experts, max_m, hidden]
// output values (bf16, or f32 with the f32 payload) as bytes, expert_value of each stored row
// (min(count, max_m) rows per expert; the rest zero).
inline std::vector<uint8_t> stand_in_outputs(const EpConfig& cfg, const ExpertBatch& b) {
    const int H = cfg.hidden, L = cfg.local_experts();
    const size_t pb = size_t(cfg.payload_bytes()), ob = size_t(cfg.output_bytes());
    const auto* got = static_cast<const uint8_t*>(b.tokens);
    std::vector<uint8_t> out_rows(size_t(L) * b.max_m * H * ob);
    for (int e = 0; e < L; ++e)
        for (int i = 0; i < std::min(std::max(b.counts[e], 0), b.max_m); ++i)
            for (int c = 0; c < H; ++c) {
                const float v = expert_value(got[(size_t(e) * b.max_m + i) * pb], cfg.rank * L + e, c);
                uint8_t* dst = out_rows.data() + ((size_t(e) * b.max_m + i) * H + c) * ob;
                if (cfg.payload == Payload::kF32) {
                    std::memcpy(dst, &v, 4);
                } else {
                    const uint16_t h = f32_to_bf16(v);
                    std::memcpy(dst, &h, 2);
                }
            }
    return out_rows;
}

// This rank's combined output `out` [T, hidden] (bf16, or f32 with the f32 payload) after the
// stand-in experts: the weighted sum over the choices that got a row at their expert (their
// (rank, token, choice)-ordered position there < max_m); the others were dropped and add nothing.
// f32 must be exact (the same sums in the same choice order); bf16 within its rounding.
// `residual` (bf16 outputs only): out is combine_recv_add's — the residual's values plus the sum.
inline std::string check_combined(const EpConfig& cfg, const std::vector<RankInput>& inputs, int max_m, const void* out,
                                  const uint16_t* residual = nullptr) {
    const bool f32 = cfg.payload == Payload::kF32;
    const int r = cfg.rank, W = cfg.world, K = cfg.experts_per_token, H = cfg.hidden;
    const size_t pb = size_t(cfg.payload_bytes());
    const RankInput& in = inputs[r];
    const int T = in.T;
    std::vector<int> seen(size_t(cfg.num_experts), 0);
    std::vector<char> kept(size_t(T) * K, 0);
    for (int src = 0; src < W; ++src)
        for (int t = 0; t < inputs[src].T; ++t)
            for (int k = 0; k < K; ++k) {
                const int pos = seen[inputs[src].topk[size_t(t) * K + k]]++;
                if (src == r) kept[size_t(t) * K + k] = pos < max_m;
            }
    for (int t = 0; t < T; ++t)
        for (int c = 0; c < H; ++c) {
            float want = residual != nullptr ? bf16_to_f32(residual[size_t(t) * H + c]) : 0.0f;
            for (int k = 0; k < K; ++k)
                if (kept[size_t(t) * K + k]) {
                    const float v = expert_value(in.tokens[size_t(t) * pb], in.topk[size_t(t) * K + k], c);
                    want += in.weight[size_t(t) * K + k] * (f32 ? v : round_to_bf16(v));
                }
            const size_t i = size_t(t) * H + c;
            const float have =
                f32 ? static_cast<const float*>(out)[i] : bf16_to_f32(static_cast<const uint16_t*>(out)[i]);
            if (f32 ? have != want : !(std::fabs(have - want) <= std::fabs(want) / 128 + 1e-6f))
                return "rank " + std::to_string(r) + " token " + std::to_string(t) + " col " + std::to_string(c) +
                       ": combined " + std::to_string(have) + ", want " + std::to_string(want);
        }
    return "";
}

// One rank's whole step through a host-memory backend (`local`, `mpi`): dispatch, check what it
// received, stand-in experts, combine, check the combined output.
inline std::string run_rank_step(ExpertParallel& ep, const std::vector<RankInput>& inputs) {
    const EpConfig& cfg = ep.config();
    const RankInput& in = inputs[cfg.rank];
    const int32_t T = in.T;
    ep.dispatch_send({&T, in.tokens.data(), in.scales.data(), in.topk.data()});
    ep.dispatch_recv();
    const ExpertBatch b = ep.recv_batch();
    std::string failure = check_received(cfg, inputs, b);
    ep.combine_send(stand_in_outputs(cfg, b).data());
    std::vector<uint8_t> out(size_t(T) * cfg.hidden * cfg.output_bytes(), 0xff);  // poisoned: NaN either way
    ep.combine_recv(in.weight.data(), out.data());
    if (failure.empty()) failure = check_combined(cfg, inputs, b.max_m, out.data());
    return failure;
}

}  // namespace fanout::comm::testing
