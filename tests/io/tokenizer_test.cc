// Tokenizer mechanics on small hand-made tokenizer.json files: BPE merge order (both merge paths
// against a reference), added-token matching (lstrip, rstrip, single_word), UTF-8 handling, and
// clear errors for malformed files.
#include "fanout/io/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "fanout/core/error.h"
#include "fanout/io/chat_template.h"
#include "test_util.h"

namespace fanout::io {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// The 256 byte-level tokens (GPT-2's alphabet), then merges over "a", "b", "c", " ".
json byte_level_tokenizer(const json& added = json::array()) {
    json vocab = json::object();
    int n = 0, id = 0;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        const uint32_t cp = printable ? b : 256 + n++;
        std::string s;
        if (cp < 0x80)
            s += static_cast<char>(cp);
        else {
            s += static_cast<char>(0xc0 | (cp >> 6));
            s += static_cast<char>(0x80 | (cp & 0x3f));
        }
        vocab[s] = id++;
    }
    const std::vector<std::pair<std::string, std::string>> merges = {{"a", "b"},  {"b", "c"},   {"ab", "c"},
                                                                     {"Ġ", "a"},  {"c", "c"},   {"a", "a"},
                                                                     {"Ġa", "b"}, {"aa", "aa"}, {"ab", "ab"}};
    json m = json::array();
    for (const auto& [l, r] : merges) {
        if (!vocab.contains(l + r)) vocab[l + r] = id++;
        m.push_back(l + " " + r);
    }
    return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer",
             {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"},
                 {"pattern", {{"Regex", "\\s+(?!\\S)|\\s+|\\S+"}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
            {"decoder", {{"type", "ByteLevel"}}}};
}

Tokenizer make(const json& j, const json& cfg = json()) {
    return Tokenizer::from_json(j.dump(), cfg.is_null() ? "" : cfg.dump(), "test.json");
}

using fanout::testing::error_of;

// Reference BPE: repeatedly merge the lowest-rank adjacent pair (leftmost on ties).
std::vector<std::string> reference_bpe(const std::string& word, const std::vector<std::string>& merges) {
    std::vector<std::string> sym;
    for (char c : word) sym.push_back(std::string(1, c));
    for (;;) {
        size_t best = SIZE_MAX, rank = SIZE_MAX;
        for (size_t i = 0; i + 1 < sym.size(); ++i)
            for (size_t r = 0; r < merges.size() && r < rank; ++r)
                if (merges[r] == sym[i] + " " + sym[i + 1]) {
                    rank = r;
                    best = i;
                }
        if (best == SIZE_MAX) return sym;
        sym[best] += sym[best + 1];
        sym.erase(sym.begin() + static_cast<long>(best) + 1);
    }
}

TEST(Tokenizer, BpeFollowsMergeRanksOnShortAndLongPieces) {
    const json j = byte_level_tokenizer();
    const Tokenizer tok = make(j);
    std::vector<std::string> merges;
    for (const auto& m : j["model"]["merges"]) merges.push_back(m.get<std::string>());
    std::mt19937 rng(1);
    for (int len : {1, 2, 3, 7, 30, 64, 65, 200, 1000}) {  // <= 64 bytes: scan path; longer: heap path
        for (int rep = 0; rep < 20; ++rep) {
            std::string w;
            for (int i = 0; i < len; ++i) w += "abc"[rng() % 3];
            std::vector<int32_t> expect;
            for (const auto& s : reference_bpe(w, merges)) expect.push_back(*tok.token_to_id(s));
            EXPECT_EQ(tok.encode(w), expect) << w;
            EXPECT_EQ(tok.decode(tok.encode(w)), w);
        }
    }
}

TEST(Tokenizer, MergesAsPairsEqualMergesAsStrings) {
    json j = byte_level_tokenizer();
    json pairs = json::array();
    for (const auto& m : j["model"]["merges"]) {
        const std::string s = m.get<std::string>();
        pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
    }
    const Tokenizer a = make(j);
    j["model"]["merges"] = pairs;
    const Tokenizer b = make(j);
    EXPECT_EQ(a.encode("aabcab ccab"), b.encode("aabcab ccab"));
}

TEST(Tokenizer, AddedTokensHonourStripsAndSingleWord) {
    const json added = {{{"id", 300}, {"content", "<x>"}, {"special", true}},
                        {{"id", 301}, {"content", "<l>"}, {"lstrip", true}},
                        {{"id", 302}, {"content", "<r>"}, {"rstrip", true}},
                        {{"id", 303}, {"content", "cat"}, {"single_word", true}},
                        {{"id", 304}, {"content", "<x>y"}}};
    const Tokenizer tok = make(byte_level_tokenizer(added));
    const auto enc = [&](const std::string& s) { return tok.encode(s); };
    EXPECT_EQ(enc("<x>"), std::vector<int32_t>{300});
    EXPECT_EQ(enc("<x>y").front(), 304);                                           // longest match wins
    EXPECT_EQ(enc("a  <l>"), (std::vector<int32_t>{*tok.token_to_id("a"), 301}));  // spaces before <l> absorbed
    EXPECT_EQ(enc("<r>  a"), (std::vector<int32_t>{302, *tok.token_to_id("a")}));
    EXPECT_EQ(enc("cat"), std::vector<int32_t>{303});
    EXPECT_NE(enc("bobcat").back(), 303);  // inside a word: not matched
    EXPECT_EQ(tok.decode(enc("a<x>b"), true), "ab");
    EXPECT_EQ(tok.decode(enc("a<x>b")), "a<x>b");
    EXPECT_TRUE(tok.is_special(300));
    EXPECT_FALSE(tok.is_special(301));
}

// Added tokens sharing long prefixes (as DeepSeek-V3's, which all begin with '<'): the longest
// that matches wins, a prefix of a longer token matches on its own, duplicates keep the file's
// first, and 200 KB of their shared first byte (each '<' the single_word token: no word character
// beside it) tokenizes in one pass.
TEST(Tokenizer, AddedTokensWithSharedPrefixesMatchLongestFirst) {
    json added = json::array();
    for (int i = 0; i < 40; ++i) added.push_back({{"id", 300 + i}, {"content", "<pad_" + std::to_string(i) + ">"}});
    added.push_back({{"id", 350}, {"content", "<pad_"}});
    added.push_back({{"id", 351}, {"content", "<pad_1>"}});  // a duplicate of 301's content: 301 wins
    added.push_back({{"id", 352}, {"content", "<"}, {"single_word", true}});
    const Tokenizer tok = make(byte_level_tokenizer(added));
    const int32_t lt = 60;  // the byte-level token of "<" (token_to_id gives the added one)
    EXPECT_EQ(tok.encode("<pad_12>"), std::vector<int32_t>{312});
    EXPECT_EQ(tok.encode("<pad_1><pad_"), (std::vector<int32_t>{301, 350}));
    EXPECT_EQ(tok.encode("<pad_9"), (std::vector<int32_t>{350, *tok.token_to_id("9")}));
    EXPECT_EQ(tok.encode("a<b"), (std::vector<int32_t>{*tok.token_to_id("a"), lt, *tok.token_to_id("b")}));
    EXPECT_EQ(tok.encode("<"), std::vector<int32_t>{352});  // single_word: alone it matches
    const std::string many(200000, '<');                    // 200 KB of the shared first byte
    const std::vector<int32_t> ids = tok.encode(many + "<pad_3>");
    EXPECT_EQ(ids.back(), 303);
    EXPECT_EQ(tok.decode(ids), many + "<pad_3>");
}

// A message's text parts join with newlines, as vLLM renders them (they were run together).
TEST(ChatMessages, TextPartsJoinWithNewlines) {
    const json messages = {
        {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
        {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "one"}}}}}};
    const std::vector<ChatMessage> m = parse_chat_messages(messages);
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0].content, "a\nb");
    EXPECT_EQ(m[1].content, "one");
}

