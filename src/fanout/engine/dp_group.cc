#include "fanout/engine/dp_group.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>

#include "fanout/io/json_util.h"
#include "fanout/kv/prefix_cache.h"

namespace fanout::engine {
namespace {

using json = nlohmann::json;

// The wire form of the control messages: MessagePack of these JSON shapes.
//   step (rank 0 → all): {"stop": bool, "microbatch": bool, "assign": [{"rank", "id", "params": {...}}],
//                         "cancel": [[rank, id]]}
//   report (rank → 0):   {"events": [{"id", "text", "tokens", "finished", "reason", "p", "c", "cached", "d", "a"}],
//                         "stats": {...}, "kv": [{"reset", "stored": [hash], "removed": [hash]}], "n": step tokens}
json params_to_json(const RequestParams& p) {
    json bias = json::array();
    for (const auto& [id, b] : p.sampling.logit_bias) bias.push_back({id, b});
    return {{"prompt", p.prompt},
            {"max_tokens", p.max_tokens},
            {"temperature", p.sampling.temperature},
            {"top_k", p.sampling.top_k},
            {"top_p", p.sampling.top_p},
            {"seed", p.sampling.seed},
            {"logit_bias", bias},
            {"stop", p.stop},
            {"ignore_eos", p.ignore_eos},
            {"skip_special_tokens", p.skip_special_tokens}};
}

RequestParams params_from_json(const json& j) {
    RequestParams p;
    p.prompt = j.at("prompt").get<std::vector<int32_t>>();
    p.max_tokens = j.at("max_tokens").get<int64_t>();
    p.sampling.temperature = j.at("temperature").get<float>();
    p.sampling.top_k = j.at("top_k").get<int>();
    p.sampling.top_p = j.at("top_p").get<float>();
    p.sampling.seed = j.at("seed").get<uint64_t>();
    for (const auto& b : j.at("logit_bias"))
        p.sampling.logit_bias.emplace_back(b.at(0).get<int32_t>(), b.at(1).get<float>());
    p.stop = j.at("stop").get<std::vector<std::string>>();
    p.ignore_eos = j.at("ignore_eos").get<bool>();
    p.skip_special_tokens = j.at("skip_special_tokens").get<bool>();
    return p;
}

json histogram_to_json(const EngineStats::Histogram& h) {
    return {
        {"counts", std::vector<int64_t>(std::begin(h.counts), std::end(h.counts))}, {"sum", h.sum}, {"count", h.count}};
}

EngineStats::Histogram histogram_from_json(const json& j) {
    EngineStats::Histogram h;
    const auto counts = j.at("counts").get<std::vector<int64_t>>();
    FANOUT_CHECK(counts.size() == std::size(h.counts), "histogram with {} buckets, expected {}", counts.size(),
                 std::size(h.counts));
    std::copy(counts.begin(), counts.end(), h.counts);
    h.sum = j.at("sum").get<double>();
    h.count = j.at("count").get<int64_t>();
    return h;
}

json stats_to_json(const EngineStats& s) {
    json j;
    for (const auto& [name, field] : EngineStats::kCounters) j[name] = s.*field;
    j["ttft"] = histogram_to_json(s.ttft);
    j["itl"] = histogram_to_json(s.itl);
    j["e2e"] = histogram_to_json(s.e2e);
    return j;
}

EngineStats stats_from_json(const json& j) {
    EngineStats s;
    for (const auto& [name, field] : EngineStats::kCounters) s.*field = j.at(name).get<int64_t>();
    s.ttft = histogram_from_json(j.at("ttft"));
    s.itl = histogram_from_json(j.at("itl"));
    s.e2e = histogram_from_json(j.at("e2e"));
    return s;
}

// A peer's message: bounded in depth before it is decoded (io::parse_msgpack_bounded).
json decode(const std::vector<uint8_t>& bytes, const std::string& what) {
    return io::parse_msgpack_bounded(bytes, what + " on the control plane");
}

}  // namespace

struct DpRank::Pending {
    int64_t id = 0;
    RequestParams params;
    std::vector<uint64_t> hashes;  // the prompt's KV block hashes, for placement
    std::shared_ptr<RequestHandle> handle;
};

struct DpRank::Proxy {
    std::shared_ptr<RequestHandle> handle;
    int rank = 0;
    int64_t tokens = 0;  // prompt + max_tokens: its share of the rank's load
    bool cancel_sent = false;
};

DpRank::DpRank(std::unique_ptr<Engine> engine, std::unique_ptr<comm::ControlPlane> control)
    : engine_(std::move(engine)),
      control_(std::move(control)),
      load_requests_(static_cast<size_t>(control_->world()), 0),
      load_tokens_(static_cast<size_t>(control_->world()), 0),
      rank_stats_(static_cast<size_t>(control_->world())),
      last_step_tokens_(static_cast<size_t>(control_->world()), 0),
      placer_(engine_ ? engine_->config().dp_placement : PlacementConfig{}, control_->world()) {
    FANOUT_CHECK(engine_ && engine_->config().lockstep,
                 "DP rank {}: its engine must step in lockstep (EngineConfig::lockstep)", control_->rank());
}

DpRank::~DpRank() = default;

std::string DpRank::failure() const {
    std::lock_guard lock(mutex_);
    return failure_;
}

std::shared_ptr<RequestHandle> DpRank::submit(RequestParams params) {
    FANOUT_CHECK(rank() == 0, "requests enter a DP group at rank 0 (this is rank {})", rank());
    engine_->validate(params);  // every rank's engine has the same limits
    auto handle = std::make_shared<RequestHandle>();
    std::vector<uint64_t> hashes;
    if (placer_.config().policy == "prefix") hashes = kv::block_hashes(params.prompt, engine_->kv_block_size());
    {
        std::lock_guard lock(mutex_);
        if (!failure_.empty()) throw ServiceUnavailable(503, fmt::format("the deployment stopped: {}", failure_));
        if (stopping_) throw ServiceUnavailable(503, "the deployment is shutting down");
        handle->id_ = next_id_++;
        pending_.push_back({handle->id_, std::move(params), std::move(hashes), handle});
    }
    cv_.notify_all();
    return handle;
}

void DpRank::stop() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    cv_.notify_all();
}

