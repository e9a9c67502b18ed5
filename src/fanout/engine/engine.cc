#include "fanout/engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

namespace fanout::engine {

using clock_type = std::chrono::steady_clock;

namespace {

// Why a request fails when the device sampler refuses one of its rows (ops::kNotFinite), as the
// host sampler's error does.
constexpr const char* kNotFiniteOnDevice =
    "sample: the model's output is not finite (a NaN or +inf logit, or every logit -inf; on the device)";

// A logit row of `sampler`'s request as the device samples it: its parameters, its generator's
// next draw, and its biases — entries [bias.size(), + its count) of the step's bias array, which
// the caller appends once per request (append_bias) after that request's rows.
ops::SamplingRow sampling_row(ops::Sampler& sampler, const std::vector<ops::LogitBias>& bias) {
    const ops::SamplingParams& p = sampler.params();
    return {p.temperature,
            p.top_k,
            p.top_p,
            sampler.next_uniform(),
            static_cast<int32_t>(bias.size()),
            static_cast<int32_t>(p.logit_bias.size())};
}

void append_bias(std::vector<ops::LogitBias>& bias, const ops::Sampler& sampler) {
    for (const auto& [id, b] : sampler.params().logit_bias) bias.push_back({id, b});
}

// The drafts a scheduled chunk carries after its last known token: > 0 only in an MTP decode step
// (the last token, then its drafts). A chunk that wants logits has drafts + 1 logit rows.
int64_t drafts_in(const ScheduledSeq& s) { return s.start + s.num_tokens - s.seq->total_len(); }

int64_t microseconds_since(clock_type::time_point t0) {
    return std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - t0).count();
}

}  // namespace

std::vector<int32_t> ModelRunner::forward_sample(const model::StepBatch&, kv::PagedKvCache&,
                                                 std::span<const ops::SamplingRow>, std::span<const ops::LogitBias>) {
    FANOUT_FAIL("this model runner samples on the host (forward_sample is for device runners)");
}

std::string ModelRunner::enable_mtp(int) { return "this model runner does not draft with MTP"; }

std::vector<int32_t> ModelRunner::draft_mtp(const model::StepBatch&, std::span<const int32_t>, bool,
                                            kv::PagedKvCache&) {
    FANOUT_FAIL("this model runner does not draft with MTP (draft_mtp)");
}

EngineConfig::Microbatch parse_microbatch(const std::string& name) {
    if (name == "off") return EngineConfig::Microbatch::kOff;
    if (name == "on") return EngineConfig::Microbatch::kOn;
    if (name == "auto") return EngineConfig::Microbatch::kAuto;
    FANOUT_FAIL("--microbatch '{}': choose on, off or auto", name);
}

int64_t microbatch_min_tokens_from(std::vector<MicrobatchTiming> timings) {
    for (const MicrobatchTiming& t : timings)
        FANOUT_CHECK(t.tokens >= 1 && t.one_batch_us > 0 && t.microbatch_us > 0,
                     "microbatch timing of {} tokens: {} µs as one batch, {} µs as two microbatches (all must be "
                     "positive)",
                     t.tokens, t.one_batch_us, t.microbatch_us);
    std::sort(timings.begin(), timings.end(),
              [](const MicrobatchTiming& a, const MicrobatchTiming& b) { return a.tokens < b.tokens; });
    const auto wins = [](const MicrobatchTiming& t) { return t.microbatch_us < kMicrobatchMargin * t.one_batch_us; };
    if (timings.empty() || !wins(timings.back())) return std::numeric_limits<int64_t>::max();
    // The winning sizes at the top: a step larger than the last losing size replays a winning
    // size's graph (sizes are buckets: a step pads up to the next one).
    auto t = timings.rbegin();
    while (t != timings.rend() && wins(*t)) ++t;
    return t == timings.rend() ? 1 : t->tokens + 1;
}

void EngineStats::Histogram::observe(double seconds) {
    int b = 0;
    while (b < kNumBuckets && seconds > kBuckets[b]) ++b;
    ++counts[b];
    sum += seconds;
    ++count;
}

