#define PCRE2_CODE_UNIT_WIDTH 8
#include "fanout/io/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "fanout/core/error.h"
#include "fanout/io/json_util.h"

namespace fanout::io {
namespace {

using nlohmann::json;

// ---- UTF-8 -------------------------------------------------------------------------------------

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one (truncated,
// overlong, surrogate, past U+10FFFF). `*maximal` gets the length of the maximal invalid prefix
// (at least 1) when 0 is returned.
size_t utf8_sequence(std::string_view s, size_t i, size_t* maximal) {
    const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
    const uint8_t c = b(i);
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        need = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        *maximal = 1;
        return 0;
    }
    size_t k = 1;
    for (; k < need && i + k < s.size(); ++k) {
        const uint8_t x = b(i + k);
        if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xbf)) break;
    }
    if (k == need) return need;
    *maximal = k;
    return 0;
}

// Whether s[i:] is a proper prefix of some valid sequence (a character cut off by the end).
bool utf8_incomplete_tail(std::string_view s, size_t i) {
    size_t maximal = 0;
    return utf8_sequence(s, i, &maximal) == 0 && i + maximal == s.size() && static_cast<uint8_t>(s[i]) >= 0xc2 &&
           static_cast<uint8_t>(s[i]) <= 0xf4;
}

void append_codepoint(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xc0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xe0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
        out += static_cast<char>(0xf0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    }
}

// Decodes the (valid) sequence at s[i] of length n.
uint32_t codepoint_at(std::string_view s, size_t i, size_t n) {
    const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
    switch (n) {
        case 1:
            return b(0);
        case 2:
            return ((b(0) & 0x1f) << 6) | (b(1) & 0x3f);
        case 3:
            return ((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f);
        default:
            return ((b(0) & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f);
    }
}

bool is_whitespace_cp(uint32_t cp) {  // Unicode White_Space
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

// ---- byte-level alphabet (GPT-2's bytes_to_unicode) ---------------------------------------------

struct ByteAlphabet {
    std::string byte_char[256];                     // byte -> its character, UTF-8
    std::unordered_map<uint32_t, uint8_t> cp_byte;  // character -> byte
    ByteAlphabet() {
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
            const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
            append_codepoint(byte_char[b], cp);
            cp_byte[cp] = static_cast<uint8_t>(b);
        }
    }
};

const ByteAlphabet& byte_alphabet() {
    static const ByteAlphabet a;
    return a;
}

// ---- regex (PCRE2) -------------------------------------------------------------------------------

// HF runs Split patterns through Oniguruma, whose Unicode `\s` is [\t\n\v\f\r\x85] plus the Z
// categories; PCRE2's (UCP) also takes U+180E. Rewrite \s and \S so both agree.
std::string oniguruma_whitespace(const std::string& pattern) {
    static const std::string ws = "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}";
    std::string out;
    bool in_class = false;
    for (size_t i = 0; i < pattern.size(); ++i) {
        const char c = pattern[i];
        if (c == '\\' && i + 1 < pattern.size()) {
            const char n = pattern[i + 1];
            if (n == 's')
                out += in_class ? ws : "[" + ws + "]";
            else if (n == 'S' && !in_class)
                out += "[^" + ws + "]";
            else
                out.append(pattern, i, 2);
            ++i;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            out += c;
            if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
            if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // literal ] first
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        out += c;
    }
    return out;
}

class Regex {
  public:
    Regex(const std::string& pattern, const std::string& where) {
        const std::string p = oniguruma_whitespace(pattern);
        int err = 0;
        PCRE2_SIZE offset = 0;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &offset,
                              nullptr);
        if (!code_) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof(msg));
            FANOUT_FAIL("{}: regex {} does not compile at offset {}: {}", where, describe_json(json(pattern)), offset,
                        reinterpret_cast<const char*>(msg));
        }
        jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
    }
    ~Regex() {
        if (code_) pcre2_code_free(code_);
    }
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Calls fn(begin, end) for each non-empty match in s (valid UTF-8), left to right.
    template <typename Fn>
    void for_each_match(std::string_view s, Fn&& fn) const {
        thread_local std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
            pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
        size_t start = 0;
        while (start <= s.size()) {
            const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
            // NOTE: the subject was validated as UTF-8 once, up front, so PCRE2 need not check it again.
            const int rc = jit_
                               ? pcre2_jit_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, md.get(), nullptr)
                               : pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
            if (rc == PCRE2_ERROR_NOMATCH) return;
            FANOUT_CHECK(rc > 0, "tokenizer: regex match failed with PCRE2 error {}", rc);
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
            const size_t b = ov[0], e = ov[1];
            if (e > b) {
                fn(b, e);
                start = e;
            } else {  // an empty match: step over one character
                if (b >= s.size()) return;
                size_t maximal = 0;
                start = b + std::max<size_t>(1, utf8_sequence(s, b, &maximal));
            }
        }
    }

  private:
    pcre2_code* code_ = nullptr;
    bool jit_ = false;
};

