#include "fanout/model/generate.h"

#include <algorithm>
#include <chrono>

namespace fanout::model {

GenerateResult generate(const DeepseekV3& model, kv::PagedKvCache& cache, const GenerateRequest& req,
                        const ForwardOptions& opts, const Stream& s, const std::function<void(int32_t)>& on_token) {
    const SampleStep step = [&](const StepBatch& batch, ops::Sampler& sampler) {
        auto out = model.forward(batch, cache, opts, s);
        return batch.logit_rows.empty() ? -1 : sampler.sample(out.logits.data_as<float>(), model.config().vocab_size);
    };
    return generate_loop(model.config(), cache, req, step, on_token);
}

GenerateResult generate_loop(const io::ModelConfig& c, kv::PagedKvCache& cache, const GenerateRequest& req,
                             const SampleStep& step, const std::function<void(int32_t)>& on_token) {
    const int64_t P = static_cast<int64_t>(req.prompt.size());
    FANOUT_CHECK(P > 0, "the prompt is empty: give at least one token");
    FANOUT_CHECK(req.max_tokens >= 1, "max_tokens must be >= 1, got {}", req.max_tokens);
    FANOUT_CHECK(req.prefill_chunk >= 1, "prefill_chunk must be >= 1, got {}", req.prefill_chunk);
    for (int64_t i = 0; i < P; ++i)
        FANOUT_CHECK(req.prompt[i] >= 0 && req.prompt[i] < c.vocab_size,
                     "prompt token {} (index {}) is outside the vocabulary [0, {})", req.prompt[i], i, c.vocab_size);
    FANOUT_CHECK(req.max_tokens <= c.max_position_embeddings - P,  // not P + max_tokens: it may overflow
                 "prompt ({} tokens) + max_tokens ({}) exceeds the model's max_position_embeddings {}", P,
                 req.max_tokens, c.max_position_embeddings);
    ops::Sampler sampler(req.sampling);

    GenerateResult res;
    res.prompt_tokens = P;
    kv::SequenceBlocks seq;
    const int64_t total = P + req.max_tokens;
    cache.reserve(seq, total);  // throws, naming the shortfall, when the cache is too small
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    int32_t next = -1;
    try {
        for (int64_t start = 0; start < P; start += req.prefill_chunk) {
            const int64_t n = std::min(req.prefill_chunk, P - start);
            StepBatch batch =
                StepBatchBuilder(cache)
                    .add(std::span(req.prompt).subspan(start, n), start, seq,
                         start + n == P ? StepBatchBuilder::Logits::kLast : StepBatchBuilder::Logits::kNone)
                    .build();
            const int32_t token = step(batch, sampler);
            if (start + n == P) next = token;
        }
        res.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
        t0 = clock::now();
        for (int64_t i = 0;; ++i) {
            res.tokens.push_back(next);
            if (on_token) on_token(next);
            const bool eos = !req.ignore_eos &&
                             std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end();
            if (eos) {
                res.finish_reason = "stop";
                break;
            }
            if (i + 1 >= req.max_tokens) {
                res.finish_reason = "length";
                break;
            }
            const int32_t tok[1] = {next};
            StepBatch batch = StepBatchBuilder(cache).add(tok, P + i, seq).build();
            next = step(batch, sampler);
        }
    } catch (...) {
        cache.release(seq);
        throw;
    }
    res.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    cache.release(seq);
    return res;
}

}  // namespace fanout::model
