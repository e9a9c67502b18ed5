// bench: `fanout bench tokenizer` (more benchmarks join as their subsystems land).
#include "cli_common.h"
#include "tokenizer_bench.h"

namespace fanout::cli {

void add_bench_command(CLI::App& app) {
    auto* bench = app.add_subcommand("bench", "benchmarks: print a table, write JSON");
    bench->require_subcommand(1);
    auto o = std::make_shared<bench::TokenizerBenchOptions>();
    auto model = std::make_shared<std::string>("tiny");
    o->corpus = FANOUT_SOURCE_DIR "/tests/fixtures/tokenizer/corpus.jsonl";
    o->js_script = FANOUT_SOURCE_DIR "/scripts/js/tokenize.mjs";
    o->json_out = "tokenizer_bench.json";
    auto* tok = bench->add_subcommand("tokenizer", "single-threaded encode speed beside the JS reference");
    add_model_flag(tok, *model);
    tok->add_option("--corpus", o->corpus, "JSONL corpus")->capture_default_str();
    tok->add_option("--js", o->js_script, "JS reference script ('' to skip)")->capture_default_str();
    tok->add_option("--repeat", o->repeat, "passes over the corpus")->capture_default_str();
    tok->add_option("--json", o->json_out, "JSON output")->capture_default_str();
    tok->callback([o, model] {
        o->tokenizer_dir = resolve_model_dir(*model);
        load_tokenizer(o->tokenizer_dir);  // a clear error when the model has none
        if (const int rc = bench::run_tokenizer_bench(*o); rc != 0) FANOUT_FAIL("tokenizer benchmark found mismatches");
    });
}

}  // namespace fanout::cli
