#include "fanout/rpc/engine_service.h"

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <system_error>
#include <thread>

#include "fanout/engine.grpc.pb.h"

namespace fanout::rpc {
namespace {

using grpc::CallbackServerContext;
using grpc::ServerWriteReactor;
using grpc::Status;
using grpc::StatusCode;

engine::RequestParams params_from(const GenerateRequest& r) {
    engine::RequestParams p;
    p.prompt.assign(r.prompt().begin(), r.prompt().end());
    p.max_tokens = r.max_tokens();
    const SamplingParams& s = r.sampling();
    p.sampling.temperature = s.temperature();
    p.sampling.top_k = s.top_k();
    p.sampling.top_p = s.top_p();
    p.sampling.seed = s.seed();
    for (const LogitBias& b : s.logit_bias()) p.sampling.logit_bias.emplace_back(b.token(), b.bias());
    p.stop.assign(r.stop().begin(), r.stop().end());
    p.ignore_eos = r.ignore_eos();
    p.skip_special_tokens = r.skip_special_tokens();
    return p;
}

GenerateRequest request_to(const engine::RequestParams& p, const std::string& id) {
    GenerateRequest r;
    r.set_request_id(id);
    for (int32_t t : p.prompt) r.add_prompt(t);
    r.set_max_tokens(p.max_tokens);
    SamplingParams* s = r.mutable_sampling();
    s->set_temperature(p.sampling.temperature);
    s->set_top_k(p.sampling.top_k);
    s->set_top_p(p.sampling.top_p);
    s->set_seed(p.sampling.seed);
    for (const auto& [token, bias] : p.sampling.logit_bias) {
        LogitBias* b = s->add_logit_bias();
        b->set_token(token);
        b->set_bias(bias);
    }
    for (const auto& stop : p.stop) r.add_stop(stop);
    r.set_ignore_eos(p.ignore_eos);
    r.set_skip_special_tokens(p.skip_special_tokens);
    return r;
}

void event_to(const engine::RequestEvent& ev, GenerateEvent* out) {
    out->Clear();
    out->set_text(ev.text);
    for (int32_t t : ev.tokens) out->add_tokens(t);
    out->set_finished(ev.finished);
    out->set_finish_reason(ev.finish_reason);
    Usage* u = out->mutable_usage();
    u->set_prompt_tokens(ev.prompt_tokens);
    u->set_completion_tokens(ev.completion_tokens);
    u->set_cached_tokens(ev.cached_tokens);
    u->set_draft_tokens(ev.draft_tokens);
    u->set_accepted_draft_tokens(ev.accepted_draft_tokens);
}

engine::RequestEvent event_from(const GenerateEvent& e) {
    engine::RequestEvent ev;
    ev.text = e.text();
    ev.tokens.assign(e.tokens().begin(), e.tokens().end());
    ev.finished = e.finished();
    ev.finish_reason = e.finish_reason();
    ev.prompt_tokens = e.usage().prompt_tokens();
    ev.completion_tokens = e.usage().completion_tokens();
    ev.cached_tokens = e.usage().cached_tokens();
    ev.draft_tokens = e.usage().draft_tokens();
    ev.accepted_draft_tokens = e.usage().accepted_draft_tokens();
    return ev;
}

// LoadReport's field for an EngineStats counter (the proto names them alike).
const google::protobuf::FieldDescriptor* report_field(const char* name) {
    const auto* f = LoadReport::descriptor()->FindFieldByName(name);
    FANOUT_CHECK(f != nullptr, "proto LoadReport has no field '{}' (EngineStats::kCounters)", name);
    return f;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server

struct EngineServer::Impl final : public Engine::CallbackService {
    engine::RequestService& engine;
    std::string model;
    std::unique_ptr<grpc::Server> server;
    std::mutex mutex;
    std::map<std::string, std::weak_ptr<engine::RequestHandle>> by_id;  // running requests that named an id
    std::atomic<int64_t> in_flight{0};
    std::atomic<bool> stopping{false};
    // KV-event subscriptions whose thread has not yet returned from its last gRPC call (Finish):
    // shutdown() waits for none, so no thread of the server is inside gRPC when the server, or the
    // process, goes (one was, and gRPC's exit-time teardown failed an assertion: CI, 2026-12-06).
    std::mutex kv_mutex;
    std::condition_variable kv_done;
    int kv_threads = 0;
    void kv_thread_left() {
        std::lock_guard lock(kv_mutex);
        --kv_threads;
        kv_done.notify_all();
    }

    Impl(engine::RequestService& e, std::string m) : engine(e), model(std::move(m)) {}

    // One Generate call: the request's events written as the engine produces them.
    class GenerateCall final : public ServerWriteReactor<GenerateEvent> {
      public:
        GenerateCall(Impl& svc, const GenerateRequest& req) : svc_(svc), id_(req.request_id()) {
            ++svc_.in_flight;
            // A request id names one running request (Abort finds it by the id): a second call
            // with the id of a running one is refused, not let to take the name over.
            if (!id_.empty()) {
                std::lock_guard lock(svc_.mutex);
                if (!svc_.by_id.emplace(id_, std::weak_ptr<engine::RequestHandle>()).second) {
                    Finish(Status(StatusCode::ALREADY_EXISTS,
                                  "request id '" + id_.substr(0, 200) + "' is already running here"));
                    return;
                }
                registered_ = true;
            }
            try {
                handle_ = svc_.engine.submit(params_from(req));
            } catch (const Error& e) {
                const bool stopped = std::string(e.what()).find("deployment") != std::string::npos;
                Finish(Status(stopped ? StatusCode::UNAVAILABLE : StatusCode::INVALID_ARGUMENT, e.what()));
                return;
            }
            if (registered_) {
                std::lock_guard lock(svc_.mutex);
                svc_.by_id[id_] = handle_;
            }
            // The engine notifies on its own thread; `gate_` keeps a late notification from
            // reaching a call that is gone.
            gate_ = std::make_shared<Gate>();
            gate_->call = this;
            handle_->on_event([gate = gate_] {
                std::lock_guard lock(gate->mutex);
                if (gate->call) gate->call->pump_locked();
            });
        }
        void OnWriteDone(bool ok) override {
            std::lock_guard lock(gate_->mutex);
            writing_ = false;
            if (!ok) {  // the client is gone: the engine ends the request
                handle_->cancel();
                finish_locked(Status(StatusCode::CANCELLED, "the client went away"));
                return;
            }
            if (last_written_) {
                finish_locked(Status::OK);
                return;
            }
            pump_locked();
        }
        void OnCancel() override {
            if (handle_) handle_->cancel();
        }
        void OnDone() override {
            if (gate_) {
                std::lock_guard lock(gate_->mutex);
                gate_->call = nullptr;
            }
            if (handle_) handle_->on_event(nullptr);
            if (registered_) {
                std::lock_guard lock(svc_.mutex);
                svc_.by_id.erase(id_);
            }
            --svc_.in_flight;
            delete this;
        }

      private:
        struct Gate {
            std::mutex mutex;
            GenerateCall* call = nullptr;
        };
        // Starts the next write when none is in flight and an event waits (gate_->mutex held).
        void pump_locked() {
            if (writing_ || finished_ || last_written_) return;
            engine::RequestEvent ev;
            if (!handle_->next(&ev, std::chrono::milliseconds(0))) return;
            event_to(ev, &out_);
            last_written_ = ev.finished;
            writing_ = true;
            StartWrite(&out_);
        }
        void finish_locked(const Status& s) {
            if (finished_) return;
            finished_ = true;
            Finish(s);
        }

        Impl& svc_;
        std::string id_;
        bool registered_ = false;  // id_ is this call's in by_id
        std::shared_ptr<engine::RequestHandle> handle_;
        std::shared_ptr<Gate> gate_;
        GenerateEvent out_;
        bool writing_ = false, last_written_ = false, finished_ = false;
    };

    ServerWriteReactor<GenerateEvent>* Generate(CallbackServerContext*, const GenerateRequest* req) override {
        return new GenerateCall(*this, *req);
    }

    grpc::ServerUnaryReactor* Abort(CallbackServerContext* ctx, const AbortRequest* req, AbortReply* reply) override {
        std::shared_ptr<engine::RequestHandle> h;
        {
            std::lock_guard lock(mutex);
            if (auto it = by_id.find(req->request_id()); it != by_id.end()) h = it->second.lock();
        }
        if (h) h->cancel();
        reply->set_found(h != nullptr);
        auto* r = ctx->DefaultReactor();
        r->Finish(Status::OK);
        return r;
    }

    grpc::ServerUnaryReactor* Health(CallbackServerContext* ctx, const HealthRequest*, HealthReply* reply) override {
        reply->set_ok(!stopping);
        reply->set_model(model);
        reply->set_max_context(engine.max_context());
        reply->set_vocab_size(engine.vocab_size());
        reply->set_kv_block_size(engine.kv_block_size());
        auto* r = ctx->DefaultReactor();
        r->Finish(Status::OK);
        return r;
    }

    grpc::ServerUnaryReactor* Load(CallbackServerContext* ctx, const LoadRequest*, LoadReport* reply) override {
        const engine::EngineStats s = engine.stats();
        for (const auto& [name, field] : engine::EngineStats::kCounters)
            reply->GetReflection()->SetInt64(reply, report_field(name), s.*field);
        reply->set_in_flight(in_flight);
        auto* r = ctx->DefaultReactor();
        r->Finish(Status::OK);
        return r;
    }

    // A KvEvents subscription: a thread waits on the engine's hub and writes what changed.
    class KvEventsCall final : public ServerWriteReactor<KvEvent> {
      public:
        KvEventsCall(Impl& svc, engine::KvEventHub* hub) : state_(std::make_shared<State>()) {
            if (hub == nullptr) {
                Finish(Status(StatusCode::UNIMPLEMENTED, "this engine publishes no KV events"));
                return;
            }
            {
                std::lock_guard lock(svc.kv_mutex);
                ++svc.kv_threads;
            }
            try {
                start_thread(svc, hub);
            } catch (const std::system_error& e) {  // no thread to be had: the subscription is refused
                svc.kv_thread_left();
                Finish(Status(StatusCode::UNAVAILABLE, std::string("no thread for KV events: ") + e.what()));
            }
        }
        void OnWriteDone(bool ok) override {
            std::lock_guard lock(state_->mutex);
            state_->writing = false;
            state_->ok = ok;
            state_->cv.notify_all();
        }
        void OnCancel() override { state_->cancelled = true; }
        void OnDone() override { delete this; }

      private:
        // The subscription's thread: writes what changed until the call is cancelled or the server
        // stops, then ends the call and leaves the server's count.
        void start_thread(Impl& svc, engine::KvEventHub* hub) {
            std::thread([this, hub, st = state_, &svc] {
                uint64_t last = 0;
                while (!st->cancelled && !svc.stopping) {
                    const engine::KvEventHub::Batch b = hub->next(last, std::chrono::milliseconds(200));
                    last = b.last;
                    for (const auto& c : b.changes) {
                        KvEvent ev;
                        ev.set_reset(c.reset);
                        for (uint64_t h : c.stored) ev.add_stored(h);
                        for (uint64_t h : c.removed) ev.add_removed(h);
                        std::unique_lock lock(st->mutex);
                        st->writing = true;
                        StartWrite(&ev);
                        st->cv.wait(lock, [&] { return !st->writing; });
                        if (!st->ok) st->cancelled = true;
                        if (st->cancelled) break;
                    }
                }
                Finish(Status::OK);  // the last touch of the call: OnDone deletes it
                svc.kv_thread_left();
            }).detach();
        }

        struct State {
            std::mutex mutex;
            std::condition_variable cv;
            bool writing = false, ok = true;
            std::atomic<bool> cancelled{false};
        };
        std::shared_ptr<State> state_;
    };

    ServerWriteReactor<KvEvent>* KvEvents(CallbackServerContext*, const KvEventsRequest*) override {
        return new KvEventsCall(*this, engine.kv_events());
    }
};

EngineServer::EngineServer(engine::RequestService& engine, std::string model_name, const std::string& address)
    : impl_(std::make_unique<Impl>(engine, std::move(model_name))) {
    grpc::ServerBuilder b;
    b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(impl_.get());
    b.SetMaxReceiveMessageSize(64 << 20);
    impl_->server = b.BuildAndStart();
    FANOUT_CHECK(impl_->server != nullptr && port_ > 0, "engine service: cannot listen on {}", address);
}

EngineServer::~EngineServer() { shutdown(); }

void EngineServer::shutdown(std::chrono::milliseconds grace) {
    if (!impl_->server) return;
    impl_->stopping = true;
    impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
    impl_->server->Wait();
    {
        std::unique_lock lock(impl_->kv_mutex);
        impl_->kv_done.wait(lock, [&] { return impl_->kv_threads == 0; });
    }
    impl_->server.reset();
}

// ---------------------------------------------------------------------------------------------
// Client

// The Generate calls of one client still running: what close() ends. Shared with the calls, so
// a call's end (OnDone, after it has deleted itself) still has it while close() returns and its
// RemoteEngine goes.
struct LiveCalls {
    std::mutex mutex;
    std::condition_variable done;
    std::map<const void*, std::weak_ptr<engine::RequestHandle>> handles;
    std::atomic<int64_t> count{0};  // calls not yet ended (close() waits for none)
    // Calls whose request has not yet ended: the last event drops it before the caller sees it,
    // while the call itself ends when its status arrives after that. Placement reads this, so a
    // request sent the moment the previous one's answer is complete does not see it as load.
    std::atomic<int64_t> requests{0};
    bool closed = false;  // RemoteEngine::close: a call started from now on is cancelled at once
};

struct RemoteEngine::Impl {
    std::shared_ptr<LiveCalls> calls = std::make_shared<LiveCalls>();
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<Engine::Stub> stub;
    mutable std::mutex mutex;
    engine::EngineStats last_load;
    // KV events
    std::unique_ptr<grpc::ClientContext> kv_ctx;
    std::thread kv_thread;
};

namespace {

// One Generate call on the client: events into the handle; the end without a last event is
// "unavailable".
class GenerateStream final : public grpc::ClientReadReactor<GenerateEvent> {
  public:
    GenerateStream(Engine::Stub* stub, GenerateRequest req, std::shared_ptr<engine::RequestHandle> handle,
                   std::shared_ptr<LiveCalls> calls)
        : req_(std::move(req)), handle_(std::move(handle)), calls_(std::move(calls)) {
        bool closed = false;
        {
            std::lock_guard lock(calls_->mutex);
            calls_->handles.emplace(this, handle_);
            ++calls_->count;
            ++calls_->requests;
            closed = calls_->closed;
        }
        stub->async()->Generate(&ctx_, &req_, this);
        handle_->on_cancel([this_ctx = &ctx_, alive = alive_] {
            std::lock_guard lock(alive->mutex);
            if (alive->yes) this_ctx->TryCancel();
        });
        StartRead(&ev_);
        const std::shared_ptr<engine::RequestHandle> caller = handle_;  // the call may end (and go) at once
        StartCall();
        if (closed) caller->cancel();  // its client is closing: it ends "abort"
    }
    void OnReadDone(bool ok) override {
        if (!ok) return;  // the stream ended: OnDone has the status
        engine::RequestEvent ev = event_from(ev_);
        got_last_ = ev.finished;
        if (got_last_) --calls_->requests;  // before the caller can see the end
        handle_->push(std::move(ev));
        if (!got_last_) StartRead(&ev_);
    }
    void OnDone(const grpc::Status& s) override {
        {
            std::lock_guard lock(alive_->mutex);
            alive_->yes = false;
        }
        if (!got_last_) {
            engine::RequestEvent ev;
            ev.finished = true;
            // A request the engine refused (bad, or its id already running there) is the caller's
            // error; anything else (the engine died, the network failed, the call was cancelled)
            // leaves the request without its end.
            const bool refused = s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                                 s.error_code() == grpc::StatusCode::ALREADY_EXISTS;
            ev.finish_reason = refused ? "error" : handle_->cancelled() ? "abort" : "unavailable";
            --calls_->requests;
            handle_->push(std::move(ev));
        }
        // The call goes (its ClientContext, which holds a reference to the channel) before its
        // client can see it ended: close() returning leaves no gRPC object of this client behind.
        // Were the context the channel's last owner, the channel would go here, on the gRPC thread
        // that polls the callback queue the channel releases, and that thread would go on polling
        // a freed queue (a CI abort; a core of it, 2026-12-06). Its key leaves `handles` first: a
        // call made once it is deleted may get its address.
        const std::shared_ptr<LiveCalls> calls = std::move(calls_);
        {
            std::lock_guard lock(calls->mutex);
            calls->handles.erase(this);
        }
        delete this;
        {
            std::lock_guard lock(calls->mutex);
            --calls->count;
        }
        calls->done.notify_all();
    }

  private:
    struct Alive {
        std::mutex mutex;
        bool yes = true;
    };
    grpc::ClientContext ctx_;
    GenerateRequest req_;
    GenerateEvent ev_;
    std::shared_ptr<engine::RequestHandle> handle_;
    std::shared_ptr<LiveCalls> calls_;
    std::shared_ptr<Alive> alive_ = std::make_shared<Alive>();
    bool got_last_ = false;
};

}  // namespace

namespace {
// A prefix no other client's ids share: two routers (or restarts of one) in front of one engine
// each count their requests from 1, and the engine refuses a running request's id.
std::string client_nonce() {
    std::random_device rd;
    const uint64_t n = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(n));
    return buf;
}
}  // namespace

RemoteEngine::RemoteEngine(const std::string& address)
    : impl_(std::make_unique<Impl>()), address_(address), id_prefix_(address + "#" + client_nonce() + "-") {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    impl_->channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    impl_->stub = Engine::NewStub(impl_->channel);
}

RemoteEngine::~RemoteEngine() {
    stop_kv_events();
    close();
}

void RemoteEngine::cancel_calls() {
    std::vector<std::shared_ptr<engine::RequestHandle>> running;
    {
        std::lock_guard lock(impl_->calls->mutex);
        impl_->calls->closed = true;
        for (const auto& [call, h] : impl_->calls->handles)
            if (auto p = h.lock()) running.push_back(std::move(p));
    }
    for (const auto& h : running) h->cancel();  // its call ends "abort" (not re-placed)
}

bool RemoteEngine::close(std::optional<std::chrono::milliseconds> wait) {
    cancel_calls();
    std::unique_lock lock(impl_->calls->mutex);
    auto ended = [&] { return impl_->calls->count.load() == 0; };
    if (wait) return impl_->calls->done.wait_for(lock, *wait, ended);
    impl_->calls->done.wait(lock, ended);
    return true;
}

int64_t RemoteEngine::in_flight() const { return impl_->calls->requests.load(); }

namespace {
// One unary call within `timeout`: the reply, or an Error naming the engine and `what`.
template <typename Reply, typename Request, typename Method>
Reply unary(Engine::Stub& stub, Method method, const Request& req, std::chrono::milliseconds timeout,
            const std::string& address, const char* what) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    Reply reply;
    const grpc::Status s = (stub.*method)(&ctx, req, &reply);
    FANOUT_CHECK(s.ok(), "engine {}: {} failed: {}", address, what, s.error_message());
    return reply;
}
}  // namespace

EngineInfo RemoteEngine::health(std::chrono::milliseconds timeout) {
    const HealthReply reply =
        unary<HealthReply>(*impl_->stub, &Engine::Stub::Health, HealthRequest{}, timeout, address_, "health check");
    FANOUT_CHECK(reply.ok(), "engine {}: not healthy (stopping)", address_);
    return {reply.model(), reply.max_context(), reply.vocab_size(), reply.kv_block_size()};
}

engine::EngineStats RemoteEngine::load(std::chrono::milliseconds timeout) {
    const LoadReport r =
        unary<LoadReport>(*impl_->stub, &Engine::Stub::Load, LoadRequest{}, timeout, address_, "load report");
    engine::EngineStats l;
    for (const auto& [name, field] : engine::EngineStats::kCounters)
        l.*field = r.GetReflection()->GetInt64(r, report_field(name));
    std::lock_guard lock(impl_->mutex);
    impl_->last_load = l;
    return l;
}

bool RemoteEngine::abort(const std::string& request_id, std::chrono::milliseconds timeout) {
    AbortRequest req;
    req.set_request_id(request_id);
    return unary<AbortReply>(*impl_->stub, &Engine::Stub::Abort, req, timeout, address_, "abort").found();
}

std::shared_ptr<engine::RequestHandle> RemoteEngine::submit(engine::RequestParams params) {
    const EngineInfo info = this->info();
    FANOUT_CHECK(info.vocab_size > 0, "engine {}: submit before its health was known", address_);
    engine::validate_request(params, info.max_context, info.vocab_size, true);
    const int64_t id = next_id_++;
    auto handle = std::make_shared<engine::RequestHandle>(id);
    new GenerateStream(impl_->stub.get(), request_to(params, id_prefix_ + std::to_string(id)), handle, impl_->calls);
    return handle;
}

engine::EngineStats RemoteEngine::stats() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->last_load;
}