struct AddedToken {
    int32_t id;
    std::string content;
    bool special, lstrip, rstrip, single_word, normalized;
};

// The added tokens' contents as a byte trie, so that the tokens matching at a position come from one
// walk of at most the longest token's length, however many share a prefix (DeepSeek-V3's 818 all
// begin with '<': comparing each in turn took 28 s over 8 MB of '<').
class AddedTrie {
  public:
    // Token k (an index into Impl::added) ends at content's last byte.
    void insert(std::string_view content, uint32_t k) {
        uint32_t n = 0;
        for (const char c : content) {
            const uint32_t next = child(n, static_cast<uint8_t>(c));
            if (next != kNone) {
                n = next;
                continue;
            }
            nodes_.push_back({});
            nodes_[n].next.emplace_back(static_cast<uint8_t>(c), static_cast<uint32_t>(nodes_.size() - 1));
            n = static_cast<uint32_t>(nodes_.size() - 1);
        }
        nodes_[n].ends.push_back(k);
    }
    // path[d]: the node after text[pos, pos + d + 1), for as long as the trie follows the text.
    void walk(std::string_view text, size_t pos, std::vector<uint32_t>& path) const {
        path.clear();
        for (uint32_t n = 0; pos < text.size();) {
            n = child(n, static_cast<uint8_t>(text[pos++]));
            if (n == kNone) break;
            path.push_back(n);
        }
    }
    // The tokens whose content ends at node n, in insertion order.
    const std::vector<uint32_t>& ends(uint32_t n) const { return nodes_[n].ends; }

  private:
    static constexpr uint32_t kNone = ~0u;
    struct Node {
        std::vector<std::pair<uint8_t, uint32_t>> next;
        std::vector<uint32_t> ends;
    };
    uint32_t child(uint32_t n, uint8_t c) const {
        for (const auto& [b, to] : nodes_[n].next)
            if (b == c) return to;
        return kNone;
    }
    std::vector<Node> nodes_ = std::vector<Node>(1);
};

const json& field(const json& j, const char* key, const std::string& where) {
    FANOUT_CHECK(j.is_object() && j.contains(key), "{}: missing field '{}'", where, key);
    return j.at(key);
}

std::string string_field(const json& j, const char* key, const std::string& where) {
    const json& v = field(j, key, where);
    FANOUT_CHECK(v.is_string(), "{}: field '{}' must be a string, found {}", where, key, describe_json(v));
    return v.get<std::string>();
}

// A token named in tokenizer_config.json: a string or an AddedToken object with "content".
std::string config_token(const json& cfg, const char* key) {
    if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return "";
    const json& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return "";
}

}  // namespace

// ---- the tokenizer ----------------------------------------------------------------------------

