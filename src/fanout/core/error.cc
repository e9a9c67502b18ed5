#include "fanout/core/error.h"

#include <cstring>

namespace fanout {

void throw_error(const char* file, int line, const std::string& message) {
    const char* base = std::strrchr(file, '/');
    throw Error(fmt::format("{} ({}:{})", message, base ? base + 1 : file, line));
}

void throw_api_error(const char* file, int line, const char* library, const char* statement, int code,
                     const char* message) {
    throw_error(file, line, fmt::format("{} call `{}` failed: {} ({})", library, statement, message, code));
}

void throw_message(const char* file, int line, const char* message) { throw_error(file, line, message); }

}  // namespace fanout
