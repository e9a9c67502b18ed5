// Helpers for validating JSON inputs (safetensors headers, config.json).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fanout::io {

// A short description of a JSON value for an error message: scalars as written, arrays and
// objects by kind and size. Never recurses, so a value nested 100k deep cannot overflow the stack.
inline std::string describe_json(const nlohmann::json& v) {
    // Values of a few nodes are shown as written; walking them is bounded by the node count.
    constexpr size_t kMaxNodes = 32;
    std::vector<const nlohmann::json*> stack = {&v};
    size_t nodes = 0;
    while (!stack.empty() && nodes <= kMaxNodes) {
        const nlohmann::json* n = stack.back();
        stack.pop_back();
        ++nodes;
        if (n->is_structured())
            for (const auto& child : *n) {
                if (stack.size() + nodes > kMaxNodes) break;
                stack.push_back(&child);
            }
    }
    if (nodes > kMaxNodes || !stack.empty()) {
        if (v.is_array()) return "an array of " + std::to_string(v.size()) + " elements";
        return "an object of " + std::to_string(v.size()) + " fields";
    }
    std::string s = v.dump();
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
}

}  // namespace fanout::io