EngineStats DpRank::stats() const {
    std::lock_guard lock(mutex_);
    EngineStats all;
    for (const auto& s : rank_stats_) all.add(s);
    return all;
}

std::vector<EngineStats> DpRank::rank_stats() const {
    std::lock_guard lock(mutex_);
    return rank_stats_;
}

std::vector<int64_t> DpRank::rank_loads() const {
    std::lock_guard lock(mutex_);
    return load_requests_;
}

std::vector<Placer::Target> DpRank::targets_locked() const {
    std::vector<Placer::Target> t(static_cast<size_t>(world()));
    for (size_t r = 0; r < t.size(); ++r) {
        t[r].requests = load_requests_[r];
        t[r].tokens = load_tokens_[r];
    }
    return t;
}

Placer::Choice DpRank::place(const std::vector<int32_t>& prompt) const {
    const auto hashes = kv::block_hashes(prompt, engine_->kv_block_size());
    std::lock_guard lock(mutex_);
    return placer_.preview(hashes, targets_locked());
}

// Rank 0: waits until there is something to run (or to stop), then places the queued requests on
// ranks and names the cancelled ones.
std::vector<uint8_t> DpRank::next_step_message() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return stopping_ || !pending_.empty() || !proxies_.empty(); });
    // The two-microbatch schedule for the step, the same on every rank (its exchanges are
    // collectives): under auto, on when the largest rank's last step reached the threshold.
    const EngineConfig& ec = engine_->config();
    const int64_t largest =
        last_step_tokens_.empty() ? 0 : *std::max_element(last_step_tokens_.begin(), last_step_tokens_.end());
    const bool microbatch = ec.microbatch == EngineConfig::Microbatch::kAuto && largest >= ec.microbatch_min_tokens;
    json msg = {{"stop", stopping_}, {"microbatch", microbatch}, {"assign", json::array()}, {"cancel", json::array()}};
    if (!stopping_) {
        for (Pending& p : pending_) {
            const int best = placer_.choose(p.hashes, targets_locked()).target;
            const int64_t tokens = static_cast<int64_t>(p.params.prompt.size()) + p.params.max_tokens;
            ++load_requests_[best];
            load_tokens_[best] += tokens;
            msg["assign"].push_back({{"rank", best}, {"id", p.id}, {"params", params_to_json(p.params)}});
            proxies_[p.id] = Proxy{std::move(p.handle), best, tokens, false};
        }
        pending_.clear();
        for (auto& [id, proxy] : proxies_)
            if (!proxy.cancel_sent && proxy.handle->cancelled()) {
                proxy.cancel_sent = true;
                msg["cancel"].push_back({proxy.rank, id});
            }
    }
    return json::to_msgpack(msg);
}

