// DeepseekRunner (engine.h): the CPU path's runner, one model or a TP group of them — its ranks
// past 0 as threads of this process or as processes of their own (run_tp_follower).
#include <cstring>
#include <memory>

#include "fanout/comm/control_plane.h"
#include "fanout/engine/engine.h"

namespace fanout::engine {

struct DeepseekRunner::Member {
    Member(std::unique_ptr<model::DeepseekV3> m, model::ForwardOptions o, int threads)
        : model(std::move(m)), opts(o), pool(threads) {}
    std::unique_ptr<model::DeepseekV3> model;
    model::ForwardOptions opts;
    ThreadPool pool;
    std::unique_ptr<comm::TensorParallel> tp;
    std::unique_ptr<kv::PagedKvCache> cache;  // TP ranks past 0: their copy of the latent KV
    Tensor hidden, mtp_hidden;                // the last all_hidden forward's rows, the last MTP pass's logit rows
};

// One step of the TP group: what every rank runs, as the followers receive it.
struct DeepseekRunner::Job {
    enum class Kind : int32_t { kForward = 0, kDraft = 1, kStop = 2 };
    Kind kind = Kind::kForward;
    model::StepBatch batch;
    std::vector<int32_t> hidden_rows;  // kDraft: the rows of the kept hidden states each token reads
    bool chained = false;              // kDraft: from the last MTP pass's rows
    int64_t num_blocks = 0;            // the leader's cache: every rank's has this geometry
    int64_t absorbed_max_query = 0;    // the leader's ForwardOptions::absorbed_max_query: every rank's form
};

namespace {

// A Job as bytes (processes): a magic word, the scalars, then each int32 array as its length and
// values. parse_job checks every length against what remains: a truncated or foreign message is an
// error naming what is wrong, never a read past the end.
constexpr uint32_t kJobMagic = 0x4a505446;  // "FTPJ"

void put(std::vector<uint8_t>& out, const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
}
void put_i64(std::vector<uint8_t>& out, int64_t v) { put(out, &v, sizeof(v)); }
void put_array(std::vector<uint8_t>& out, const std::vector<int32_t>& a) {
    put_i64(out, static_cast<int64_t>(a.size()));
    put(out, a.data(), a.size() * sizeof(int32_t));
}

struct Reader {
    const std::vector<uint8_t>& in;
    size_t at = 0;
    void get(void* p, size_t n, const char* what) {
        FANOUT_CHECK(n <= in.size() - at, "TP step message: truncated at {} ({} bytes of {})", what, at, in.size());
        std::memcpy(p, in.data() + at, n);
        at += n;
    }
    int64_t i64(const char* what) {
        int64_t v = 0;
        get(&v, sizeof(v), what);
        return v;
    }
    std::vector<int32_t> array(const char* what) {
        const int64_t n = i64(what);
        FANOUT_CHECK(n >= 0 && static_cast<uint64_t>(n) <= (in.size() - at) / sizeof(int32_t),
                     "TP step message: {} claims {} values, {} bytes remain", what, n, in.size() - at);
        std::vector<int32_t> a(static_cast<size_t>(n));
        get(a.data(), a.size() * sizeof(int32_t), what);
        return a;
    }
};

}  // namespace

std::vector<uint8_t> DeepseekRunner::encode(const Job& j) {
    std::vector<uint8_t> out;
    put(out, &kJobMagic, sizeof(kJobMagic));
    put_i64(out, static_cast<int64_t>(j.kind));
    const model::StepBatch& b = j.batch;
    put_i64(out, (j.chained ? 1 : 0) | (b.all_hidden ? 2 : 0) | (b.microbatch ? 4 : 0));
    put_i64(out, b.max_blocks);
    put_i64(out, j.num_blocks);
    put_i64(out, j.absorbed_max_query);
    for (const auto* a :
         {&b.tokens, &b.positions, &b.slots, &b.query_start, &b.kv_len, &b.block_table, &b.logit_rows, &j.hidden_rows})
        put_array(out, *a);
    return out;
}

DeepseekRunner::Job DeepseekRunner::parse(const std::vector<uint8_t>& in) {
    Reader r{in};
    uint32_t magic = 0;
    r.get(&magic, sizeof(magic), "the magic word");
    FANOUT_CHECK(magic == kJobMagic, "TP step message: magic {:#x}, expected {:#x}", magic, kJobMagic);
    Job j;
    const int64_t kind = r.i64("kind");
    FANOUT_CHECK(kind >= 0 && kind <= 2, "TP step message: kind {}", kind);
    j.kind = static_cast<Job::Kind>(kind);
    const int64_t flags = r.i64("flags");
    j.chained = flags & 1;
    j.batch.all_hidden = flags & 2;
    j.batch.microbatch = flags & 4;
    j.batch.max_blocks = r.i64("max_blocks");
    j.num_blocks = r.i64("num_blocks");
    j.absorbed_max_query = r.i64("absorbed_max_query");
    model::StepBatch& b = j.batch;
    b.tokens = r.array("tokens");
    b.positions = r.array("positions");
    b.slots = r.array("slots");
    b.query_start = r.array("query_start");
    b.kv_len = r.array("kv_len");
    b.block_table = r.array("block_table");
    b.logit_rows = r.array("logit_rows");
    j.hidden_rows = r.array("hidden_rows");
    FANOUT_CHECK(r.at == in.size(), "TP step message: {} bytes past its end", in.size() - r.at);
    return j;
}

DeepseekRunner::Result DeepseekRunner::run_job(Member& m, const Job& job, kv::PagedKvCache& c, bool lead) {
    Result out;
    const model::StepBatch& batch = job.batch;
    if (job.kind == Job::Kind::kForward) {
        model::DeepseekV3::Output o = m.model->forward(batch, c, m.opts, Stream{&m.pool});
        if (batch.all_hidden) m.hidden = std::move(o.hidden);
        if (lead) out.logits = std::move(o.logits);
        return out;
    }
    const Tensor& from = job.chained ? m.mtp_hidden : m.hidden;
    const int64_t D = m.model->config().hidden_size;
    Tensor prev = Tensor::zeros({0, D}, DType::kF32);
    if (!job.hidden_rows.empty()) {
        for (int32_t r : job.hidden_rows)
            FANOUT_CHECK(from.defined() && r >= 0 && r < from.dim(0), "draft_mtp: hidden row {} of {} kept", r,
                         from.defined() ? from.dim(0) : 0);
        prev = from.gather_rows(job.hidden_rows);
    }
    model::DeepseekV3::Output o = m.model->forward_mtp(batch, prev, c, m.opts, Stream{&m.pool});
    m.mtp_hidden = std::move(o.hidden);
    if (!lead) return out;
    const int64_t V = m.model->config().vocab_size;
    for (int64_t r = 0; r < o.logits.dim(0); ++r)
        out.drafts.push_back(ops::argmax(o.logits.data_as<float>() + r * V, V));
    return out;
}

DeepseekRunner::DeepseekRunner(std::unique_ptr<model::DeepseekV3> model, model::ForwardOptions opts, int threads,
                               DType kv_dtype)
    : kv_dtype_(kv_dtype) {
    members_.push_back(std::make_unique<Member>(std::move(model), opts, threads));
}

DeepseekRunner::DeepseekRunner(std::vector<std::unique_ptr<model::DeepseekV3>> models,
                               std::vector<model::ForwardOptions> opts, int threads, DType kv_dtype)
    : kv_dtype_(kv_dtype) {
    const int tp = static_cast<int>(models.size());
    FANOUT_CHECK(tp >= 1 && opts.size() == models.size(), "TP group: {} models, {} option sets", models.size(),
                 opts.size());
    for (int i = 0; i < tp; ++i) {
        const ParallelConfig& p = models[i]->weights().parallel;
        FANOUT_CHECK(
            p.tp == tp && p.tp_rank() == i,
            "TP group of {}: model {} holds the heads of TP rank {} of {} (load rank r with ParallelConfig{{r, "
            "ep, {}}})",
            tp, i, p.tp_rank(), p.tp, tp);
        members_.push_back(std::make_unique<Member>(std::move(models[i]), opts[i], threads));
    }
    if (tp > 1) {
        tp_ = std::make_unique<comm::LocalTpGroup>(tp);
        for (int i = 0; i < tp; ++i) {
            members_[i]->tp = tp_->endpoint(i);
            members_[i]->opts.tp = members_[i]->tp.get();
        }
        for (size_t i = 1; i < members_.size(); ++i) followers_.emplace_back([this, i] { follow(i); });
    }
}

DeepseekRunner::DeepseekRunner(std::unique_ptr<model::DeepseekV3> model, model::ForwardOptions opts, int threads,
                               DType kv_dtype, std::unique_ptr<comm::TensorParallel> tp,
                               std::unique_ptr<comm::ControlPlane> followers)
    : remote_(std::move(followers)), kv_dtype_(kv_dtype) {
    FANOUT_CHECK(tp != nullptr && remote_ != nullptr && tp->rank() == 0 && remote_->rank() == 0 &&
                     tp->size() == remote_->world(),
                 "TP group as processes: this runner is TP rank 0 with an endpoint and a channel of the same group");
    const ParallelConfig& p = model->weights().parallel;
    FANOUT_CHECK(p.tp == tp->size() && p.tp_rank() == 0,
                 "TP group of {} as processes: the model holds the heads of TP rank {} of {}", tp->size(), p.tp_rank(),
                 p.tp);
    members_.push_back(std::make_unique<Member>(std::move(model), opts, threads));
    members_[0]->tp = std::move(tp);
    members_[0]->opts.tp = members_[0]->tp.get();
}

DeepseekRunner::~DeepseekRunner() {
    if (remote_ && failure_.empty()) {
        Job stop;
        stop.kind = Job::Kind::kStop;
        try {
            remote_->broadcast(encode(stop));  // the followers return from run_tp_follower
        } catch (const std::exception&) {      // the group is failing already: its abort ends the job
        }
    }
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (tp_) tp_->abort("the runner is stopping");
    for (auto& t : followers_) t.join();
}

const model::DeepseekV3& DeepseekRunner::lead() const { return *members_[0]->model; }

kv::KvCacheConfig DeepseekRunner::kv_cache_config(int64_t num_blocks) const {
    return lead().kv_cache_config(num_blocks, kv_dtype_);
}

void DeepseekRunner::fail(const std::string& reason) {
    if (tp_) tp_->abort(reason);
    if (remote_) remote_->abort(reason);  // MPI: ends the job (the followers may wait in a collective)
    if (abort_) abort_(reason);
}

void DeepseekRunner::follow(size_t i) {
    Member& m = *members_[i];
    int64_t seen = 0;
    for (;;) {
        std::shared_ptr<const Job> job;
        {
            std::unique_lock lock(mutex_);
            cv_.wait(lock, [&] { return stopping_ || jobs_ > seen; });
            if (stopping_) return;
            job = job_;
            seen = jobs_;
        }
        std::string error;
        try {
            run_job(m, *job, *m.cache, false);
        } catch (const std::exception& e) {
            error = fmt::format("TP rank {} of {} failed: {}", i, members_.size(), e.what());
            fail(error);
        }
        {
            std::lock_guard lock(mutex_);
            if (!error.empty() && failure_.empty()) failure_ = error;
            ++done_;
        }
        cv_.notify_all();
    }
}

DeepseekRunner::Result DeepseekRunner::run_all(Job job, kv::PagedKvCache& cache) {
    if (remote_) {
        // The followers are processes: the step travels to them, every rank runs it, then a gather
        // closes it (the control plane's broadcast-then-gather rhythm).
        job.num_blocks = cache.config().num_blocks;
        job.absorbed_max_query = members_[0]->opts.absorbed_max_query;
        FANOUT_CHECK(failure_.empty(), "{}", failure_);
        remote_->broadcast(encode(job));
        Result out;
        try {
            out = run_job(*members_[0], job, cache, true);
        } catch (const std::exception& e) {
            failure_ = fmt::format("TP rank 0 of {} failed: {}", remote_->world(), e.what());
            fail(failure_);
            throw Error(failure_);
        }
        remote_->gather({});
        return out;
    }
    if (members_.size() == 1) return run_job(*members_[0], job, cache, true);
    // Threads: the followers read one shared copy, which outlives this call if rank 0 throws.
    const auto shared = std::make_shared<const Job>(std::move(job));
    int64_t target = 0;
    {
        std::lock_guard lock(mutex_);
        FANOUT_CHECK(failure_.empty(), "{}", failure_);
        for (size_t i = 1; i < members_.size(); ++i)
            if (!members_[i]->cache) members_[i]->cache = std::make_unique<kv::PagedKvCache>(cache.config());
        job_ = shared;
        ++jobs_;
        target = jobs_ * static_cast<int64_t>(members_.size() - 1);
    }
    cv_.notify_all();
    Result out;
    try {
        out = run_job(*members_[0], *shared, cache, true);
    } catch (const std::exception& e) {
        // Not waiting for the others: they may be in an exchange that only the group's failure ends.
        const std::string error = fmt::format("TP rank 0 of {} failed: {}", members_.size(), e.what());
        fail(error);
        std::lock_guard lock(mutex_);
        if (failure_.empty()) failure_ = error;
        throw Error(failure_);
    }
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_ >= target; });
    FANOUT_CHECK(failure_.empty(), "{}", failure_);
    return out;
}

