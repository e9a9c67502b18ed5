// fanout: the command-line entry point. One binary, subcommands:
//   make-model  write a synthetic checkpoint (HF/DeepSeek format)
//   generate    continue a prompt with one model instance on the CPU
//   score       write the logits of a token sequence (raw little-endian float32 [T, vocab])
//   tokenize    text, JSON strings or chat messages to token ids (and ids back to text)
//   serve       one engine instance (or a DP group) behind the OpenAI-compatible HTTP API
//   engine      one engine instance behind the gRPC service a router talks to
//   router      the OpenAI-compatible HTTP API in front of many engines (prefix- and load-aware)
//   bench       benchmarks (tokenizer, serve)
//   plan        deployment planner: sweep (Pareto figure), recommend, layer breakdown, profile
// Errors end with "error: ..." on stderr and exit code 2.
#include <cstdio>

#include "cli_common.h"
#ifdef FANOUT_WITH_MPI
#include "fanout/comm/mpi_ep.h"
#endif

int main(int argc, char** argv) {
    CLI::App app{"fanout: DeepSeek-V3 serving with expert parallelism"};
    app.require_subcommand(1);
    fanout::cli::add_model_commands(app);
    fanout::cli::add_tokenize_command(app);
    fanout::cli::add_serve_command(app);
    fanout::cli::add_engine_command(app);
    fanout::cli::add_router_command(app);
    fanout::cli::add_bench_command(app);
    fanout::cli::add_plan_command(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
#ifdef FANOUT_WITH_MPI
        std::fflush(stderr);
        fanout::comm::abort_mpi_job(2);  // a rank of an MPI job: the others must not wait for it
#endif
        return 2;
    }
    return 0;
}