void DpRank::apply_step_message(const std::vector<uint8_t>& bytes, bool* stop) {
    const json msg = decode(bytes, "step message");
    try {
        *stop = msg.at("stop").get<bool>();
        if (*stop) return;
        engine_->set_group_microbatch(msg.at("microbatch").get<bool>());
        for (const auto& a : msg.at("assign")) {
            if (a.at("rank").get<int>() != rank()) continue;
            const int64_t id = a.at("id").get<int64_t>();
            try {
                running_[id] = engine_->submit(params_from_json(a.at("params")));
            } catch (const Error& e) {  // rank 0 checked it with the same limits: a request error, not the group's
                auto h = std::make_shared<RequestHandle>();
                RequestEvent ev;
                ev.finished = true;
                ev.finish_reason = "error";
                h->push(std::move(ev));
                running_[id] = h;
                std::fprintf(stderr, "DP rank %d: request %lld refused: %s\n", rank(), (long long)id, e.what());
            }
        }
        for (const auto& c : msg.at("cancel")) {
            if (c.at(0).get<int>() != rank()) continue;
            const auto it = running_.find(c.at(1).get<int64_t>());
            if (it != running_.end()) it->second->cancel();
        }
    } catch (const json::exception& e) {
        FANOUT_FAIL("malformed step message on the control plane: {}", e.what());
    }
}

// This rank's events since the last step (every event of every request it runs), its counters and
// its prefix cache's changes.
std::vector<uint8_t> DpRank::report() {
    json events = json::array();
    for (auto it = running_.begin(); it != running_.end();) {
        RequestEvent ev;
        bool finished = false;
        while (!finished && it->second->next(&ev, std::chrono::milliseconds(0))) {
            finished = ev.finished;
            events.push_back({{"id", it->first},
                              {"text", ev.text},
                              {"tokens", ev.tokens},
                              {"finished", ev.finished},
                              {"reason", ev.finish_reason},
                              {"p", ev.prompt_tokens},
                              {"c", ev.completion_tokens},
                              {"cached", ev.cached_tokens},
                              {"d", ev.draft_tokens},
                              {"a", ev.accepted_draft_tokens}});
        }
        it = finished ? running_.erase(it) : std::next(it);
    }
    json kv = json::array();
    if (KvEventHub* hub = engine_->kv_events()) {
        KvEventHub::Batch b = hub->next(kv_seen_, std::chrono::milliseconds(0));
        kv_seen_ = b.last;
        for (auto& c : b.changes)
            if (c.reset || !c.stored.empty() || !c.removed.empty())
                kv.push_back({{"reset", c.reset}, {"stored", std::move(c.stored)}, {"removed", std::move(c.removed)}});
    }
    return json::to_msgpack(json{{"events", events},
                                 {"stats", stats_to_json(engine_->stats())},
                                 {"kv", kv},
                                 {"n", engine_->last_step_tokens()}});
}