struct Tokenizer::Impl {
    std::string label;
    std::unordered_map<std::string, int32_t> vocab;
    std::vector<std::string> id_to_token;  // model vocabulary and added tokens
    std::vector<uint8_t> is_special;
    std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
    std::vector<AddedToken> added;                                     // sorted by content length, longest first
    AddedTrie added_trie;                                              // indices into added
    std::vector<std::unique_ptr<Regex>> splits;
    int32_t byte_ids[256];
    std::optional<int32_t> bos, eos;
    std::string bos_token, eos_token, chat_template;
    bool add_bos = false, add_eos = false;
    mutable std::mutex cache_mutex;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

    void bpe(std::string_view piece, std::vector<int32_t>& out) const;
    void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

namespace {

void parse_pre_tokenizer(const json& p, const std::string& where, std::vector<std::unique_ptr<Regex>>& splits) {
    if (p.is_null()) return;
    const std::string type = string_field(p, "type", where);
    if (type == "Sequence") {
        const json& list = field(p, "pretokenizers", where);
        FANOUT_CHECK(list.is_array(), "{}: 'pretokenizers' must be an array", where);
        for (size_t i = 0; i < list.size(); ++i) parse_pre_tokenizer(list[i], fmt::format("{}[{}]", where, i), splits);
    } else if (type == "Split") {
        const json& pat = field(p, "pattern", where);
        FANOUT_CHECK(pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string(),
                     "{}: Split 'pattern' must be {{\"Regex\": ...}} (String patterns are not supported), found {}",
                     where, describe_json(pat));
        FANOUT_CHECK(string_field(p, "behavior", where) == "Isolated",
                     "{}: Split behavior '{}' is not supported; fanout implements 'Isolated'", where,
                     string_field(p, "behavior", where));
        FANOUT_CHECK(!optional_bool(p, "invert", false, where), "{}: Split with invert true is not supported", where);
        splits.push_back(std::make_unique<Regex>(pat["Regex"].get<std::string>(), where));
    } else if (type == "ByteLevel") {
        FANOUT_CHECK(!optional_bool(p, "add_prefix_space", false, where) && !optional_bool(p, "use_regex", true, where),
                     "{}: ByteLevel pre-tokenizer with add_prefix_space or use_regex is not supported (DeepSeek-V3 "
                     "uses neither)",
                     where);
    } else {
        FANOUT_FAIL("{}: pre-tokenizer type '{}' is not supported; fanout implements Sequence, Split, ByteLevel", where,
                    type);
    }
}

}  // namespace

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, const std::string& config_json,
                               const std::string& label) {
    auto t = std::make_unique<Impl>();
    t->label = label;
    const json j = parse_json_bounded(tokenizer_json, label);  // real files nest under 10 levels
    FANOUT_CHECK(j.is_object(), "{}: must be a JSON object", label);
    // The model: byte-level BPE.
    const json& model = field(j, "model", label);
    const std::string mwhere = label + ": model";
    FANOUT_CHECK(string_field(model, "type", mwhere) == "BPE", "{}: type '{}' is not supported; fanout implements BPE",
                 mwhere, string_field(model, "type", mwhere));
    FANOUT_CHECK(!optional_bool(model, "byte_fallback", false, mwhere), "{}: byte_fallback BPE is not supported",
                 mwhere);
    // Options that change how BPE splits or merges, which fanout does not implement: refused rather
    // than ignored (DeepSeek-V3 leaves them all null or false).
    FANOUT_CHECK(!optional_bool(model, "ignore_merges", false, mwhere),
                 "{}: ignore_merges BPE (whole-vocab words before merges) is not supported", mwhere);
    const std::pair<const char*, json> unsupported[] = {// each option and its "off" value besides null
                                                        {"dropout", 0},
                                                        {"continuing_subword_prefix", ""},
                                                        {"end_of_word_suffix", ""}};
    for (const auto& [key, off] : unsupported)
        FANOUT_CHECK(!model.contains(key) || model[key].is_null() || model[key] == off,
                     "{}: '{}' {} is not supported (fanout implements plain byte-level BPE)", mwhere, key,
                     describe_json(model[key]));
    const json& vocab = field(model, "vocab", mwhere);
    FANOUT_CHECK(vocab.is_object(), "{}: 'vocab' must be an object", mwhere);
    for (const auto& [tok, id] : vocab.items()) {
        FANOUT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 24),
                     "{}: vocab['{}'] must be an id in [0, 2^24), found {}", mwhere, tok, describe_json(id));
        const int32_t i = id.get<int32_t>();
        t->vocab[tok] = i;
        if (static_cast<size_t>(i) >= t->id_to_token.size()) t->id_to_token.resize(i + 1);
        t->id_to_token[i] = tok;
    }
    // Added tokens (special or not); their ids may extend past the model vocabulary.
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
        const json& list = j["added_tokens"];
        FANOUT_CHECK(list.is_array(), "{}: 'added_tokens' must be an array", label);
        for (size_t k = 0; k < list.size(); ++k) {
            const std::string w = fmt::format("{}: added_tokens[{}]", label, k);
            const json& a = list[k];
            const json& id = field(a, "id", w);
            FANOUT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 24),
                         "{}: 'id' must be in [0, 2^24), found {}", w, describe_json(id));
            AddedToken at{id.get<int32_t>(),
                          string_field(a, "content", w),
                          optional_bool(a, "special", false, w),
                          optional_bool(a, "lstrip", false, w),
                          optional_bool(a, "rstrip", false, w),
                          optional_bool(a, "single_word", false, w),
                          optional_bool(a, "normalized", false, w)};
            FANOUT_CHECK(!at.content.empty() && utf8_invalid_offset(at.content) == std::string::npos,
                         "{}: 'content' must be non-empty valid UTF-8", w);
            if (static_cast<size_t>(at.id) >= t->id_to_token.size()) t->id_to_token.resize(at.id + 1);
            t->id_to_token[at.id] = at.content;
            t->added.push_back(std::move(at));
        }
    }
    t->is_special.assign(t->id_to_token.size(), 0);
    for (const auto& a : t->added) t->is_special[a.id] = a.special;
    std::stable_sort(t->added.begin(), t->added.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    for (size_t k = 0; k < t->added.size(); ++k) t->added_trie.insert(t->added[k].content, static_cast<uint32_t>(k));
    // Merges: "a b" strings (tokenizers < 0.20) or ["a", "b"] pairs.
    const json& merges = field(model, "merges", mwhere);
    FANOUT_CHECK(merges.is_array(), "{}: 'merges' must be an array", mwhere);
    for (size_t r = 0; r < merges.size(); ++r) {
        std::string a, b;
        const json& m = merges[r];
        if (m.is_string()) {
            const std::string s = m.get<std::string>();
            const size_t sp = s.find(' ', 1);
            FANOUT_CHECK(sp != std::string::npos, "{}: merges[{}] = {} is not 'left right'", mwhere, r,
                         describe_json(m));
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else {
            FANOUT_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                         "{}: merges[{}] must be a string or a pair of strings, found {}", mwhere, r, describe_json(m));
            a = m[0].get<std::string>();
            b = m[1].get<std::string>();
        }
        const auto ia = t->vocab.find(a), ib = t->vocab.find(b), im = t->vocab.find(a + b);
        FANOUT_CHECK(ia != t->vocab.end() && ib != t->vocab.end() && im != t->vocab.end(),
                     "{}: merges[{}] '{} {}' uses a token missing from the vocab", mwhere, r, a, b);
        const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
        t->merges.emplace(key, std::make_pair(static_cast<int32_t>(r), im->second));  // first (lowest) rank wins
    }
    const ByteAlphabet& alpha = byte_alphabet();
    for (int b = 0; b < 256; ++b) {
        const auto it = t->vocab.find(alpha.byte_char[b]);
        FANOUT_CHECK(it != t->vocab.end(), "{}: the vocab lacks the byte-level token for byte {} ('{}')", mwhere, b,
                     alpha.byte_char[b]);
        t->byte_ids[b] = it->second;
    }
    // Normalizer: none, or an empty Sequence (DeepSeek-V3).
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
        const json& n = j["normalizer"];
        const std::string type = string_field(n, "type", label + ": normalizer");
        FANOUT_CHECK(
            type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() && n["normalizers"].empty(),
            "{}: normalizer {} is not supported; fanout implements none (or an empty Sequence)", label,
            describe_json(n));
    }
    if (j.contains("pre_tokenizer")) parse_pre_tokenizer(j["pre_tokenizer"], label + ": pre_tokenizer", t->splits);
    if (j.contains("decoder") && !j["decoder"].is_null())
        FANOUT_CHECK(string_field(j["decoder"], "type", label + ": decoder") == "ByteLevel",
                     "{}: decoder '{}' is not supported; fanout implements ByteLevel", label,
                     string_field(j["decoder"], "type", label + ": decoder"));
    // tokenizer_config.json: BOS / EOS, whether to add them, and the chat template.
    if (!config_json.empty()) {
        const std::string cwhere = "tokenizer_config.json beside " + label;
        const json cfg = parse_json_bounded(config_json, cwhere);
        FANOUT_CHECK(cfg.is_object(), "{}: must be a JSON object", cwhere);
        t->bos_token = config_token(cfg, "bos_token");
        t->eos_token = config_token(cfg, "eos_token");
        t->add_bos = optional_bool(cfg, "add_bos_token", false, cwhere);
        t->add_eos = optional_bool(cfg, "add_eos_token", false, cwhere);
        if (cfg.contains("chat_template") && cfg["chat_template"].is_string())
            t->chat_template = cfg["chat_template"].get<std::string>();
    }
    Tokenizer tok(std::move(t));
    if (!tok.impl_->bos_token.empty()) tok.impl_->bos = tok.token_to_id(tok.impl_->bos_token);
    if (!tok.impl_->eos_token.empty()) tok.impl_->eos = tok.token_to_id(tok.impl_->eos_token);
    FANOUT_CHECK(!tok.impl_->add_bos || tok.impl_->bos, "{}: add_bos_token is set but bos_token '{}' is not a token",
                 label, tok.impl_->bos_token);
    FANOUT_CHECK(!tok.impl_->add_eos || tok.impl_->eos, "{}: add_eos_token is set but eos_token '{}' is not a token",
                 label, tok.impl_->eos_token);
    return tok;
}