TEST(Tokenizer, BosAndEosFollowTokenizerConfig) {
    const json added = {{{"id", 300}, {"content", "<s>"}, {"special", true}},
                        {{"id", 301}, {"content", "</s>"}, {"special", true}}};
    const json cfg = {{"add_bos_token", true},
                      {"add_eos_token", true},
                      {"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
                      {"eos_token", "</s>"}};
    const Tokenizer tok = make(byte_level_tokenizer(added), cfg);
    EXPECT_EQ(tok.encode("a", true), (std::vector<int32_t>{300, *tok.token_to_id("a"), 301}));
    EXPECT_EQ(tok.encode("a", false), (std::vector<int32_t>{*tok.token_to_id("a")}));
    EXPECT_EQ(tok.encode("", true), (std::vector<int32_t>{300, 301}));
    EXPECT_TRUE(tok.encode("", false).empty());
    EXPECT_THAT(error_of([&] { make(byte_level_tokenizer(), cfg); }), HasSubstr("bos_token '<s>' is not a token"));
}

TEST(Tokenizer, InvalidUtf8IsAnErrorNamingTheOffset) {
    const Tokenizer tok = make(byte_level_tokenizer());
    EXPECT_THAT(error_of([&] {
                    tok.encode(
                        "ab\xff"
                        "c");
                }),
                HasSubstr("bad byte 0xff at offset 2"));
    EXPECT_THAT(error_of([&] { tok.encode("\xe2\x82"); }), HasSubstr("offset 0"));      // truncated
    EXPECT_THAT(error_of([&] { tok.encode("\xc0\xaf"); }), HasSubstr("offset 0"));      // overlong
    EXPECT_THAT(error_of([&] { tok.encode("\xed\xa0\x80"); }), HasSubstr("offset 0"));  // surrogate
    EXPECT_EQ(tok.decode(tok.encode("é ✓ 𝄞")), "é ✓ 𝄞");
}

TEST(Utf8, LossyReplacesMaximalInvalidSubsequences) {
    EXPECT_EQ(utf8_lossy("a\xffz"), "a\xEF\xBF\xBDz");
    EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");           // one truncated 4-byte char: one U+FFFD
    EXPECT_EQ(utf8_lossy("\xE2\x82\xE2\x82\xAC"), "\xEF\xBF\xBD€");  // a cut char, then a whole one
    EXPECT_EQ(utf8_lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(utf8_invalid_offset("ok ✓"), std::string::npos);
}

TEST(Tokenizer, MalformedFilesNameTheDefect) {
    EXPECT_THAT(error_of([] { Tokenizer::from_json("{", "", "t.json"); }), HasSubstr("t.json: not valid JSON"));
    EXPECT_THAT(error_of([] { Tokenizer::from_json("[]", "", "t.json"); }), HasSubstr("must be a JSON object"));
    EXPECT_THAT(error_of([] { Tokenizer::from_json("{}", "", "t.json"); }), HasSubstr("missing field 'model'"));
    json j = byte_level_tokenizer();
    j["model"]["type"] = "WordPiece";
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("type 'WordPiece' is not supported"));
    j = byte_level_tokenizer();
    j["model"]["merges"].push_back("zz qq");
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("uses a token missing from the vocab"));
    j = byte_level_tokenizer();
    j["model"]["vocab"].erase("a");
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("merges[0] 'a b' uses a token missing"));
    j = byte_level_tokenizer();
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("does not compile"));
    j = byte_level_tokenizer();
    j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("behavior 'Removed' is not supported"));
    j = byte_level_tokenizer();
    j["normalizer"] = {{"type", "NFC"}};
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("normalizer"));
    j = byte_level_tokenizer({{{"id", -1}, {"content", "<x>"}}});
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("added_tokens[0]: 'id'"));
    j = byte_level_tokenizer({{{"id", 5}, {"content", ""}}});
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("non-empty valid UTF-8"));
    EXPECT_THAT(error_of([&] { Tokenizer::from_json(byte_level_tokenizer().dump(), "{oops", "t.json"); }),
                HasSubstr("tokenizer_config.json beside t.json: not valid JSON"));
    EXPECT_THAT(error_of([] { Tokenizer::load("/nonexistent-dir"); }), HasSubstr("no tokenizer.json in"));
}