// Rank 0: every rank's events to the callers' handles.
void DpRank::deliver(const std::vector<std::vector<uint8_t>>& reports) {
    FANOUT_CHECK(static_cast<int>(reports.size()) == world(), "{} reports for {} ranks", reports.size(), world());
    for (int r = 0; r < world(); ++r) {
        const json rep = decode(reports[r], fmt::format("step report of rank {}", r));
        std::vector<std::pair<std::shared_ptr<RequestHandle>, RequestEvent>> out;
        try {
            EngineStats s = stats_from_json(rep.at("stats"));
            const int64_t step_tokens = rep.at("n").get<int64_t>();
            std::lock_guard lock(mutex_);
            rank_stats_[r] = s;
            last_step_tokens_[static_cast<size_t>(r)] = step_tokens;
            for (const auto& c : rep.at("kv"))
                apply_kv_change_locked(r, c.at("reset").get<bool>(), c.at("stored").get<std::vector<uint64_t>>(),
                                       c.at("removed").get<std::vector<uint64_t>>());
            for (const auto& e : rep.at("events")) {
                const int64_t id = e.at("id").get<int64_t>();
                const auto it = proxies_.find(id);
                FANOUT_CHECK(it != proxies_.end() && it->second.rank == r,
                             "rank {} reported an event of request {}, which it does not run", r, id);
                RequestEvent ev;
                ev.text = e.at("text").get<std::string>();
                ev.tokens = e.at("tokens").get<std::vector<int32_t>>();
                ev.finished = e.at("finished").get<bool>();
                ev.finish_reason = e.at("reason").get<std::string>();
                ev.prompt_tokens = e.at("p").get<int64_t>();
                ev.completion_tokens = e.at("c").get<int64_t>();
                ev.cached_tokens = e.at("cached").get<int64_t>();
                ev.draft_tokens = e.at("d").get<int64_t>();
                ev.accepted_draft_tokens = e.at("a").get<int64_t>();
                out.emplace_back(it->second.handle, std::move(ev));
                if (out.back().second.finished) {
                    --load_requests_[r];
                    load_tokens_[r] -= it->second.tokens;
                    proxies_.erase(it);
                }
            }
        } catch (const std::exception& e) {
            // What was read before the fault still reaches its callers (their proxies are gone).
            for (auto& [h, ev] : out) h->push(std::move(ev));
            if (dynamic_cast<const json::exception*>(&e))
                FANOUT_FAIL("malformed step report from rank {}: {}", r, e.what());
            throw;
        }
        for (auto& [h, ev] : out) h->push(std::move(ev));  // outside the lock: push may call back into the server
    }
}

// Rank r's cache changed: its index, and the union's count of ranks per block (published when a
// block is first cached anywhere, or gone everywhere).
void DpRank::apply_kv_change_locked(int r, bool reset, const std::vector<uint64_t>& stored,
                                    const std::vector<uint64_t>& removed) {
    const Placer::Delta d = placer_.update(r, reset, stored, removed);
    std::vector<uint64_t> first, gone;
    for (uint64_t h : d.added)
        if (++union_count_[h] == 1) first.push_back(h);
    for (uint64_t h : d.removed) {
        const auto it = union_count_.find(h);
        if (it != union_count_.end() && --it->second == 0) {
            union_count_.erase(it);
            gone.push_back(h);
        }
    }
    if (!first.empty() || !gone.empty()) union_events_.publish(first, gone);
}

void DpRank::fail_all(const std::string& reason, const std::string& finish_reason) {
    std::vector<std::shared_ptr<RequestHandle>> handles;
    {
        std::lock_guard lock(mutex_);
        if (!reason.empty() && failure_.empty()) failure_ = reason;
        for (auto& p : pending_) handles.push_back(p.handle);
        for (auto& [id, p] : proxies_) handles.push_back(p.handle);
        pending_.clear();
        proxies_.clear();
        std::fill(load_requests_.begin(), load_requests_.end(), 0);
        std::fill(load_tokens_.begin(), load_tokens_.end(), 0);
    }
    for (auto& h : handles) {
        RequestEvent ev;
        ev.finished = true;
        ev.finish_reason = finish_reason;
        h->push(std::move(ev));
    }
}

void DpRank::run() {
    FANOUT_CHECK(engine_ != nullptr, "DP rank without an engine");
    try {
        for (;;) {
            std::vector<uint8_t> msg;
            if (rank() == 0) msg = next_step_message();
            msg = control_->broadcast(std::move(msg));
            bool stop = false;
            apply_step_message(msg, &stop);
            if (stop) break;
            engine_->step();  // an empty forward when this rank has nothing to run
            std::vector<std::vector<uint8_t>> reports = control_->gather(report());
            if (rank() == 0) deliver(reports);
        }
    } catch (const std::exception& e) {
        // Another rank's failure reaches this one as an error of the control plane or the EP
        // backend; the group's reason is the first failure's.
        std::string reason = control_->abort_reason();
        if (reason.empty()) {
            reason = fmt::format("DP rank {} of {} failed: {}", rank(), world(), e.what());
            control_->abort(reason);
        }
        fail_all(reason, "error");
        throw Error(reason);
    }
    fail_all("", "abort");  // stopped: what was still running ends now
}

