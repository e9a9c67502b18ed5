#include "fanout/plan/sweep.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "fanout/core/error.h"

namespace fanout::plan {
namespace {

using Key = std::tuple<int, int, int, int>;
Key key(const Prediction& p) { return {p.d.ep, p.d.tp, p.d.batch, int(p.d.schedule)}; }

std::set<Key> frontier_keys(const std::vector<Prediction>& points) {
    std::set<int> eps;
    for (const auto& p : points) eps.insert(p.d.ep);
    std::set<Key> keys;
    for (int ep : eps)
        for (const auto& p : pareto_frontier(points, ep)) keys.insert(key(p));
    return keys;
}

std::ofstream open_out(const std::string& path) {
    std::ofstream f(path);
    FANOUT_CHECK(f.good(), "plan: cannot write '{}'", path);
    return f;
}

nlohmann::json to_json(const Prediction& p, bool pareto) {
    return {{"hardware", p.hardware},
            {"ep", p.d.ep},
            {"dp", p.d.dp()},
            {"tp", p.d.tp},
            {"batch", p.d.batch},
            {"requests_per_gpu", double(p.d.batch) / p.d.tp},
            {"schedule", schedule_name(p.d.schedule)},
            {"speed_tok_s", p.speed},
            {"throughput_gpu_tok_s", p.throughput_gpu},
            {"throughput_node_tok_s", p.throughput_node},
            {"step_us", p.step_us},
            {"moe_layer_us", p.moe_layer_us},
            {"dense_layer_us", p.dense_layer_us},
            {"memory_gb", p.memory_total / 1e9},
            {"max_batch", p.max_batch},
            {"fits", p.fits},
            {"pareto", pareto}};
}

}  // namespace

Hardware sweep_hardware(const std::string& hardware, int ep) {
    if (hardware == "seed") return ep <= 8 ? h200_sxm() : h100_sxm();
    return hardware_preset(hardware);
}

std::vector<Prediction> run_sweep(const SweepOptions& o, const Profile& prof) {
    FANOUT_CHECK(!o.eps.empty() && !o.tps.empty() && !o.batches.empty() && !o.schedules.empty(),
                 "plan sweep: empty EP, TP, batch or schedule list");
    // Every value given is checked, each against a deployment it could be part of, before any
    // point is skipped: a list of which nothing is valid is an error, not an empty sweep.
    for (int ep : o.eps)
        validate(Deployment{ep, 1, o.batches.front(), o.kv_len, o.draft_tokens, o.acceptance},
                 sweep_hardware(o.hardware, ep));
    for (int tp : o.tps) validate(Deployment{8, tp, 1, 0}, h200_sxm());
    for (int b : o.batches) validate(Deployment{8, 1, b, 0}, h200_sxm());
    std::vector<Prediction> out;
    for (int ep : o.eps) {
        const Hardware hw = sweep_hardware(o.hardware, ep);
        for (int tp : o.tps) {
            if (tp > ep) continue;  // TP groups live inside the EP group
            for (int b : o.batches)
                for (Schedule s : o.schedules) {
                    if (s == Schedule::kMicroBatch && b < 2) continue;
                    Deployment d{ep, tp, b, o.kv_len, o.draft_tokens, o.acceptance, s};
                    d.kv_dtype = o.kv_dtype;
                    out.push_back(predict(d, hw, prof));
                }
        }
    }
    FANOUT_CHECK(!out.empty(),
                 "plan sweep: no point: every TP given exceeds every EP given (TP groups live inside "
                 "the EP group)");
    return out;
}

std::vector<Prediction> pareto_frontier(const std::vector<Prediction>& points, int ep) {
    std::vector<Prediction> cand;
    for (const auto& p : points)
        if (p.d.ep == ep && p.fits) cand.push_back(p);
    std::sort(cand.begin(), cand.end(), [](const Prediction& a, const Prediction& b) {
        return a.speed != b.speed ? a.speed > b.speed : a.throughput_node > b.throughput_node;
    });
    std::vector<Prediction> front;
    double best = -1;
    for (const auto& p : cand)
        if (p.throughput_node > best) {
            front.push_back(p);
            best = p.throughput_node;
        }
    return front;
}

double frontier_throughput_at(const std::vector<Prediction>& frontier, double min_speed) {
    double best = 0;
    for (const auto& p : frontier)
        if (p.speed >= min_speed) best = std::max(best, p.throughput_node);
    return best;
}

void write_sweep_csv(const std::string& path, const std::vector<Prediction>& points) {
    const auto front = frontier_keys(points);
    auto f = open_out(path);
    f << "hardware,ep,dp,tp,batch,requests_per_gpu,schedule,speed_tok_s,throughput_gpu_tok_s,throughput_node_tok_s,"
         "step_us,moe_layer_us,dense_layer_us,memory_gb,max_batch,fits,pareto\n";
    for (const auto& p : points)
        f << fmt::format("{},{},{},{},{},{:.4g},{},{:.3f},{:.2f},{:.1f},{:.1f},{:.2f},{:.2f},{:.2f},{},{},{}\n",
                         p.hardware, p.d.ep, p.d.dp(), p.d.tp, p.d.batch, double(p.d.batch) / p.d.tp,
                         schedule_name(p.d.schedule), p.speed, p.throughput_gpu, p.throughput_node, p.step_us,
                         p.moe_layer_us, p.dense_layer_us, p.memory_total / 1e9, p.max_batch, int(p.fits),
                         int(front.count(key(p)) > 0));
    FANOUT_CHECK(f.good(), "plan: writing '{}' failed", path);
}

void write_sweep_json(const std::string& path, const SweepOptions& o, const std::vector<Prediction>& points) {
    const auto front = frontier_keys(points);
    nlohmann::json j;
    j["benchmark"] = "plan_sweep";
    j["options"] = {{"hardware", o.hardware},
                    {"kv_len", o.kv_len},
                    {"kv_dtype", kv_dtype_name(o.kv_dtype)},
                    {"draft_tokens", o.draft_tokens},
                    {"acceptance", o.acceptance}};
    j["points"] = nlohmann::json::array();
    for (const auto& p : points) j["points"].push_back(to_json(p, front.count(key(p)) > 0));
    j["frontiers"] = nlohmann::json::object();
    for (int ep : o.eps) {
        auto& arr = j["frontiers"][fmt::format("EP{}", ep)] = nlohmann::json::array();
        for (const auto& p : pareto_frontier(points, ep)) arr.push_back(to_json(p, true));
    }
    auto f = open_out(path);
    f << j.dump(1) << '\n';
    FANOUT_CHECK(f.good(), "plan: writing '{}' failed", path);
}

std::string write_pareto_figure(const std::string& dir, const std::vector<Prediction>& points,
                                const std::vector<int>& eps) {
    namespace fs = std::filesystem;
    fs::create_directories(dir);
    // One data file per EP: every fitting point (light dots) and the frontier (a line), as the seed drew.
    std::string plot;
    const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
    for (size_t i = 0; i < eps.size(); ++i) {
        const int ep = eps[i];
        auto pts = open_out((fs::path(dir) / fmt::format("points_ep{}.dat", ep)).string());
        pts << "# speed_tok_s throughput_node_tok_s tp batch schedule\n";
        for (const auto& p : points)
            if (p.d.ep == ep && p.fits)
                pts << fmt::format("{:.3f} {:.1f} {} {} {}\n", p.speed, p.throughput_node, p.d.tp, p.d.batch,
                                   schedule_name(p.d.schedule));
        auto fr = open_out((fs::path(dir) / fmt::format("frontier_ep{}.dat", ep)).string());
        fr << "# speed_tok_s throughput_node_tok_s tp batch schedule\n";
        for (const auto& p : pareto_frontier(points, ep))
            fr << fmt::format("{:.3f} {:.1f} {} {} {}\n", p.speed, p.throughput_node, p.d.tp, p.d.batch,
                              schedule_name(p.d.schedule));
        const char* c = colors[i % 8];
        plot += fmt::format(
            "{}'points_ep{}.dat' using 1:2 with points pt 7 ps 0.4 lc rgb '{}' notitle, "
            "'frontier_ep{}.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 lc rgb '{}' title 'EP{}'",
            i ? ", \\\n     " : "", ep, c, ep, c, ep);
    }
    const std::string body = fmt::format(
        "# fanout plan sweep: output speed per request vs throughput per machine, Pareto frontier per EP.\n"
        "set title 'DeepSeek-V3 decode: Pareto frontier per EP (fanout plan model)'\n"
        "set xlabel 'output speed per request (tok/s)'\n"
        "set ylabel 'throughput per machine (tok/s)'\n"
        "set logscale y\n"
        "set grid\n"
        "set key top right\n"
        "set terminal pngcairo size 1100,750 font ',11'\n"
        "set output 'pareto.png'\n"
        "plot {}\n"
        "set terminal svg size 1100,750 dynamic font ',11'\n"
        "set output 'pareto.svg'\n"
        "replot\n"
        "unset output\n",
        plot);
    auto gp = open_out((fs::path(dir) / "pareto.gp").string());
    gp << body;
    gp.close();
    if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
        return fmt::format(
            "gnuplot not found: install gnuplot-nox (scripts/install_deps.sh does) to draw "
            "pareto.png/pareto.svg; the data and {}/pareto.gp are written",
            dir);
    const std::string cmd = fmt::format("cd '{}' && gnuplot pareto.gp 2>gnuplot.log", dir);
    FANOUT_CHECK(dir.find('\'') == std::string::npos, "plan: output folder '{}' must not contain a quote", dir);
    if (std::system(cmd.c_str()) != 0)
        return fmt::format("gnuplot failed; see {}/gnuplot.log (the data and pareto.gp are written)", dir);
    return "";
}

std::vector<Prediction> recommend(const RecommendOptions& o, const Profile& prof) {
    const Hardware hw = hardware_preset(o.hardware);
    FANOUT_CHECK(o.gpus >= 1, "plan recommend: --gpus {} must be at least 1", o.gpus);
    FANOUT_CHECK(o.gpus <= hw.gpus_per_node || o.gpus % hw.gpus_per_node == 0,
                 "plan recommend: --gpus {} is not a whole number of {}-GPU {} nodes", o.gpus, hw.gpus_per_node,
                 hw.name);
    FANOUT_CHECK(o.min_speed >= 0, "plan recommend: --min-output-speed {} must not be negative", o.min_speed);
    FANOUT_CHECK(o.max_batch >= 1 && o.top >= 1, "plan recommend: --max-batch and --top must be at least 1");
    std::vector<Prediction> best;  // one per (EP, TP, schedule)
    Prediction fastest;
    for (int ep = 1; ep <= 256; ep *= 2) {
        if (ep > o.gpus || o.gpus % ep != 0) continue;
        if (ep > hw.gpus_per_node && ep % hw.gpus_per_node != 0) continue;
        for (int tp : {1, 2, 4, 8}) {
            if (tp > ep || tp > hw.gpus_per_node) continue;
            const int cap =
                std::min(o.max_batch, max_batch_per_instance(hw, ep, tp, o.kv_len + 1 + o.draft_tokens, o.kv_dtype));
            for (Schedule s : {Schedule::kDispatchOverlap, Schedule::kMicroBatch}) {
                Prediction layout_best;
                for (int b = s == Schedule::kMicroBatch ? 2 : 1; b <= cap; ++b) {
                    Deployment d{ep, tp, b, o.kv_len, o.draft_tokens, o.acceptance, s};
                    d.kv_dtype = o.kv_dtype;
                    const Prediction p = predict(d, hw, prof);
                    if (!p.fits) continue;
                    if (p.speed > fastest.speed) fastest = p;
                    if (p.speed >= o.min_speed && p.throughput_gpu > layout_best.throughput_gpu) layout_best = p;
                }
                if (layout_best.throughput_gpu > 0) best.push_back(layout_best);
            }
        }
    }
    FANOUT_CHECK(fastest.speed > 0, "plan recommend: nothing fits {} {} GPUs at KV length {}", o.gpus, hw.name,
                 o.kv_len);
    FANOUT_CHECK(!best.empty(),
                 "plan recommend: no layout on {} {} GPUs reaches {} tok/s per request; the fastest is EP{} TP{} "
                 "batch {} at {:.1f} tok/s",
                 o.gpus, hw.name, o.min_speed, fastest.d.ep, fastest.d.tp, fastest.d.batch, fastest.speed);
    std::sort(best.begin(), best.end(),
              [](const Prediction& a, const Prediction& b) { return a.throughput_gpu > b.throughput_gpu; });
    if (int(best.size()) > o.top) best.resize(o.top);
    return best;
}

}  // namespace fanout::plan
