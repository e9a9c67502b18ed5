// Helpers for validating JSON inputs (safetensors headers, config.json).
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fanout/core/error.h"

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

// Parses JSON text; malformed text is an Error "<label>: not valid JSON: <why>".
inline nlohmann::json parse_json(std::string_view text, const std::string& label) {
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        FANOUT_FAIL("{}: not valid JSON: {}", label, e.what());
    }
}

// A whole file as bytes; an unreadable one is an Error naming it.
inline std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    FANOUT_CHECK(in.good(), "cannot read {}", path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace fanout::io