Tensor DeepseekRunner::forward(const model::StepBatch& step, kv::PagedKvCache& cache) {
    last_mha_requests_ = model::runs_absorbed(step, members_[0]->opts) ? 0 : step.num_requests();
    Job job;
    job.batch = step;
    return run_all(std::move(job), cache).logits;
}

std::string DeepseekRunner::microbatch_support() const {
    for (const auto& m : members_)
        if (m->opts.ep != nullptr && m->opts.microbatch_ep == nullptr)
            return "this rank has no second EP group for the second microbatch";
    return "";
}

std::string DeepseekRunner::enable_mtp(int draft_tokens) {
    if (!lead().weights().mtp) return "this model has no MTP layer (num_nextn_predict_layers = 0)";
    for (auto& m : members_)
        m->opts.absorbed_max_query = std::max<int64_t>(m->opts.absorbed_max_query, 1 + draft_tokens);
    return "";
}

std::vector<int32_t> DeepseekRunner::draft_mtp(const model::StepBatch& step, std::span<const int32_t> hidden_rows,
                                               bool chained, kv::PagedKvCache& cache) {
    FANOUT_CHECK(static_cast<int64_t>(hidden_rows.size()) == step.num_tokens(),
                 "draft_mtp: {} hidden rows for {} tokens", hidden_rows.size(), step.num_tokens());
    Job job;
    job.kind = Job::Kind::kDraft;
    job.batch = step;
    job.hidden_rows.assign(hidden_rows.begin(), hidden_rows.end());
    job.chained = chained;
    return run_all(std::move(job), cache).drafts;
}

