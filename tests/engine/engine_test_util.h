// Shared by the engine tests (host and GPU runners): reading a request's events to the end,
// running a list of requests through a fresh engine, and a tiny random model on disk.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fanout/engine/engine.h"
#include "fanout/model/synthetic.h"
#include "test_util.h"

namespace fanout::engine::testing {

// The request's tokens until its last event (`reason` / `last`: that event's finish reason and
// the event itself); a test failure when it does not finish within `timeout` per event.
inline std::vector<int32_t> drain(RequestHandle& h, std::string* reason = nullptr, RequestEvent* last = nullptr,
                                  std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::vector<int32_t> toks;
    RequestEvent ev;
    while (h.next(&ev, timeout)) {
        toks.insert(toks.end(), ev.tokens.begin(), ev.tokens.end());
        if (ev.finished) {
            if (reason) *reason = ev.finish_reason;
            if (last) *last = ev;
            return toks;
        }
    }
    ADD_FAILURE() << "request did not finish";
    return toks;
}

// Every request of `params` submitted before the engine starts (so the schedule is the same every
// run), then each one's tokens.
inline std::vector<std::vector<int32_t>> run_engine(std::unique_ptr<ModelRunner> runner, const EngineConfig& cfg,
                                                    const std::vector<RequestParams>& params) {
    Engine engine(std::move(runner), nullptr, cfg);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const auto& p : params) handles.push_back(engine.submit(p));
    engine.start();
    std::vector<std::vector<int32_t>> out;
    for (auto& h : handles) out.push_back(drain(*h));
    engine.stop();
    return out;
}

// The tiny preset at 2 layers (+ MTP) with `vocab` tokens, random weights, in a fresh temp folder
// named after `name`; the caller removes it.
inline std::string write_tiny_model(const std::string& name, int64_t vocab) {
    const std::string dir = fanout::testing::temp_dir(name);
    io::ModelConfig c = model::preset_config("tiny", 2);
    c.vocab_size = vocab;
    model::write_synthetic_model(dir, c, {});
    return dir;
}

}  // namespace fanout::engine::testing