void EngineStats::add(const EngineStats& o) {
    for (const auto& [name, field] : kCounters) this->*field += o.*field;
    for (auto [to, from] : {std::pair{&ttft, &o.ttft}, std::pair{&itl, &o.itl}, std::pair{&e2e, &o.e2e}}) {
        for (int b = 0; b <= kNumBuckets; ++b) to->counts[b] += from->counts[b];
        to->sum += from->sum;
        to->count += from->count;
    }
}

bool RequestHandle::next(RequestEvent* ev, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
    *ev = std::move(events_.front());
    events_.pop_front();
    return true;
}

void RequestHandle::cancel() {
    std::function<void()> fn;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (cancelled_.exchange(true)) return;
        fn = std::move(on_cancel_);
    }
    if (fn) fn();
}

void RequestHandle::on_cancel(std::function<void()> fn) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!cancelled_) {
            on_cancel_ = std::move(fn);
            return;
        }
    }
    if (fn) fn();
}

void RequestHandle::push(RequestEvent ev) {
    std::shared_ptr<std::function<void()>> notify;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        events_.push_back(std::move(ev));
        notify = notify_;
    }
    cv_.notify_one();
    if (notify) (*notify)();
}

void RequestHandle::on_event(std::function<void()> notify) {
    std::shared_ptr<std::function<void()>> now;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        notify_ = notify ? std::make_shared<std::function<void()>>(std::move(notify)) : nullptr;
        if (!events_.empty()) now = notify_;
    }
    if (now) (*now)();
}

// A request in flight: its sequence, sampler, detokenizer and stop-string state.
struct Engine::Active {
    std::shared_ptr<Sequence> seq;
    std::shared_ptr<RequestHandle> handle;
    RequestParams params;
    std::optional<ops::Sampler> sampler;
    std::optional<io::IncrementalDecoder> decoder;
    std::string text;    // decoded output so far
    size_t emitted = 0;  // bytes of `text` already sent
    size_t hold = 0;     // bytes held back so a stop string is never sent in part
    clock_type::time_point submitted, last_token;
    bool first_token = true;
    int64_t drafted = 0, accepted = 0;  // MTP drafts checked, and accepted
};

namespace {
// The scheduler's limits, with the KV slots MTP drafting writes past a chunk, inside the context.
SchedulerConfig scheduler_config(const EngineConfig& c, int64_t max_context) {
    SchedulerConfig s = c.scheduler;
    s.draft_lookahead = std::max(0, c.mtp_draft_tokens - 1);
    s.max_context = max_context;
    return s;
}

// The longest sequence the engine takes: the runner's context, at most what the cache holds.
int64_t context_limit(const ModelRunner& runner, const EngineConfig& c, const kv::PagedKvCache& cache) {
    return std::min<int64_t>(runner.max_context(), c.num_kv_blocks * cache.config().block_size);
}
}  // namespace

Engine::Engine(std::unique_ptr<ModelRunner> runner, const io::Tokenizer* tokenizer, const EngineConfig& config)
    : runner_(std::move(runner)),
      tokenizer_(tokenizer),
      config_(config),
      cache_(runner_->kv_cache_config(config.num_kv_blocks)),
      prefix_(cache_.allocator(), cache_.config().block_size),
      max_context_(context_limit(*runner_, config, cache_)),
      scheduler_(scheduler_config(config, max_context_), prefix_),
      eos_(runner_->eos_ids()) {
    stats_.kv_blocks_total = config.num_kv_blocks;
    FANOUT_CHECK(config.microbatch_min_tokens >= 1, "--microbatch-min-tokens must be >= 1, got {}",
                 config.microbatch_min_tokens);
    const bool may_microbatch = config.microbatch == EngineConfig::Microbatch::kOn ||
                                (config.microbatch == EngineConfig::Microbatch::kAuto &&
                                 config.microbatch_min_tokens < std::numeric_limits<int64_t>::max());
    if (may_microbatch) {
        const std::string why = runner_->microbatch_support();
        FANOUT_CHECK(why.empty(), "--microbatch {}: {}",
                     config.microbatch == EngineConfig::Microbatch::kOn ? "on" : "auto", why);
    }
    if (config.mtp_draft_tokens != 0) {
        FANOUT_CHECK(config.mtp_draft_tokens >= 1 && config.mtp_draft_tokens <= kMaxDraftTokens,
                     "--mtp {}: draft tokens must be in 0..{}", config.mtp_draft_tokens, kMaxDraftTokens);
        const std::string why = runner_->enable_mtp(config.mtp_draft_tokens);
        FANOUT_CHECK(why.empty(), "--mtp {}: {}", config.mtp_draft_tokens, why);
        FANOUT_CHECK(config.mtp_draft_tokens < config.scheduler.prefill_chunk,
                     "--mtp {}: a step must hold the last token and its drafts (--prefill-chunk {})",
                     config.mtp_draft_tokens, config.scheduler.prefill_chunk);
    }
    prefix_.set_listener([this](const std::vector<uint64_t>& stored, const std::vector<uint64_t>& removed) {
        kv_events_.publish(stored, removed);
    });
}

