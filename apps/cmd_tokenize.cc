// tokenize: one JSON array of ids per input line, for comparing against any oracle from the shell.
//   (default)  each line is raw text
//   --jsonl    each line is a JSON string (so inputs may hold newlines)
//   --chat     each line is a `messages` array, or {"messages": [...], "add_generation_prompt": b},
//              rendered with the chat template (generation prompt on by default)
//   --decode   each line is a JSON array of ids; prints the decoded text as a JSON string
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "fanout/io/chat_template.h"
#include "fanout/io/json_util.h"

namespace fanout::cli {
namespace {

struct TokenizeArgs {
    std::string model = "tiny";
    bool jsonl = false, chat = false, decode = false, add_special = true, skip_special = false;
};

std::string ids_json(const std::vector<int32_t>& ids) { return nlohmann::json(ids).dump(); }

void run_tokenize(const TokenizeArgs& a) {
    FANOUT_CHECK(int(a.jsonl) + int(a.chat) + int(a.decode) <= 1, "--jsonl, --chat and --decode exclude each other");
    const io::Tokenizer tok = load_tokenizer(resolve_model_dir(a.model));
    std::optional<io::ChatFormat> format;
    if (a.chat) format = io::detect_chat_format(tok.chat_template());
    std::string line;
    for (int64_t n = 1; std::getline(std::cin, line); ++n) {
        try {
            if (!a.jsonl && !a.chat && !a.decode) {
                std::cout << ids_json(tok.encode(line, a.add_special)) << '\n';
                continue;
            }
            const nlohmann::json j = io::parse_json_bounded(line, "");
            if (a.jsonl) {
                FANOUT_CHECK(j.is_string(), "--jsonl lines must be JSON strings");
                std::cout << ids_json(tok.encode(j.get<std::string>(), a.add_special)) << '\n';
            } else if (a.decode) {
                FANOUT_CHECK(j.is_array(), "--decode lines must be JSON arrays of ids");
                std::vector<int32_t> ids;
                for (const auto& v : j) {
                    FANOUT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
                                 "ids must be non-negative integers, found {}", v.dump());
                    ids.push_back(v.get<int32_t>());
                }
                std::cout << nlohmann::json(tok.decode(ids, a.skip_special)).dump() << '\n';
            } else {
                bool gen_prompt = true;
                const nlohmann::json* messages = &j;
                if (j.is_object()) {
                    FANOUT_CHECK(j.contains("messages"), "--chat objects need a 'messages' field");
                    messages = &j["messages"];
                    if (j.contains("add_generation_prompt")) {
                        FANOUT_CHECK(j["add_generation_prompt"].is_boolean(),
                                     "'add_generation_prompt' must be a boolean");
                        gen_prompt = j["add_generation_prompt"].get<bool>();
                    }
                }
                const std::string text =
                    io::render_chat(*format, io::parse_chat_messages(*messages), gen_prompt, tok.bos_token());
                std::cout << ids_json(tok.encode(text, false)) << '\n';
            }
        } catch (const Error& e) {
            FANOUT_FAIL("input line {}: {}", n, e.what());
        }
    }
    std::cout.flush();
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
    auto a = std::make_shared<TokenizeArgs>();
    auto* cmd = app.add_subcommand("tokenize", "token ids of each input line on stdin (see --help)");
    add_model_flag(cmd, a->model);
    cmd->add_flag("--jsonl", a->jsonl, "each line is a JSON string");
    cmd->add_flag("--chat", a->chat, "each line is a messages array (or {messages, add_generation_prompt})");
    cmd->add_flag("--decode", a->decode, "each line is a JSON array of ids; print the text");
    cmd->add_flag("--add-special-tokens,!--no-special-tokens", a->add_special,
                  "add BOS/EOS as tokenizer_config.json says (default on; --chat never adds: the template does)");
    cmd->add_flag("--skip-special-tokens", a->skip_special, "--decode: drop special tokens");
    cmd->callback([a] { run_tokenize(*a); });
}

}  // namespace fanout::cli