Tokenizer Tokenizer::load(const std::string& dir) {
    namespace fs = std::filesystem;
    const fs::path tj = fs::path(dir) / "tokenizer.json", tc = fs::path(dir) / "tokenizer_config.json";
    FANOUT_CHECK(fs::exists(tj), "no tokenizer.json in '{}'", dir);
    return from_json(read_text_file(tj.string()), fs::exists(tc) ? read_text_file(tc.string()) : "", tj.string());
}

// BPE over one pre-tokenized piece: its bytes' tokens, merged pair by pair in rank order.
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
    const size_t n = piece.size();
    if (n == 1) {
        out.push_back(byte_ids[static_cast<uint8_t>(piece[0])]);
        return;
    }
    if (n <= 64) {  // short pieces (nearly all): cached, merged by repeated scans
        {
            std::lock_guard<std::mutex> lock(cache_mutex);
            const auto it = cache.find(std::string(piece));
            if (it != cache.end()) {
                out.insert(out.end(), it->second.begin(), it->second.end());
                return;
            }
        }
        std::vector<int32_t> sym(n);
        for (size_t i = 0; i < n; ++i) sym[i] = byte_ids[static_cast<uint8_t>(piece[i])];
        for (;;) {
            int32_t best_rank = INT32_MAX, best_id = -1;
            size_t best = 0;
            for (size_t i = 0; i + 1 < sym.size(); ++i) {
                const auto it = merges.find((static_cast<uint64_t>(sym[i]) << 32) | static_cast<uint32_t>(sym[i + 1]));
                if (it != merges.end() && it->second.first < best_rank) {
                    best_rank = it->second.first;
                    best_id = it->second.second;
                    best = i;
                }
            }
            if (best_id < 0) break;
            sym[best] = best_id;
            sym.erase(sym.begin() + static_cast<int64_t>(best) + 1);
        }
        out.insert(out.end(), sym.begin(), sym.end());
        std::lock_guard<std::mutex> lock(cache_mutex);
        if (cache.size() > (1u << 20)) cache.clear();  // bounded memory for adversarial inputs
        cache.emplace(std::string(piece), std::move(sym));
        return;
    }
    // Long pieces: a linked list of symbols and a heap of candidate merges, O(n log n).
    std::vector<int32_t> sym(n), prev(n), next(n);
    std::vector<uint8_t> alive(n, 1);
    for (size_t i = 0; i < n; ++i) {
        sym[i] = byte_ids[static_cast<uint8_t>(piece[i])];
        prev[i] = static_cast<int32_t>(i) - 1;
        next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    }
    struct Cand {
        int32_t rank, left, right_sym, left_sym;  // rank, position of the left symbol, and both ids then
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    const auto push = [&](int32_t i) {
        if (i < 0 || next[i] < 0) return;
        const auto it = merges.find((static_cast<uint64_t>(sym[i]) << 32) | static_cast<uint32_t>(sym[next[i]]));
        if (it != merges.end()) heap.push({it->second.first, i, sym[next[i]], sym[i]});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        const int32_t i = c.left, j = alive[i] ? next[i] : -1;
        if (j < 0 || sym[i] != c.left_sym || sym[j] != c.right_sym) continue;  // stale
        sym[i] = merges.at((static_cast<uint64_t>(sym[i]) << 32) | static_cast<uint32_t>(sym[j])).second;
        alive[j] = 0;
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        push(prev[i]);
        push(i);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
}

// Normalized, pre-tokenized and BPE-merged text between added tokens.
void Tokenizer::Impl::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::vector<std::string_view> pieces = {text}, next_pieces;
    for (const auto& re : splits) {
        next_pieces.clear();
        for (std::string_view p : pieces) {
            size_t last = 0;
            re->for_each_match(p, [&](size_t b, size_t e) {
                if (b > last) next_pieces.push_back(p.substr(last, b - last));
                next_pieces.push_back(p.substr(b, e - b));
                last = e;
            });
            if (last < p.size()) next_pieces.push_back(p.substr(last));
        }
        pieces.swap(next_pieces);
    }
    for (std::string_view p : pieces) bpe(p, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
    const size_t bad = utf8_invalid_offset(text);
    FANOUT_CHECK(bad == std::string::npos, "text is not valid UTF-8: bad byte 0x{:02x} at offset {}",
                 static_cast<uint8_t>(text[bad]), bad);
    const Impl& t = *impl_;
    std::vector<int32_t> out;
    if (add_special_tokens && t.add_bos) out.push_back(*t.bos);
    // Added tokens, leftmost-longest; a match may swallow whitespace (lstrip/rstrip).
    size_t seg_start = 0, pos = 0;
    const auto is_word_char = [&](size_t i) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        return std::isalnum(c) || c == '_' || c >= 0x80;
    };
    std::vector<uint32_t> path;  // the trie's nodes along the text from pos
    while (pos < text.size()) {
        const AddedToken* hit = nullptr;
        t.added_trie.walk(text, pos, path);
        for (size_t d = path.size(); d-- > 0 && hit == nullptr;)  // longest first
            for (const uint32_t k : t.added_trie.ends(path[d])) {
                const AddedToken& a = t.added[k];
                if (a.single_word && ((pos > 0 && is_word_char(pos - 1)) ||
                                      (pos + a.content.size() < text.size() && is_word_char(pos + a.content.size()))))
                    continue;
                hit = &a;
                break;
            }
        if (!hit) {
            ++pos;
            continue;
        }
        size_t begin = pos, end = pos + hit->content.size();
        const auto ws_before = [&](size_t i, size_t* len) {  // whitespace character ending at i?
            for (size_t k = 1; k <= 3 && k <= i; ++k) {
                size_t maximal = 0;
                const size_t n = utf8_sequence(text, i - k, &maximal);
                if (n == k) {
                    *len = k;
                    return is_whitespace_cp(codepoint_at(text, i - k, k));
                }
            }
            return false;
        };
        if (hit->lstrip) {
            size_t len = 0;
            while (begin > seg_start && ws_before(begin, &len)) begin -= len;
        }
        if (hit->rstrip) {
            while (end < text.size()) {
                size_t maximal = 0;
                const size_t n = utf8_sequence(text, end, &maximal);
                if (n == 0 || !is_whitespace_cp(codepoint_at(text, end, n))) break;
                end += n;
            }
        }
        t.encode_segment(text.substr(seg_start, begin - seg_start), out);
        out.push_back(hit->id);
        seg_start = pos = end;
    }
    t.encode_segment(text.substr(seg_start), out);
    if (add_special_tokens && t.add_eos) out.push_back(*t.eos);
    return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
    const Impl& t = *impl_;
    if (id < 0 || static_cast<size_t>(id) >= t.id_to_token.size()) return "";
    const std::string& tok = t.id_to_token[id];
    const ByteAlphabet& alpha = byte_alphabet();
    std::string bytes;
    for (size_t i = 0; i < tok.size();) {
        size_t maximal = 0;
        const size_t n = utf8_sequence(tok, i, &maximal);
        const auto it = n ? alpha.cp_byte.find(codepoint_at(tok, i, n)) : alpha.cp_byte.end();
        if (it == alpha.cp_byte.end()) return tok;  // not all byte-level: the token's own text
        bytes += static_cast<char>(it->second);
        i += n;
    }
    return bytes;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
    std::string bytes;
    for (int32_t id : ids) {
        if (skip_special_tokens && is_special(id)) continue;
        bytes += token_bytes(id);
    }
    return utf8_lossy(bytes);
}