Engine::~Engine() {
    stop();
    kv_events_.close();
}

void validate_request(const RequestParams& p, int64_t max_context, int64_t V, bool has_tokenizer) {
    const int64_t P = static_cast<int64_t>(p.prompt.size());
    FANOUT_CHECK(P > 0, "the prompt is empty");
    FANOUT_CHECK(p.max_tokens >= 1, "max_tokens must be >= 1, got {}", p.max_tokens);
    FANOUT_CHECK(p.max_tokens <= max_context - P,  // (not P + max_tokens: that can overflow)
                 "prompt ({} tokens) + max_tokens ({}) exceeds the context of {} tokens", P, p.max_tokens, max_context);
    for (int64_t i = 0; i < P; ++i)
        FANOUT_CHECK(p.prompt[i] >= 0 && p.prompt[i] < V,
                     "prompt token {} (index {}) is outside the vocabulary [0, {})", p.prompt[i], i, V);
    for (const auto& [id, bias] : p.sampling.logit_bias)
        FANOUT_CHECK(id >= 0 && id < V, "logit_bias: token id {} is outside the vocabulary [0, {})", id, V);
    FANOUT_CHECK(p.stop.empty() || has_tokenizer, "stop strings need a tokenizer");
    for (const auto& s : p.stop) FANOUT_CHECK(!s.empty(), "stop strings must not be empty");
    ops::validate_sampling_params(p.sampling);
}

void Engine::validate(const RequestParams& p) const {
    validate_request(p, max_context_, runner_->vocab_size(), tokenizer_ != nullptr);
}

std::shared_ptr<RequestHandle> Engine::submit(RequestParams p) {
    validate(p);
    const int64_t P = static_cast<int64_t>(p.prompt.size());
    auto a = std::make_unique<Active>();
    a->sampler.emplace(p.sampling);
    if (tokenizer_) a->decoder.emplace(*tokenizer_, p.skip_special_tokens);
    for (const auto& s : p.stop) a->hold = std::max(a->hold, s.size() - 1);
    a->seq = std::make_shared<Sequence>();
    a->seq->tokens = p.prompt;
    a->seq->prompt_len = P;
    a->seq->max_tokens = p.max_tokens;
    a->handle = std::make_shared<RequestHandle>();
    a->params = std::move(p);
    a->submitted = clock_type::now();
    auto handle = a->handle;
    {
        std::lock_guard<std::mutex> lock(incoming_mutex_);
        handle->id_ = a->seq->id = next_id_++;
        incoming_.push_back(std::move(a));
    }
    {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.requests_received;
        stats_.prompt_tokens += P;
    }
    incoming_cv_.notify_one();
    return handle;
}

void Engine::admit_incoming() {
    std::vector<std::unique_ptr<Active>> batch;
    {
        std::lock_guard<std::mutex> lock(incoming_mutex_);
        batch.swap(incoming_);
    }
    for (auto& a : batch) {
        scheduler_.add(a->seq);
        active_[a->seq->id] = std::move(a);
    }
}

