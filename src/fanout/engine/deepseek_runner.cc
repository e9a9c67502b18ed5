// DeepseekRunner (engine.h): the CPU path's runner, one model or a TP group of them.
#include <memory>

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

DeepseekRunner::~DeepseekRunner() {
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
    if (abort_) abort_(reason);
}

void DeepseekRunner::follow(size_t i) {
    Member& m = *members_[i];
    int64_t seen = 0;
    for (;;) {
        std::function<void(Member&, kv::PagedKvCache&)> job;
        {
            std::unique_lock lock(mutex_);
            cv_.wait(lock, [&] { return stopping_ || jobs_ > seen; });
            if (stopping_) return;
            job = job_;
            seen = jobs_;
        }
        std::string error;
        try {
            job(m, *m.cache);
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

void DeepseekRunner::run_all(const std::function<void(Member&, kv::PagedKvCache&)>& job, kv::PagedKvCache& cache) {
    if (members_.size() == 1) return job(*members_[0], cache);
    int64_t target = 0;
    {
        std::lock_guard lock(mutex_);
        FANOUT_CHECK(failure_.empty(), "{}", failure_);
        for (size_t i = 1; i < members_.size(); ++i)
            if (!members_[i]->cache) members_[i]->cache = std::make_unique<kv::PagedKvCache>(cache.config());
        job_ = job;
        ++jobs_;
        target = jobs_ * static_cast<int64_t>(members_.size() - 1);
    }
    cv_.notify_all();
    try {
        job(*members_[0], cache);
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
}

// What a job reads of its caller's arguments: the caller's own for one member; a copy for a TP
// group, whose followers may still read it after rank 0 threw and returned.
template <typename T>
std::shared_ptr<const T> job_arg(const T& arg, size_t members) {
    return members > 1 ? std::make_shared<const T>(arg) : std::shared_ptr<const T>(&arg, [](const T*) {});
}

Tensor DeepseekRunner::forward(const model::StepBatch& step, kv::PagedKvCache& cache) {
    Tensor logits;
    Member* leader = members_[0].get();
    const auto b = job_arg(step, members_.size());
    run_all(
        [b, leader, &logits](Member& m, kv::PagedKvCache& c) {
            const model::StepBatch& batch = *b;
            model::DeepseekV3::Output out = m.model->forward(batch, c, m.opts, Stream{&m.pool});
            if (batch.all_hidden) m.hidden = std::move(out.hidden);
            if (&m == leader) logits = std::move(out.logits);
        },
        cache);
    return logits;
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
    std::vector<int32_t> drafts;
    Member* leader = members_[0].get();
    const auto b = job_arg(step, members_.size());
    const auto rows = std::make_shared<const std::vector<int32_t>>(hidden_rows.begin(), hidden_rows.end());
    run_all(
        [b, rows, chained, leader, &drafts](Member& m, kv::PagedKvCache& c) {
            const model::StepBatch& batch = *b;
            const Tensor& from = chained ? m.mtp_hidden : m.hidden;
            const int64_t D = m.model->config().hidden_size;
            Tensor prev = Tensor::zeros({0, D}, DType::kF32);
            if (!rows->empty()) {
                for (int32_t r : *rows)
                    FANOUT_CHECK(from.defined() && r >= 0 && r < from.dim(0), "draft_mtp: hidden row {} of {} kept", r,
                                 from.defined() ? from.dim(0) : 0);
                prev = from.gather_rows(*rows);
            }
            model::DeepseekV3::Output out = m.model->forward_mtp(batch, prev, c, m.opts, Stream{&m.pool});
            m.mtp_hidden = std::move(out.hidden);
            if (&m != leader) return;
            const int64_t V = m.model->config().vocab_size;
            for (int64_t r = 0; r < out.logits.dim(0); ++r)
                drafts.push_back(ops::argmax(out.logits.data_as<float>() + r * V, V));
        },
        cache);
    return drafts;
}

}  // namespace fanout::engine