DpThreadGroup::DpThreadGroup(std::vector<std::unique_ptr<Engine>> engines,
                             std::vector<std::unique_ptr<comm::LocalFabric>> fabrics,
                             std::vector<std::unique_ptr<comm::ExpertParallel>> endpoints,
                             std::chrono::milliseconds timeout)
    : fabrics_(std::move(fabrics)), endpoints_(std::move(endpoints)) {
    const int world = static_cast<int>(engines.size());
    FANOUT_CHECK(world >= 1, "DP group: no ranks");
    hub_ = std::make_unique<comm::LocalControlHub>(world, timeout, [this](const std::string& reason) {
        for (auto& f : fabrics_) f->abort(reason);
    });
    for (int r = 0; r < world; ++r)
        ranks_.push_back(std::make_unique<DpRank>(std::move(engines[r]), hub_->endpoint(r)));
}

DpThreadGroup::~DpThreadGroup() { stop(); }

void DpThreadGroup::start() {
    if (!threads_.empty()) return;
    for (auto& rank : ranks_)
        threads_.emplace_back([r = rank.get()] {
            try {
                r->run();
            } catch (const std::exception& e) {  // the group's failure: kept by the rank and the hub
                if (r->rank() == 0) std::fprintf(stderr, "%s\n", e.what());
            }
        });
}

void DpThreadGroup::stop() {
    lead().stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
}

std::string DpThreadGroup::failure() const { return hub_->abort_reason(); }

std::unique_ptr<DpThreadGroup> make_cpu_dp_threads(std::vector<std::unique_ptr<model::DeepseekV3>> models,
                                                   EngineConfig config, const model::ForwardOptions& opts, int threads,
                                                   DType kv_dtype, const io::Tokenizer* tokenizer, int tp) {
    const int ep = static_cast<int>(models.size());
    FANOUT_CHECK(ep >= 1, "DP group: no models");
    FANOUT_CHECK(tp >= 1 && ep % tp == 0, "DP group: --tp {} must divide the {} ranks", tp, ep);
    config.lockstep = true;
    std::vector<std::unique_ptr<comm::LocalFabric>> fabrics;
    std::vector<std::unique_ptr<comm::ExpertParallel>> endpoints;  // [fabric][rank], flattened
    if (ep > 1) {
        const int n = config.microbatch == EngineConfig::Microbatch::kOff ? 1 : 2;
        for (int f = 0; f < n; ++f) {
            fabrics.push_back(std::make_unique<comm::LocalFabric>(
                models[0]->ep_config(ParallelConfig{0, ep, 1}, config.scheduler.max_batched_tokens)));
            for (int r = 0; r < ep; ++r) endpoints.push_back(fabrics.back()->endpoint(r));
        }
    }
    std::vector<std::unique_ptr<Engine>> engines;
    for (int d = 0; d < ep / tp; ++d) {  // DP rank d: the TP group of ranks [d·tp, (d+1)·tp)
        std::vector<std::unique_ptr<model::DeepseekV3>> group;
        std::vector<model::ForwardOptions> group_opts;
        for (int r = d * tp; r < (d + 1) * tp; ++r) {
            model::ForwardOptions o = opts;
            o.ep = ep > 1 ? endpoints[r].get() : nullptr;
            o.microbatch_ep = fabrics.size() > 1 ? endpoints[ep + r].get() : nullptr;
            group.push_back(std::move(models[r]));
            group_opts.push_back(o);
        }
        auto runner = std::make_unique<DeepseekRunner>(std::move(group), std::move(group_opts), threads, kv_dtype);
        // A TP rank's failure stops the exchanges every rank may be waiting in (the group, which
        // owns the fabrics, outlives the engines).
        std::vector<comm::LocalFabric*> f;
        for (auto& fabric : fabrics) f.push_back(fabric.get());
        runner->on_failure([f](const std::string& reason) {
            for (comm::LocalFabric* x : f) x->abort(reason);
        });
        engines.push_back(std::make_unique<Engine>(std::move(runner), tokenizer, config));
    }
    return std::make_unique<DpThreadGroup>(std::move(engines), std::move(fabrics), std::move(endpoints));
}

}  // namespace fanout::engine