void Engine::reap_cancelled() {
    std::vector<int64_t> gone;
    for (auto& [id, a] : active_)
        if (a->handle->cancelled()) gone.push_back(id);
    for (int64_t id : gone) {
        finish(*active_[id], "abort");
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.requests_aborted;
    }
}

void Engine::emit(Active& a, std::string text, std::vector<int32_t> tokens, bool finished, const std::string& reason) {
    RequestEvent ev;
    ev.text = std::move(text);
    ev.tokens = std::move(tokens);
    ev.finished = finished;
    ev.finish_reason = reason;
    ev.prompt_tokens = a.seq->prompt_len;
    ev.completion_tokens = a.seq->num_generated();
    ev.cached_tokens = a.seq->prefix_hit_tokens;
    ev.draft_tokens = a.drafted;
    ev.accepted_draft_tokens = a.accepted;
    a.handle->push(std::move(ev));
}

void Engine::finish(Active& a, const std::string& reason, std::vector<int32_t> tokens) {
    std::string rest;
    if (a.decoder && reason != "abort") {
        a.text += a.decoder->flush();
        rest = a.text.substr(std::min(a.emitted, a.text.size()));
    }
    const double e2e = std::chrono::duration<double>(clock_type::now() - a.submitted).count();
    scheduler_.finish(a.seq.get());
    emit(a, std::move(rest), std::move(tokens), true, reason);
    {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.requests_finished;
        stats_.cached_prompt_tokens += a.seq->prefix_hit_tokens;
        stats_.e2e.observe(e2e);
    }
    const int64_t id = a.seq->id;  // erasing destroys `a`
    active_.erase(id);
}

void Engine::fail(Active& a, const std::string& why) {
    std::fprintf(stderr, "engine: request %lld failed: %s\n", static_cast<long long>(a.seq->id), why.c_str());
    finish(a, "error");
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.requests_failed;
}

// A new token: stop conditions first, then the text it adds (minus what a stop string may claim).
void Engine::postprocess(Active& a, int32_t token) {
    Sequence& seq = *a.seq;
    seq.tokens.push_back(token);
    const auto now = clock_type::now();
    {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.generation_tokens;
        if (a.first_token)
            stats_.ttft.observe(std::chrono::duration<double>(now - a.submitted).count());
        else
            stats_.itl.observe(std::chrono::duration<double>(now - a.last_token).count());
    }
    a.first_token = false;
    a.last_token = now;
    const bool eos = !a.params.ignore_eos && std::find(eos_.begin(), eos_.end(), token) != eos_.end();
    if (a.decoder && !eos) {
        const size_t before = a.text.size();
        a.text += a.decoder->push(token);
        size_t at = std::string::npos;  // the earliest match of any stop string
        for (const auto& s : a.params.stop) {
            const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
            at = std::min(at, a.text.find(s, std::min(from, a.text.size())));
        }
        if (at != std::string::npos) {
            a.text.resize(at);
            emit(a, a.text.substr(std::min(a.emitted, at)), {}, false, "");
            a.emitted = a.text.size();
            a.decoder.reset();  // nothing after the stop string is sent
            finish(a, "stop", {token});
            return;
        }
    }
    if (eos) return finish(a, "stop", {token});
    if (seq.num_generated() >= seq.max_tokens) return finish(a, "length", {token});
    std::string out;
    if (a.decoder && a.text.size() > a.emitted + a.hold) {
        size_t end = a.text.size() - a.hold;
        while (end > a.emitted && (static_cast<uint8_t>(a.text[end]) & 0xc0) == 0x80) --end;  // whole characters
        out = a.text.substr(a.emitted, end - a.emitted);
        a.emitted = end;
    }
    emit(a, std::move(out), {token}, false, "");
}

