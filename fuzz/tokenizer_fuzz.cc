// libFuzzer target: DeepSeek-V3's tokenizer on arbitrary bytes.
//
// The first byte picks the mode. Text mode: input that is valid UTF-8 must encode, and decode back
// to itself exactly (after the BOS when special tokens are added); invalid UTF-8 must be rejected with fanout::Error. Ids mode: the bytes are
// read as 16-bit little-endian ids (plus an offset that reaches the added tokens); decode must give
// valid UTF-8 and the streaming decoder's pieces must add up to it. Anything else traps.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fanout/core/error.h"
#include "fanout/io/tokenizer.h"

namespace {

const fanout::io::Tokenizer& tokenizer() {
    static const fanout::io::Tokenizer tok = [] {
        const char* env = std::getenv("FANOUT_TOKENIZER_DIR");
        return fanout::io::Tokenizer::load(env && *env ? env : FANOUT_DEFAULT_TOKENIZER_DIR);
    }();
    return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const fanout::io::Tokenizer& tok = tokenizer();
    const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
    if (data[0] % 2 == 0) {
        const bool valid = fanout::io::utf8_invalid_offset(body) == std::string::npos;
        const bool add_special = data[0] % 4 == 0;
        std::vector<int32_t> ids;
        try {
            ids = tok.encode(body, add_special);
        } catch (const fanout::Error&) {
            if (valid) __builtin_trap();  // valid text must encode
            return 0;
        }
        if (!valid) __builtin_trap();
        // Special-token strings in the text become their ids and decode back to the same text.
        if (tok.decode(ids) != (add_special ? tok.bos_token() : "") + body) __builtin_trap();
        return 0;
    }
    std::vector<int32_t> ids;
    const int32_t offset = data[0] % 4 == 1 ? 0 : 128000 - 1000;
    for (size_t i = 0; i + 1 < body.size(); i += 2)
        ids.push_back(offset + (static_cast<uint8_t>(body[i]) | (static_cast<uint8_t>(body[i + 1]) << 8)));
    const std::string text = tok.decode(ids);
    if (fanout::io::utf8_invalid_offset(text) != std::string::npos) __builtin_trap();
    fanout::io::IncrementalDecoder dec(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += dec.push(id);
    streamed += dec.flush();
    if (streamed != text) __builtin_trap();
    return 0;
}