void RemoteEngine::watch_kv_events(
    std::function<void(bool, const std::vector<uint64_t>&, const std::vector<uint64_t>&)> on_change,
    std::function<void(const std::string&)> on_end) {
    stop_kv_events();
    impl_->kv_ctx = std::make_unique<grpc::ClientContext>();
    impl_->kv_thread =
        std::thread([this, ctx = impl_->kv_ctx.get(), on_change = std::move(on_change), on_end = std::move(on_end)] {
            KvEventsRequest req;
            auto reader = impl_->stub->KvEvents(ctx, req);
            KvEvent ev;
            while (reader->Read(&ev)) {
                const std::vector<uint64_t> stored(ev.stored().begin(), ev.stored().end());
                const std::vector<uint64_t> removed(ev.removed().begin(), ev.removed().end());
                on_change(ev.reset(), stored, removed);
            }
            const grpc::Status s = reader->Finish();
            if (on_end) on_end(s.ok() ? std::string("the engine ended the stream") : s.error_message());
        });
}

void RemoteEngine::stop_kv_events() {
    if (impl_->kv_ctx) impl_->kv_ctx->TryCancel();
    if (impl_->kv_thread.joinable()) impl_->kv_thread.join();
    impl_->kv_ctx.reset();
}

}  // namespace fanout::rpc