bool Engine::step() {
    admit_incoming();
    reap_cancelled();
    const std::vector<ScheduledSeq> work = scheduler_.schedule();
    if (work.empty() && !config_.lockstep) {
        publish_gauges();
        return false;
    }
    const bool mtp = config_.mtp_draft_tokens > 0;
    model::StepBatchBuilder builder(cache_);
    std::vector<int32_t> with_draft;
    for (const auto& s : work) {
        kv::SequenceBlocks blocks{s.seq->blocks, s.start + s.num_tokens};
        // With MTP a chunk holding drafts (a decode step: the last token, then its drafts) needs
        // every row's logits to check them; the hidden states of every token go to the MTP layer.
        using L = model::StepBatchBuilder::Logits;
        const int64_t drafts = drafts_in(s);
        std::span<const int32_t> chunk;
        if (drafts > 0) {
            with_draft.assign(s.seq->tokens.begin() + s.start, s.seq->tokens.end());
            with_draft.insert(with_draft.end(), s.seq->draft.begin(), s.seq->draft.begin() + drafts);
            chunk = with_draft;
        } else {
            chunk = std::span(s.seq->tokens).subspan(static_cast<size_t>(s.start), static_cast<size_t>(s.num_tokens));
        }
        builder.add(chunk, s.start, blocks, !s.wants_logits ? L::kNone : drafts > 0 ? L::kAll : L::kLast);
    }
    model::StepBatch batch = builder.build();
    batch.all_hidden = mtp;
    last_step_tokens_ = batch.num_tokens();
    switch (config_.microbatch) {
        case EngineConfig::Microbatch::kOff:
            batch.microbatch = false;
            break;
        case EngineConfig::Microbatch::kOn:
            batch.microbatch = true;
            break;
        case EngineConfig::Microbatch::kAuto:
            // A lockstep rank runs what its group decided: every rank's exchanges must match.
            batch.microbatch =
                config_.lockstep ? group_microbatch_ : batch.num_tokens() >= config_.microbatch_min_tokens;
            break;
    }
    if (mtp) {
        std::vector<ScheduledSeq> verified = work;
        step_speculative(verified, batch);
    } else if (runner_->samples_on_device()) {
        std::vector<ops::SamplingRow> rows;
        std::vector<ops::LogitBias> bias;
        for (const auto& s : work) {
            if (!s.wants_logits) continue;
            ops::Sampler& sampler = *active_.at(s.seq->id)->sampler;
            rows.push_back(sampling_row(sampler, bias));
            append_bias(bias, sampler);
        }
        const auto t0 = clock_type::now();
        const std::vector<int32_t> tokens = runner_->forward_sample(batch, cache_, rows, bias);
        forward_done(t0);
        scheduler_.commit(work);
        size_t row = 0;
        for (const auto& s : work) {
            if (!s.wants_logits) continue;
            Active& a = *active_.at(s.seq->id);
            const int32_t token = tokens.at(row++);
            if (token == ops::kNotFinite)  // as the host sampler's refusal: this request only
                fail(a, kNotFiniteOnDevice);
            else
                postprocess(a, token);
        }
    } else {
        const auto t0 = clock_type::now();
        const Tensor logits = runner_->forward(batch, cache_);
        forward_done(t0);
        scheduler_.commit(work);
        const int64_t V = runner_->vocab_size();
        int64_t row = 0;
        for (const auto& s : work) {
            if (!s.wants_logits) continue;
            Active& a = *active_.at(s.seq->id);
            int32_t token = 0;
            try {  // a row the sampler refuses fails its own request, not the step
                token = a.sampler->sample(logits.data_as<float>() + row++ * V, V);
            } catch (const Error& e) {
                fail(a, e.what());
                continue;
            }
            postprocess(a, token);
        }
    }
    publish_gauges();
    if (work.empty()) return false;  // a lockstep engine's empty step
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.steps;
    if (batch.microbatch) ++stats_.microbatch_steps;
    return true;
}

