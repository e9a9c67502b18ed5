#include "fanout/core/error.h"

#include <cstring>

namespace fanout {

void throw_error(const char* file, int line, const std::string& message) {
    const char* base = std::strrchr(file, '/');
    throw Error(fmt::format("{} ({}:{})", message, base ? base + 1 : file, line));
}

}  // namespace fanout