bool Tokenizer::is_special(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < impl_->is_special.size() && impl_->is_special[id];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
    for (const auto& a : impl_->added)
        if (a.content == token) return a.id;
    const auto it = impl_->vocab.find(std::string(token));
    if (it == impl_->vocab.end()) return std::nullopt;
    return it->second;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

size_t utf8_invalid_offset(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        size_t maximal = 0;
        const size_t n = utf8_sequence(s, i, &maximal);
        if (n == 0) return i;
        i += n;
    }
    return std::string::npos;
}

std::string utf8_lossy(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    for (size_t i = 0; i < bytes.size();) {
        size_t maximal = 0;
        const size_t n = utf8_sequence(bytes, i, &maximal);
        if (n) {
            out.append(bytes, i, n);
            i += n;
        } else {
            out += "\xEF\xBF\xBD";
            i += maximal;
        }
    }
    return out;
}

std::string IncrementalDecoder::push(int32_t id) {
    if (!(skip_special_ && tokenizer_.is_special(id))) pending_ += tokenizer_.token_bytes(id);
    // Emit everything up to an incomplete character at the very end (it may yet be completed).
    size_t cut = pending_.size();
    for (size_t k = 1; k <= 3 && k <= pending_.size(); ++k) {
        if (utf8_incomplete_tail(pending_, pending_.size() - k)) {
            cut = pending_.size() - k;
            break;
        }
    }
    std::string out = utf8_lossy(std::string_view(pending_).substr(0, cut));
    pending_.erase(0, cut);
    return out;
}

std::string IncrementalDecoder::flush() {
    std::string out = utf8_lossy(pending_);
    pending_.clear();
    return out;
}

}  // namespace fanout::io