// A step with MTP drafting: every logit row gets its sampling row first — each draft row the
// draft it checks and two draws, each sequence's last row one draw — so the host and the device
// pick with the same draws; then the chunk's tokens (sampled where the runner samples) and each
// sequence that reached its last known token walks its rows (Sampler::pick / SamplingRow::draft:
// greedy keeps the argmax, sampling the rejection rule), keeping the accepted drafts and one more
// token — the first that differs, or the one after them all. Only the KV of the known tokens and
// the accepted drafts counts as computed. Then the MTP layer runs over the positions just computed
// (its own KV, with the tokens that follow them), and for each sequence still generating its last
// row proposes the next draft; the layer runs again on that draft for each further one.
void Engine::step_speculative(std::vector<ScheduledSeq>& work, const model::StepBatch& batch) {
    std::vector<ops::SamplingRow> sampling;
    std::vector<ops::LogitBias> bias;
    for (const auto& s : work) {
        if (!s.wants_logits) continue;
        ops::Sampler& sampler = *active_.at(s.seq->id)->sampler;
        const int64_t drafts = drafts_in(s);
        for (int64_t j = 0; j <= drafts; ++j) {
            ops::SamplingRow r = sampling_row(sampler, bias);
            if (j < drafts) {
                r.draft = s.seq->draft[static_cast<size_t>(j)];
                r.uniform_residual = sampler.next_uniform();
            }
            sampling.push_back(r);
        }
        append_bias(bias, sampler);
    }
    std::vector<int32_t> picked;            // one token per logit row
    std::map<int64_t, std::string> failed;  // requests whose rows the sampler refused, and why
    const auto t0 = clock_type::now();
    if (runner_->samples_on_device()) {
        picked = runner_->forward_sample(batch, cache_, sampling, bias);
        forward_done(t0);
        size_t row = 0;
        for (const auto& s : work) {  // a row the device refused fails its request, as below
            if (!s.wants_logits) continue;
            const size_t rows = static_cast<size_t>(drafts_in(s)) + 1;
            if (std::any_of(picked.begin() + row, picked.begin() + row + rows,
                            [](int32_t t) { return t == ops::kNotFinite; }))
                failed.emplace(s.seq->id, kNotFiniteOnDevice);
            row += rows;
        }
    } else {
        const Tensor logits = runner_->forward(batch, cache_);
        forward_done(t0);
        const int64_t V = runner_->vocab_size();
        size_t row = 0;
        for (const auto& s : work) {
            if (!s.wants_logits) continue;
            ops::Sampler& sampler = *active_.at(s.seq->id)->sampler;
            const int64_t drafts = drafts_in(s);
            const size_t first = picked.size();
            try {
                for (int64_t j = 0; j <= drafts; ++j, ++row)
                    picked.push_back(sampler.pick(logits.data_as<float>() + static_cast<int64_t>(row) * V, V,
                                                  sampling[row].uniform, sampling[row].draft,
                                                  sampling[row].uniform_residual));
            } catch (const Error& e) {
                // Fails this request after the commit, as a device refusal does: kNotFinite rows,
                // which reject its first draft.
                failed.emplace(s.seq->id, e.what());
                row = first + static_cast<size_t>(drafts) + 1;
                picked.resize(first);
                picked.resize(row, ops::kNotFinite);
            }
        }
    }
    struct Result {
        int64_t id = 0, row0 = 0, valid = 0;  // hidden rows [row0, row0 + valid) hold computed KV
        int64_t rows = 0;                     // rows the chunk had (its drafts included)
        bool checked = false;                 // the chunk checked drafts
        std::vector<int32_t> tokens;          // to emit
    };
    std::vector<Result> results(work.size());
    int64_t row = 0, logit_row = 0, drafted = 0, accepted = 0;
    for (size_t i = 0; i < work.size(); ++i) {
        ScheduledSeq& s = work[i];
        Sequence& seq = *s.seq;
        Result& r = results[i];
        r.id = seq.id;
        r.row0 = row;
        r.valid = r.rows = s.num_tokens;
        row += s.num_tokens;
        if (!s.wants_logits) continue;
        Active& a = *active_.at(seq.id);
        const int64_t last = seq.total_len() - 1 - s.start;  // the last known token's row in the chunk
        const int64_t drafts = drafts_in(s);                 // s.num_tokens - 1 - last
        const int32_t* tokens = picked.data() + logit_row;   // the last known token's row, then the drafts'
        logit_row += 1 + drafts;
        int64_t j = 0;
        for (; j < drafts; ++j) {
            r.tokens.push_back(tokens[j]);
            if (tokens[j] != seq.draft[static_cast<size_t>(j)]) break;  // the emitted token is the draft iff accepted
        }
        if (j == drafts) r.tokens.push_back(tokens[drafts]);
        r.checked = drafts > 0;
        drafted += drafts;
        accepted += j;
        a.drafted += drafts;
        a.accepted += j;
        r.valid = last + 1 + j;
        s.num_tokens = r.valid;
        seq.draft.clear();
    }
    scheduler_.commit(work);
    for (size_t i = 0; i < work.size(); ++i) {
        if (const auto f = failed.find(results[i].id); f != failed.end()) {
            fail(*active_.at(f->first), f->second);
            continue;
        }
        for (int32_t t : results[i].tokens) {
            const auto it = active_.find(results[i].id);
            if (it == active_.end()) break;  // finished on an earlier token
            postprocess(*it->second, t);
        }
    }
    {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        stats_.draft_tokens += drafted;
        stats_.accepted_draft_tokens += accepted;
    }
    // The MTP layer over the computed positions: at position p it reads the token at p + 1 and
    // the hidden state at p. A checked chunk goes in whole — its rejected drafts' rows too, with
    // token 0 where none follows yet — so a decode step's pass has one shape whatever was accepted
    // (a GPU runner replays it from a graph); their MTP KV lies past the computed length, is never
    // read, and is overwritten when those positions are computed. The draft comes from the last
    // computed row.
    using L = model::StepBatchBuilder::Logits;
    const int64_t bs = cache_.config().block_size;
    model::StepBatchBuilder mb(cache_);
    std::vector<int32_t> hidden_rows;  // of the kept hidden states, for the MTP layer
    std::vector<int32_t> draft_rows;   // the pass's logit rows
    int64_t mtp_tokens = 0;
    std::vector<int32_t> pass_tokens;
    struct Drafting {
        Sequence* seq;
        int k;
    };
    std::vector<Drafting> drafting;
    for (size_t i = 0; i < work.size(); ++i) {
        const auto it = active_.find(results[i].id);
        if (it == active_.end()) continue;
        Sequence& seq = *it->second->seq;
        const ScheduledSeq& s = work[i];
        const int64_t valid = results[i].valid;
        if (s.start + valid + 1 > seq.total_len()) continue;  // no token after the last computed one yet
        int64_t k = 0;
        if (s.wants_logits) {
            // Drafts the request can still use, that the context holds (the check runs at positions
            // up to total_len - 1 + k), and whose chained MTP rows have KV slots (up to total_len - 3 + k).
            k = std::min<int64_t>({config_.mtp_draft_tokens, seq.max_tokens - seq.num_generated() - 1,
                                   max_context_ - seq.total_len(),
                                   static_cast<int64_t>(seq.blocks.size()) * bs - seq.total_len() + 2});
        }
        const int64_t n = results[i].checked ? results[i].rows : valid;
        pass_tokens.assign(static_cast<size_t>(n), 0);
        for (int64_t r = 0; r < n && s.start + r + 1 < seq.total_len(); ++r)
            pass_tokens[static_cast<size_t>(r)] = seq.tokens[static_cast<size_t>(s.start + r + 1)];
        mb.add(pass_tokens, s.start, kv::SequenceBlocks{seq.blocks, s.start + n}, L::kNone);
        for (int64_t r = 0; r < n; ++r) hidden_rows.push_back(static_cast<int32_t>(results[i].row0 + r));
        if (k > 0) {
            draft_rows.push_back(static_cast<int32_t>(mtp_tokens + valid - 1));
            drafting.push_back({&seq, static_cast<int>(k)});
        }
        mtp_tokens += n;
    }
    // A lockstep rank runs the MTP layer K times every step, drafting or not: its MoE layer is a
    // collective of all ranks, like every other.
    const bool every_pass = config_.lockstep;
    if (hidden_rows.empty() && !every_pass) return;
    const auto draft_start = clock_type::now();
    model::StepBatch pass = mb.build();
    pass.logit_rows = std::move(draft_rows);
    // A draft the device sampler refused (kNotFinite: the MTP layer's output went wrong) ends that
    // sequence's drafts; the next step checks the ones before it.
    const std::vector<int32_t> first = runner_->draft_mtp(pass, hidden_rows, false, cache_);
    for (size_t q = 0; q < drafting.size(); ++q) {
        drafting[q].seq->draft.clear();
        if (first.at(q) == ops::kNotFinite)
            drafting[q].k = 0;
        else
            drafting[q].seq->draft = {first.at(q)};
    }
    // Further drafts: the MTP layer again, on the draft it just made and its own hidden state.
    for (int c = 1; c < config_.mtp_draft_tokens; ++c) {
        model::StepBatchBuilder cb(cache_);
        std::vector<int32_t> from;  // rows of the last pass's output, for the drafts that go on
        std::vector<Sequence*> next;
        for (size_t q = 0; q < drafting.size(); ++q) {
            if (drafting[q].k <= c) continue;
            Sequence& seq = *drafting[q].seq;
            const int64_t pos = seq.total_len() - 2 + c;
            cb.add(std::span(seq.draft).subspan(static_cast<size_t>(c - 1), 1), pos,
                   kv::SequenceBlocks{seq.blocks, pos + 1}, L::kLast);
            from.push_back(static_cast<int32_t>(q));
            next.push_back(&seq);
        }
        if (next.empty() && !every_pass) break;
        const std::vector<int32_t> more = runner_->draft_mtp(cb.build(), from, true, cache_);
        std::vector<Drafting> kept;
        for (size_t q = 0; q < next.size(); ++q) {
            if (more.at(q) == ops::kNotFinite) continue;
            next[q]->draft.push_back(more.at(q));
            kept.push_back(drafting[static_cast<size_t>(from[q])]);
        }
        drafting = std::move(kept);
    }
    add_time(&EngineStats::draft_microseconds, draft_start);
}

