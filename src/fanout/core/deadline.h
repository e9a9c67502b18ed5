// Time left until a deadline on the steady clock, never negative: for handing the rest of one
// overall budget (a drain, a shutdown) to several waits in turn.
#pragma once

#include <algorithm>
#include <chrono>

namespace fanout {

inline std::chrono::milliseconds time_left(std::chrono::steady_clock::time_point deadline) {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
}

}  // namespace fanout