// Booleans of the wrong type are named with their file and field (nlohmann's own message named
// neither); a pre-tokenizer nested 40,000 deep is refused instead of overflowing the stack; BPE
// options that change the split are refused instead of ignored.
TEST(Tokenizer, MistypedAndUnsupportedFieldsAreNamed) {
    json j = byte_level_tokenizer({{{"id", 300}, {"content", "<x>"}, {"special", "yes"}}});
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("added_tokens[0]: field 'special' must be true or false"));
    j = byte_level_tokenizer({{{"id", 300}, {"content", "<x>"}, {"lstrip", 1}}});
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("field 'lstrip' must be true or false"));
    j = byte_level_tokenizer();
    j["model"]["byte_fallback"] = "no";
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("model: field 'byte_fallback' must be true or false"));
    j = byte_level_tokenizer();
    j["pre_tokenizer"]["pretokenizers"][0]["invert"] = "x";
    EXPECT_THAT(error_of([&] { make(j); }), HasSubstr("field 'invert' must be true or false"));
    EXPECT_THAT(error_of([] {
                    make(byte_level_tokenizer(), {{"add_bos_token", "true"}});
                }),
                HasSubstr("tokenizer_config.json beside test.json: field 'add_bos_token' must be true or false"));
    j = byte_level_tokenizer({{{"id", 300}, {"content", "<x>"}, {"special", nullptr}}});  // null: the default
    EXPECT_FALSE(make(j).is_special(300));

    for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{{"ignore_merges", true},
                                                                              {"dropout", 0.1},
                                                                              {"continuing_subword_prefix", "##"},
                                                                              {"end_of_word_suffix", "</w>"}}) {
        j = byte_level_tokenizer();
        j["model"][key] = value;
        EXPECT_THAT(error_of([&] { make(j); }), HasSubstr(key)) << key;
    }
    j = byte_level_tokenizer();
    j["model"]["ignore_merges"] = false;
    j["model"]["dropout"] = nullptr;
    j["model"]["continuing_subword_prefix"] = "";
    EXPECT_EQ(make(j).encode("abc"), make(byte_level_tokenizer()).encode("abc"));

    std::string deep;
    for (int i = 0; i < 40000; ++i) deep += R"({"type":"Sequence","pretokenizers":[)";
    deep += R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":false})";
    for (int i = 0; i < 40000; ++i) deep += "]}";
    json shallow = byte_level_tokenizer();
    shallow.erase("pre_tokenizer");
    std::string text = shallow.dump();
    text.insert(1, "\"pre_tokenizer\":" + deep + ",");
    EXPECT_THAT(error_of([&] { Tokenizer::from_json(text, "", "t.json"); }), HasSubstr("t.json: JSON nested deeper"));
}

}  // namespace
}  // namespace fanout::io