void Engine::add_time(int64_t EngineStats::*counter, clock_type::time_point t0) {
    const int64_t us = microseconds_since(t0);
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.*counter += us;
}

void Engine::forward_done(clock_type::time_point t0) {
    const int64_t us = microseconds_since(t0), mha = runner_->mha_requests();
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.forward_microseconds += us;
    if (mha > 0) {
        ++stats_.mha_steps;
        stats_.mha_requests += mha;
    }
}

// Gauges are copied under the stats lock by the engine thread, so stats() never reads the
// scheduler while it changes.
void Engine::publish_gauges() {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.waiting = scheduler_.num_waiting();
    stats_.running = scheduler_.num_running();
    stats_.preemptions = scheduler_.total_preemptions();
    stats_.kv_blocks_used = prefix_.num_used_blocks();
    stats_.kv_blocks_cached = prefix_.num_cached_blocks();
}

void Engine::start() {
    if (thread_.joinable()) return;
    stopping_ = false;
    thread_ = std::thread([this] {
        while (!stopping_) {
            bool did = false;
            try {
                did = step();
            } catch (const std::exception& e) {
                // A failed step fails the requests in it, never the server.
                std::fprintf(stderr, "engine: step failed: %s\n", e.what());
                std::vector<int64_t> ids;
                for (auto& [id, a] : active_) ids.push_back(id);
                for (int64_t id : ids) finish(*active_[id], "error");
                std::lock_guard<std::mutex> lock(stats_mutex_);
                stats_.requests_failed += static_cast<int64_t>(ids.size());
            }
            if (!did) {
                std::unique_lock<std::mutex> lock(incoming_mutex_);
                incoming_cv_.wait_for(lock, std::chrono::milliseconds(active_.empty() ? 50 : 1),
                                      [&] { return stopping_ || !incoming_.empty(); });
            }
        }
    });
}

void Engine::stop() {
    stopping_ = true;
    incoming_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    return stats_;
}

}  // namespace fanout::engine