void run_tp_follower(std::unique_ptr<model::DeepseekV3> model, model::ForwardOptions opts, int threads, DType kv_dtype,
                     std::unique_ptr<comm::TensorParallel> tp, comm::ControlPlane& leader) {
    FANOUT_CHECK(tp != nullptr && tp->rank() > 0 && leader.rank() == tp->rank(),
                 "a TP follower is a TP rank past 0 of its group (endpoint and channel of the same group)");
    const int rank = tp->rank(), size = tp->size();
    DeepseekRunner::Member m(std::move(model), opts, threads);
    m.tp = std::move(tp);
    m.opts.tp = m.tp.get();
    for (;;) {
        DeepseekRunner::Job job;
        try {
            job = DeepseekRunner::parse(leader.broadcast({}));
            if (job.kind == DeepseekRunner::Job::Kind::kStop) return;
            if (!m.cache) {
                FANOUT_CHECK(job.num_blocks >= 1, "TP step message: a cache of {} blocks", job.num_blocks);
                m.cache = std::make_unique<kv::PagedKvCache>(m.model->kv_cache_config(job.num_blocks, kv_dtype));
            }
            FANOUT_CHECK(job.num_blocks == m.cache->config().num_blocks,
                         "TP step message: the leader's cache has {} blocks, this rank's {}", job.num_blocks,
                         m.cache->config().num_blocks);
            m.opts.absorbed_max_query = job.absorbed_max_query;  // the leader's attention forms (MTP raises it)
            DeepseekRunner::run_job(m, job, *m.cache, false);
        } catch (const std::exception& e) {
            leader.abort(fmt::format("TP rank {} of {} failed: {}", rank, size, e.what()));
            throw;
        }
        leader.gather({});
    }
}

}  // namespace fanout::engine
