// plan: the deployment planner (issue 8), a model of DeepSeek-V3 decode on (EP, DP, TP) layouts.
//   fanout plan sweep      the seed's grid: CSV, JSON and the Pareto figure (PNG/SVG via gnuplot)
//   fanout plan recommend  the best layout for a GPU count and an output-speed floor, and runners-up
//   fanout plan layer      one MoE layer's per-kernel breakdown (beside a `bench layer` JSON)
//   fanout plan profile    the efficiency profile in use (defaults or calibrated) and its sources
// Every subcommand takes --calibrate FILE (repeatable): `fanout bench kernels|mla|layer|comm` JSON.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli_common.h"
#include "fanout/plan/calibration.h"
#include "fanout/plan/seed_reference.h"
#include "fanout/plan/sweep.h"

namespace fanout::cli {
namespace {

struct CommonArgs {
    std::vector<std::string> calibrate;
    int kv_len = 5000;
    std::string kv_dtype = "bf16";
    int draft_tokens = 1;
    double acceptance = 0.6;

    DType kv() const { return kv_dtype_from_name(kv_dtype); }
};

void add_common(CLI::App* cmd, CommonArgs& a) {
    cmd->add_option("--calibrate", a.calibrate, "benchmark JSON (bench kernels|mla|layer|comm); repeatable")
        ->check(CLI::ExistingFile);
    cmd->add_option("--kv-len", a.kv_len, "context tokens per request")->capture_default_str();
    cmd->add_option("--kv-dtype", a.kv_dtype,
                    "the KV cache's entries: bf16 (1,152 bytes per token and layer) or fp8 (656; its attention "
                    "speed from a `bench mla` JSON's fp8 rows when calibrated)")
        ->check(CLI::IsMember({"bf16", "fp8"}))
        ->capture_default_str();
    cmd->add_option("--draft-tokens", a.draft_tokens, "MTP draft tokens per step (query length - 1)")
        ->capture_default_str();
    cmd->add_option("--acceptance", a.acceptance, "MTP acceptance rate per draft token")->capture_default_str();
}

plan::Profile profile_for(const CommonArgs& a, const plan::Hardware& hw) {
    std::vector<std::string> notes;
    plan::Profile p = plan::calibrate(plan::default_profile(), a.calibrate, hw, &notes);
    for (const auto& n : notes) std::printf("calibration: %s\n", n.c_str());
    if (a.kv() == DType::kFP8E4M3 && p.attention_fp8_curve.empty())
        std::printf(
            "note: no measurement of attention over the FP8 KV cache (--calibrate a `fanout bench mla` JSON, whose "
            "fp8 rows give one): it is priced at the bf16 cache's rate over the FP8 entries' fewer bytes — our FP8 "
            "decode kernel measured 1.7x slower than that (docs/PERF.md)\n");
    return p;
}

std::string layout(const plan::Prediction& p) {
    return fmt::format("EP{} DP{} TP{} batch {} {}", p.d.ep, p.d.dp(), p.d.tp, p.d.batch,
                       p.d.schedule == plan::Schedule::kMicroBatch ? "microbatch on" : "microbatch off");
}

void run_sweep_cmd(plan::SweepOptions o, const CommonArgs& c, const std::string& out, bool figure) {
    FANOUT_CHECK(!figure || out.find('\'') == std::string::npos, "plan: output folder '{}' must not contain a quote",
                 out);
    // The EPs in order, so that the calibration, the frontiers and the ratio do not depend on the
    // order they were given in.
    for (auto* list : {&o.eps, &o.tps, &o.batches}) {
        std::sort(list->begin(), list->end());
        list->erase(std::unique(list->begin(), list->end()), list->end());
    }
    FANOUT_CHECK(!o.eps.empty(), "plan sweep: no --ep given");
    // One profile for the sweep, calibrated against the hardware of its largest EP.
    const plan::Profile prof = profile_for(c, plan::sweep_hardware(o.hardware, o.eps.back()));
    const auto points = plan::run_sweep(o, prof);
    std::filesystem::create_directories(out);
    const std::string csv = out + "/sweep.csv", json = out + "/sweep.json";
    plan::write_sweep_csv(csv, points);
    plan::write_sweep_json(json, o, points);
    std::printf("%zu points -> %s, %s\n", points.size(), csv.c_str(), json.c_str());
    std::printf("\nPareto frontiers (output tok/s per request, throughput tok/s per machine):\n");
    for (int ep : o.eps) {
        std::printf("  EP%-4d", ep);
        for (const auto& p : plan::pareto_frontier(points, ep))
            std::printf(" %.0f/%.0f(TP%d b%d%s)", p.speed, p.throughput_node, p.d.tp, p.d.batch,
                        p.d.schedule == plan::Schedule::kMicroBatch ? " mb" : "");
        std::printf("\n");
    }
    const auto ep_lo = plan::pareto_frontier(points, o.eps.front()),
               ep_hi = plan::pareto_frontier(points, o.eps.back());
    std::printf("\nEP%d / EP%d throughput at equal speed:", o.eps.back(), o.eps.front());
    for (double s : {20.0, 40.0, 60.0, 80.0, 100.0}) {
        const double lo = plan::frontier_throughput_at(ep_lo, s), hi = plan::frontier_throughput_at(ep_hi, s);
        if (lo > 0 && hi > 0)
            std::printf("  %.0f tok/s: %.1fx", s, hi / lo);
        else
            std::printf("  %.0f tok/s: -", s);
    }
    std::printf("\n");
    if (!figure) return;
    const std::string why = plan::write_pareto_figure(out, points, o.eps);
    if (why.empty())
        std::printf("figure -> %s/pareto.png, %s/pareto.svg\n", out.c_str(), out.c_str());
    else
        std::fprintf(stderr, "warning: %s\n", why.c_str());
}

void run_recommend_cmd(const plan::RecommendOptions& o, const CommonArgs& c) {
    const plan::Profile prof = profile_for(c, plan::hardware_preset(o.hardware));
    const auto best = plan::recommend(o, prof);
    std::printf("%d x %s, output speed >= %.1f tok/s per request, KV %d (%s cache), MTP %d draft at %.0f%%\n\n", o.gpus,
                plan::hardware_preset(o.hardware).name.c_str(), o.min_speed, o.kv_len, c.kv_dtype.c_str(),
                o.draft_tokens, 100 * o.acceptance);
    for (size_t i = 0; i < best.size(); ++i) {
        const auto& p = best[i];
        std::printf("%s %s\n", i == 0 ? "best:     " : "runner-up:", layout(p).c_str());
        std::printf(
            "           %.1f tok/s per request, %.0f tok/s per GPU (%.0f for the %d GPUs), %.1f GB per GPU "
            "(max batch %d), step %.2f ms\n",
            p.speed, p.throughput_gpu, p.throughput_gpu * o.gpus, o.gpus, p.memory_total / 1e9, p.max_batch,
            p.step_us / 1e3);
    }
}

struct LayerArgs {
    int ep = 128, tp = 1, batch = 128;
    bool dense = false;
    std::string hardware = "h100";
    std::string schedule = "all";
    std::string measured;
};

void print_seed_row(const plan::Deployment& d, const plan::Hardware& hw, int kv, const plan::LayerTime& lt) {
    if (hw.name != "H100 SXM" || d.tp != 1 || d.batch != 128 || d.query_len() != 2 || kv != 5000 ||
        d.kv_dtype != DType::kBF16)
        return;
    for (const auto& row : plan::kSeedBreakdown) {
        if (row.ep != d.ep || row.schedule != d.schedule) continue;
        auto cell = [](double v) { return std::isnan(v) ? std::string("-") : fmt::format("{:.0f}", v); };
        std::printf("  seed (%s):  total %s  dispatch %s  combine %s  GroupGEMM %s;  model/seed total %.2f\n",
                    row.label, cell(row.total_us).c_str(), cell(row.dispatch_us).c_str(), cell(row.combine_us).c_str(),
                    cell(row.grouped_gemm_us).c_str(), lt.total_us / row.total_us);
    }
}

bool same_point(const plan::LayerMeasurement& m, const plan::Deployment& d, bool dense) {
    return m.dense == dense && (dense || m.d.ep == d.ep) && m.d.tp == d.tp && m.d.batch == d.batch &&
           m.d.query_len() == d.query_len() && m.d.kv_len == d.kv_len && m.d.kv_dtype == d.kv_dtype;
}

// Every measured point beside the model: the compute-only layer where the point has no
// communication, else the layer under the point's schedule.
void print_measured_points(const std::vector<plan::LayerMeasurement>& measured, const plan::Hardware& hw,
                           const plan::Profile& prof) {
    std::printf("\nall measured points (model: %s)\n", "compute-only sum where communication is not included");
    std::printf("%-6s %5s %6s %-5s %-12s %10s %10s %8s\n", "layer", "EP", "batch", "cache", "schedule", "model us",
                "measured", "model/m");
    for (const auto& m : measured) {
        if (std::isnan(m.total_us)) continue;
        const double model = m.comm_included ? plan::moe_layer_time(m.d, hw, prof).total_us
                                             : plan::layer_compute_us(m.d, hw, prof, m.dense);
        std::printf("%-6s %5s %6d %-5s %-12s %10.1f %10.1f %8.2f\n", m.dense ? "dense" : "moe",
                    m.dense ? "-" : std::to_string(m.d.ep).c_str(), m.d.batch,
                    std::string(kv_dtype_name(m.d.kv_dtype)).c_str(), plan::schedule_name(m.d.schedule), model,
                    m.total_us, model / m.total_us);
    }
}

void run_layer_cmd(const LayerArgs& a, const CommonArgs& c) {
    const plan::Hardware hw = plan::hardware_preset(a.hardware);
    const plan::Profile prof = profile_for(c, hw);
    std::vector<plan::LayerMeasurement> measured;
    if (!a.measured.empty()) measured = plan::read_layer_bench(a.measured);
    std::vector<plan::Schedule> schedules;
    if (a.schedule == "all")
        schedules = {plan::Schedule::kNoOverlap, plan::Schedule::kDispatchOverlap, plan::Schedule::kMicroBatch};
    else
        schedules = {plan::parse_schedule(a.schedule)};
    plan::Deployment d{a.ep, a.tp, a.batch, c.kv_len, c.draft_tokens, c.acceptance, plan::Schedule::kNoOverlap};
    d.kv_dtype = c.kv();
    plan::validate(d, hw);
    for (auto s : schedules) {  // a schedule named alone must fit the point (`all` skips microbatch at batch 1)
        d.schedule = s;
        if (a.schedule != "all") plan::validate(d, hw);
    }
    d.schedule = plan::Schedule::kNoOverlap;
    const std::string where = a.dense ? fmt::format("TP{}", d.tp) : fmt::format("EP{} DP{} TP{}", d.ep, d.dp(), d.tp);
    std::printf("one %s layer, %s, %s, batch %d per instance, query %d, KV %d (%s cache)\n\n",
                a.dense ? "dense" : "MoE", hw.name.c_str(), where.c_str(), d.batch, d.query_len(), d.kv_len,
                c.kv_dtype.c_str());
    const plan::LayerMeasurement* match = nullptr;
    for (const auto& m : measured)
        if (same_point(m, d, a.dense) && m.d.schedule == plan::Schedule::kNoOverlap) match = &m;
    std::printf("%-26s %5s %-11s %9s %9s %8s %10s %10s\n", "kernel (full batch)", "stage", "kind", "MB", "GFLOP",
                "bound", "model us", "measured");
    double model_sum = 0, measured_sum = 0;
    for (const auto& k : plan::layer_kernels(d, hw, prof, d.batch, a.dense)) {
        std::string meas = "-";
        if (match)
            if (auto it = match->kernels.find(k.name); it != match->kernels.end()) {
                meas = fmt::format("{:.1f} ({:+.0f}%)", it->second, 100 * (k.us / it->second - 1));
                measured_sum += it->second;
            }
        if (k.kind != "comm") model_sum += k.us;
        const char* bound = k.kind == "comm" ? "link"
                            : k.flops / k.bytes > (k.kind == "attention" ? hw.bf16_flops : hw.fp8_flops) / hw.hbm_bw
                                ? "compute"
                                : "memory";
        std::printf("%-26s %5d %-11s %9.1f %9.2f %8s %10.1f %16s\n", k.name.c_str(), k.stage, k.kind.c_str(),
                    k.bytes / 1e6, k.flops / 1e9, bound, k.us, meas.c_str());
    }
    if (match) {
        for (const auto& [name, us] : match->kernels) {
            bool known = false;
            for (const auto& k : plan::layer_kernels(d, hw, prof, d.batch, a.dense)) known |= k.name == name;
            if (!known) std::printf("%-26s (measured, not in the model) %.1f\n", name.c_str(), us);
        }
        std::printf("%-26s %55.1f %16.1f  (per-kernel rows, events between kernels included)\n",
                    "sum without communication", model_sum, measured_sum);
        if (!std::isnan(match->total_us))
            std::printf("%-26s %55s %16.1f  (model %+.0f%%)%s\n", "measured total_us", "", match->total_us,
                        100 * (model_sum / match->total_us - 1),
                        std::isnan(match->marked_total_us)
                            ? ""
                            : fmt::format("; with events {:.1f}", match->marked_total_us).c_str());
    }
    if (a.dense) {
        if (!measured.empty()) print_measured_points(measured, hw, prof);
        return;
    }
    std::printf("\n%-18s %9s %9s %9s %10s %9s %9s %10s\n", "schedule", "total us", "dispatch", "combine", "GroupGEMM",
                "GEMMs", "attention", "measured");
    for (auto s : schedules) {
        d.schedule = s;
        if (s == plan::Schedule::kMicroBatch && d.batch < 2) continue;
        const auto lt = plan::moe_layer_time(d, hw, prof);
        std::string meas = "-";
        for (const auto& m : measured)
            if (same_point(m, d, false) && m.comm_included && m.d.schedule == s && !std::isnan(m.total_us))
                meas = fmt::format("{:.1f} ({:+.0f}%)", m.total_us, 100 * (lt.total_us / m.total_us - 1));
        std::printf("%-18s %9.0f %9.0f %9.0f %10.0f %9.0f %9.0f %10s\n", plan::schedule_name(s), lt.total_us,
                    lt.dispatch_us, lt.combine_us, lt.grouped_gemm_us, lt.gemm_us, lt.attention_us, meas.c_str());
        print_seed_row(d, hw, c.kv_len, lt);
    }
    std::printf("\n(dispatch/combine: the time not hidden behind compute under that schedule)\n");
    if (!measured.empty()) print_measured_points(measured, hw, prof);
}

void run_profile_cmd(const std::string& hardware, const CommonArgs& c) {
    const plan::Hardware hw = plan::hardware_preset(hardware);
    const plan::Profile p = profile_for(c, hw);
    std::printf(
        "%s: HBM %.0f GB at %.2f TB/s, FP8 %.0f / BF16 %.0f TFLOP/s, NVLink %.0f GB/s, IB %.0f GB/s per GPU\n\n",
        hw.name.c_str(), hw.hbm_bytes / 1e9, hw.hbm_bw / 1e12, hw.fp8_flops / 1e12, hw.bf16_flops / 1e12,
        hw.nvlink_bw / 1e9, hw.ib_bw / 1e9);
    auto roof = [](const char* n, const plan::Roofline& r) {
        std::printf("%-12s fixed %5.1f us, %3.0f%% of HBM, %3.0f%% of peak, p %.0f   [%s]\n", n, r.fixed_us,
                    100 * r.bw_eff, 100 * r.flop_eff, r.p, r.source.c_str());
    };
    roof("gemm", p.gemm);
    roof("grouped", p.grouped);
    roof("attention", p.attention);
    roof("mha prefill", p.mha_attention);
    roof("elementwise", p.elementwise);
    auto link = [](const char* n, const plan::LinkModel& l) {
        std::printf("%-16s latency %5.1f us, %3.0f%% of the link   [%s]\n", n, l.latency_us, 100 * l.eff,
                    l.source.c_str());
    };
    link("dispatch NVLink", p.dispatch_nvlink);
    link("combine NVLink", p.combine_nvlink);
    link("dispatch IB", p.dispatch_ib);
    link("combine IB", p.combine_ib);
    link("TP collective", p.tp_collective);
    for (const auto& q : p.attention_curve)
        std::printf("attention curve: %6.0f query rows -> %4.1f%% of the BF16 peak\n", q.rows, 100 * q.eff);
    for (const auto& q : p.attention_fp8_curve)
        std::printf("attention curve, FP8 cache: %6.0f query rows -> %4.1f%% of the BF16 peak\n", q.rows, 100 * q.eff);
    for (const auto& q : p.mha_attention_curve)
        std::printf("mha prefill curve: %6.0f tokens per request -> %4.1f%% of the BF16 peak\n", q.rows, 100 * q.eff);
    for (const auto& [name, us] : p.kernel_extra_us) std::printf("kernel extra %-24s %+6.1f us\n", name.c_str(), us);
}

}  // namespace

void add_plan_command(CLI::App& app) {
    auto* plan_cmd = app.add_subcommand("plan", "deployment planner: model, sweep, recommend a layout");
    plan_cmd->require_subcommand(1);

    auto so = std::make_shared<plan::SweepOptions>();
    auto sc = std::make_shared<CommonArgs>();
    auto out = std::make_shared<std::string>("plan_sweep");
    auto figure = std::make_shared<bool>(true);
    auto* sweep = plan_cmd->add_subcommand("sweep", "the seed's grid: CSV, JSON, Pareto figure per EP");
    sweep->add_option("--out", *out, "output folder")->capture_default_str();
    sweep->add_option("--hardware", so->hardware, "seed (EP8 on H200, larger EP on H100), h100 or h200")
        ->capture_default_str();
    sweep->add_option("--ep", so->eps, "EP sizes")->capture_default_str();
    sweep->add_option("--tp", so->tps, "TP sizes")->capture_default_str();
    sweep->add_option("--batch", so->batches, "batches per instance")->capture_default_str();
    sweep->add_flag("!--no-figure", *figure, "skip the gnuplot figure");
    add_common(sweep, *sc);
    sweep->callback([so, sc, out, figure] {
        so->kv_len = sc->kv_len;
        so->kv_dtype = sc->kv();
        so->draft_tokens = sc->draft_tokens;
        so->acceptance = sc->acceptance;
        if (so->hardware != "seed") plan::hardware_preset(so->hardware);  // a clear error for a bad name
        run_sweep_cmd(*so, *sc, *out, *figure);
    });

    auto ro = std::make_shared<plan::RecommendOptions>();
    auto rc = std::make_shared<CommonArgs>();
    auto* rec = plan_cmd->add_subcommand("recommend", "the best layout for N GPUs at an output-speed floor");
    rec->add_option("--gpus", ro->gpus, "GPUs to deploy on")->required();
    rec->add_option("--min-output-speed", ro->min_speed, "output tok/s per request, at least")->required();
    rec->add_option("--hardware", ro->hardware, "h100 or h200")->capture_default_str();
    rec->add_option("--max-batch", ro->max_batch, "largest batch per instance to consider")->capture_default_str();
    rec->add_option("--top", ro->top, "layouts to print")->capture_default_str();
    add_common(rec, *rc);
    rec->callback([ro, rc] {
        ro->kv_len = rc->kv_len;
        ro->kv_dtype = rc->kv();
        ro->draft_tokens = rc->draft_tokens;
        ro->acceptance = rc->acceptance;
        run_recommend_cmd(*ro, *rc);
    });

    auto la = std::make_shared<LayerArgs>();
    auto lc = std::make_shared<CommonArgs>();
    auto* layer = plan_cmd->add_subcommand("layer", "one MoE layer's per-kernel breakdown, as the seed's table");
    layer->add_option("--ep", la->ep, "EP size")->capture_default_str();
    layer->add_option("--tp", la->tp, "TP size")->capture_default_str();
    layer->add_option("--batch", la->batch, "requests per instance")->capture_default_str();
    layer->add_option("--hardware", la->hardware, "h100 or h200")->capture_default_str();
    layer->add_option("--schedule", la->schedule, "all, no_overlap, dispatch_overlap or microbatch")
        ->capture_default_str();
    layer->add_option("--measured", la->measured, "a `bench layer` JSON to print beside the model")
        ->check(CLI::ExistingFile);
    layer->add_flag("--dense", la->dense, "a dense layer (the first 3) instead of a MoE one");
    add_common(layer, *lc);
    layer->callback([la, lc] { run_layer_cmd(*la, *lc); });

    auto pc = std::make_shared<CommonArgs>();
    auto hw = std::make_shared<std::string>("h200");
    auto* prof = plan_cmd->add_subcommand("profile", "the efficiency profile in use and where each number comes from");
    prof->add_option("--hardware", *hw, "h100 or h200")->capture_default_str();
    add_common(prof, *pc);
    prof->callback([pc, hw] { run_profile_cmd(*hw, *pc); });
}

}  // namespace fanout::cli
