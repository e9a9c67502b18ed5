// Prometheus text exposition of the engine's counters and the HTTP front end's own.
//
// Label values are escaped as the exposition format requires (backslash, double quote, newline),
// so a served model name can never add lines of its own to /metrics.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fanout/engine/engine.h"

namespace fanout::serve {

// A label value as written between the quotes: \ → \\, " → \", newline → \n.
std::string prometheus_label_value(std::string_view v);

struct HttpStats {
    int64_t requests = 0, errors = 0, in_flight = 0, open_connections = 0;
};

// Start-up phases and their seconds (plan, load, device, ...), shown as fanout_startup_seconds.
using StartupTimes = std::vector<std::pair<std::string, double>>;

// `ranks`: each data-parallel rank's counters (empty for one engine), shown per rank label too.
std::string render_metrics(const std::string& model_name, const engine::EngineStats& s, const HttpStats& http,
                           const StartupTimes& startup = {}, const std::vector<engine::EngineStats>& ranks = {});

}  // namespace fanout::serve
