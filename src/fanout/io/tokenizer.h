// Tokenizer: HF `tokenizer.json` byte-level BPE (DeepSeek-V3's kind), encode and decode.
//
// Encoding follows HF tokenizers step by step: added tokens are matched first on the raw text
// (leftmost-longest, honouring lstrip / rstrip / single_word); the text between them is normalized
// (the normalizers present in these files), pre-tokenized by the `Split` regexes (PCRE2 with UTF
// and UCP; `\s` rewritten to Oniguruma's Unicode whitespace, which HF uses) and ByteLevel, and each
// piece is merged by BPE rank. `add_special_tokens` adds BOS / EOS per `tokenizer_config.json`
// (`add_bos_token`, `add_eos_token`), as transformers' LlamaTokenizerFast does.
//
// Decoding follows HF's ByteLevel decoder: a token whose characters are all in the byte alphabet
// becomes those bytes, any other (added tokens) its UTF-8 text; invalid UTF-8 in the result is
// replaced by U+FFFD per maximal invalid subsequence (Rust's from_utf8_lossy). Ids the tokenizer
// does not know (the model's vocabulary is padded past the tokenizer's) decode to nothing.
//
// Bad input: text that is not valid UTF-8 is an Error naming the byte offset (HF takes only Rust
// strings, so it cannot be given such text); a malformed tokenizer.json is an Error naming the
// field. A Tokenizer is immutable after loading and safe to use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fanout::io {

class Tokenizer {
public:
    // tokenizer.json text, and tokenizer_config.json text (may be empty); labels name them in errors.
    static Tokenizer from_json(const std::string& tokenizer_json, const std::string& config_json,
                               const std::string& label = "tokenizer.json");
    // DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
    static Tokenizer load(const std::string& dir);

    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;

    std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
    std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

    // One token's bytes as the decoder produces them before UTF-8 repair ("" for unknown ids).
    std::string token_bytes(int32_t id) const;
    bool is_special(int32_t id) const;
    std::optional<int32_t> token_to_id(std::string_view token) const;
    // One past the largest id the tokenizer knows.
    int64_t vocab_size() const;

    std::optional<int32_t> bos_id() const;
    std::optional<int32_t> eos_id() const;
    const std::string& bos_token() const;
    const std::string& eos_token() const;
    const std::string& chat_template() const;  // "" when the config has none

private:
    struct Impl;
    explicit Tokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// Replaces each maximal invalid UTF-8 subsequence with U+FFFD (Rust's String::from_utf8_lossy).
std::string utf8_lossy(std::string_view bytes);
// The byte offset of the first invalid UTF-8 sequence, or npos when `s` is valid.
size_t utf8_invalid_offset(std::string_view s);

// Streaming detokenizer: push ids one at a time and get text as soon as it is valid UTF-8. A
// multi-byte character is never split, and the concatenation of everything returned (flush
// included) equals Tokenizer::decode of all the ids.
class IncrementalDecoder {
public:
    explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
        : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}
    std::string push(int32_t id);
    // The rest: an incomplete trailing character becomes U+FFFD, as decode() would make it.
    std::string flush();

private:
    const Tokenizer& tokenizer_;
    bool skip_special_;
    std::string pending_;
};

}  // namespace fanout::io
