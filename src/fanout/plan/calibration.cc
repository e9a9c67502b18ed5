#include "fanout/plan/calibration.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "fanout/core/error.h"
#include "fanout/plan/v3_shape.h"

namespace fanout::plan {
namespace {

using nlohmann::json;

// A GPU KV cache's entry type as a benchmark JSON names it at `key` of `where`: "bf16" or "fp8".
DType gpu_kv_dtype(const json& v, const std::string& file, const std::string& where, const char* key) {
    FANOUT_CHECK(v.is_string() && (v == "bf16" || v == "fp8"), "{}: {}.{} must be \"bf16\" or \"fp8\"", file, where,
                 key);
    return kv_dtype_from_name(v.get<std::string>());
}

// Typed access that names the file and the key path on failure.
class Reader {
  public:
    explicit Reader(std::string file) : file_(std::move(file)) {}

    const json& child(const json& j, const std::string& key, const std::string& where) const {
        FANOUT_CHECK(j.is_object(), "{}: {} must be a JSON object", file_, where);
        FANOUT_CHECK(j.contains(key), "{}: {} has no key '{}'", file_, where, key);
        return j.at(key);
    }
    std::optional<double> opt_num(const json& j, const std::string& key, const std::string& where) const {
        if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return std::nullopt;
        FANOUT_CHECK(j.at(key).is_number(), "{}: {}.{} must be a number, got {}", file_, where, key, j.at(key).dump());
        return j.at(key).get<double>();
    }
    double num(const json& j, const std::string& key, const std::string& where) const {
        const json& v = child(j, key, where);
        FANOUT_CHECK(v.is_number(), "{}: {}.{} must be a number, got {}", file_, where, key, v.dump());
        return v.get<double>();
    }
    // A whole number in [lo, hi] (a size, a count, a rank count).
    int64_t count(const json& j, const std::string& key, const std::string& where, int64_t lo, int64_t hi) const {
        return checked_count(num(j, key, where), key, where, lo, hi);
    }
    int64_t opt_count(const json& j, const std::string& key, const std::string& where, int64_t lo, int64_t hi,
                      int64_t fallback) const {
        const auto v = opt_num(j, key, where);
        return v ? checked_count(*v, key, where, lo, hi) : fallback;
    }
    // A kernel's time: from a nanosecond to 1,000 s (a smaller one makes any efficiency absurd).
    double time(const json& j, const std::string& key, const std::string& where) const {
        const double us = num(j, key, where);
        FANOUT_CHECK(std::isfinite(us) && us >= 1e-3 && us <= 1e9,
                     "{}: {}.{} = {} must be a time in us between 0.001 and 1e9", file_, where, key, us);
        return us;
    }
    // A measured share of a datasheet peak: a point above it by more than the datasheet's slack
    // (a time too small, a size too large) would bend the whole model, so it is refused.
    double share(double fraction, const std::string& where, const std::string& what) const {
        FANOUT_CHECK(std::isfinite(fraction) && fraction <= 1.25,
                     "{}: {} implies {:.0f}% of the {} — more than the hardware can do (a time too small?)", file_,
                     where, 100 * fraction, what);
        return fraction;
    }
    const json& array(const json& j, const std::string& key, const std::string& where) const {
        const json& v = child(j, key, where);
        FANOUT_CHECK(v.is_array(), "{}: {}.{} must be an array", file_, where, key);
        return v;
    }
    const std::string& file() const { return file_; }

  private:
    int64_t checked_count(double v, const std::string& key, const std::string& where, int64_t lo, int64_t hi) const {
        FANOUT_CHECK(std::isfinite(v) && v == std::floor(v) && v >= double(lo) && v <= double(hi),
                     "{}: {}.{} = {} must be a whole number in [{}, {}]", file_, where, key, v, lo, hi);
        return static_cast<int64_t>(v);
    }
    std::string file_;
};

constexpr int64_t kMaxDim = int64_t{1} << 20;  // a GEMM side, a batch, heads
constexpr int64_t kMaxLen = int64_t{1} << 24;  // a KV length, tokens

json load(const std::string& path) {
    std::ifstream f(path);
    FANOUT_CHECK(f.good(), "plan: cannot read calibration file '{}'", path);
    try {
        return json::parse(f);
    } catch (const json::exception& e) {
        FANOUT_FAIL("plan: '{}' is not valid JSON: {}", path, e.what());
    }
}

void note_gpu(const json& j, const Reader& r, const Hardware& hw, std::vector<std::string>& notes) {
    if (j.contains("gpu") && j["gpu"].is_string()) {
        const std::string gpu = j["gpu"].get<std::string>();
        const std::string want = hw.name.substr(0, 4);  // "H100" / "H200"
        if (gpu.find(want) == std::string::npos)
            notes.push_back(fmt::format("{}: measured on '{}', applied to {} as fractions of its datasheet", r.file(),
                                        gpu, hw.name));
    }
}

void calibrate_kernels(Profile& p, const json& j, const Reader& r, const Hardware& hw,
                       std::vector<std::string>& notes) {
    note_gpu(j, r, hw, notes);
    auto refit = [&](Roofline& target, const std::vector<RooflineSample>& samples, const char* what) {
        if (samples.size() < 3) {
            notes.push_back(
                fmt::format("{}: {} {} points (< 3): {} roofline kept", r.file(), samples.size(), what, what));
            return;
        }
        const RooflineFit fit = fit_roofline(samples, hw.hbm_bw, hw.fp8_flops);
        target = fit.roofline;
        target.source = fmt::format("fit on {} ({} {} points, max error {:.0f}%)", r.file(), samples.size(), what,
                                    100 * fit.max_rel_error);
        notes.push_back(
            fmt::format("{}: {} roofline fixed {:.1f} us, {:.0f}% of HBM, {:.0f}% of FP8, p {} (max error "
                        "{:.0f}%, rms {:.0f}%)",
                        r.file(), what, target.fixed_us, 100 * target.bw_eff, 100 * target.flop_eff, target.p,
                        100 * fit.max_rel_error, 100 * fit.rms_rel_error));
    };

    std::vector<RooflineSample> dense;
    if (j.contains("dense")) {
        const json& rows = r.array(r.child(j, "dense", "top level"), "rows", "dense");
        for (size_t i = 0; i < rows.size(); ++i) {
            const std::string where = fmt::format("dense.rows[{}]", i);
            const double n = r.count(rows[i], "N", where, 1, kMaxDim), k = r.count(rows[i], "K", where, 1, kMaxDim);
            const double m = r.count(rows[i], "M", where, 1, kMaxLen);
            const double us = r.time(r.child(rows[i], "fanout", where), "us", where + ".fanout");
            // The benchmark replays one weight: weights below L2 stay cached there (docs/PERF.md).
            r.share(2 * m * n * k / (us * 1e-6) / hw.fp8_flops, where, "FP8 peak");
            dense.push_back({gemm_bytes(m, n, k, n * k <= kL2Bytes), 2 * m * n * k, us});
        }
        refit(p.gemm, dense, "dense GEMM");
    } else {
        notes.push_back(fmt::format("{}: no 'dense' section: GEMM roofline kept", r.file()));
    }

    std::vector<RooflineSample> grouped;
    double ew_bw_sum = 0;
    int ew_n = 0;
    if (j.contains("grouped")) {
        const json& rows = r.array(j, "grouped", "top level");
        for (size_t i = 0; i < rows.size(); ++i) {
            const std::string where = fmt::format("grouped[{}]", i);
            const json& row = rows[i];
            FANOUT_CHECK(row.is_object() && row.contains("kind") && row["kind"].is_string(),
                         "{}: {} needs a string 'kind'", r.file(), where);
            const std::string kind = row["kind"].get<std::string>();
            if (kind == "grouped_masked") {
                const double n = r.count(row, "N", where, 1, kMaxDim), k = r.count(row, "K", where, 1, kMaxDim);
                const double experts = r.count(row, "experts", where, 1, 1 << 16);
                const double tokens = r.count(row, "valid_m", where, 0, kMaxLen);
                const double us = r.time(r.child(row, "fanout", where), "us", where + ".fanout");
                r.share(2 * tokens * n * k / (us * 1e-6) / hw.fp8_flops, where, "FP8 peak");
                grouped.push_back({grouped_gemm_bytes(experts, tokens, n, k), 2 * tokens * n * k, us});
            } else if (kind == "silu_mul_quant_masked") {
                const double tokens = r.count(row, "valid_m", where, 1, kMaxLen), us = r.time(row, "us", where);
                // Same accounting as the cost model's grouped_silu_quant: 5 bytes per intermediate value.
                const double bytes = tokens * v3::kMoeInter * 5;
                const double t = us - p.elementwise.fixed_us;
                if (t > 0) {
                    ew_bw_sum += bytes / (t * 1e-6) / hw.hbm_bw;
                    ++ew_n;
                }
            }
        }
        refit(p.grouped, grouped, "grouped GEMM");
    } else {
        notes.push_back(fmt::format("{}: no 'grouped' section: grouped GEMM roofline kept", r.file()));
    }
    // Elementwise kernels read what the kernel before them just wrote (L2-resident at decode sizes),
    // so their bandwidth is the measured copy ceiling. The standalone silu·mul·quant rows run on
    // cold inputs (~19% of HBM); the same kernel inside `bench layer` runs at several times that.
    if (const auto copy = r.opt_num(j, "copy_gbs", "top level")) {
        FANOUT_CHECK(*copy > 0, "{}: copy_gbs must be positive", r.file());
        p.elementwise.bw_eff = r.share(*copy * 1e9 / hw.hbm_bw, "copy_gbs", "HBM bandwidth");
        p.elementwise.source = fmt::format("copy ceiling {:.0f} GB/s in {}", *copy, r.file());
        notes.push_back(fmt::format("{}: elementwise kernels at the copy ceiling, {:.0f}% of HBM{}", r.file(),
                                    100 * p.elementwise.bw_eff,
                                    ew_n > 0 ? fmt::format(" (standalone silu·mul·quant on cold inputs: {:.0f}%, {} "
                                                           "points, not used)",
                                                           100 * ew_bw_sum / ew_n, ew_n)
                                             : std::string()));
    } else if (ew_n > 0) {
        p.elementwise.bw_eff = r.share(ew_bw_sum / ew_n, "grouped[] silu_mul_quant_masked rows", "HBM bandwidth");
        p.elementwise.source = fmt::format("silu_mul_quant_masked in {} ({} points)", r.file(), ew_n);
        notes.push_back(fmt::format("{}: elementwise kernels at {:.0f}% of HBM (fused silu·mul·quant, {} points)",
                                    r.file(), 100 * p.elementwise.bw_eff, ew_n));
    }
}

struct LinkPoint {
    double bytes, us;
};

void fit_link(LinkModel& link, const std::vector<LinkPoint>& pts, double bw, const std::string& what,
              const std::string& file, std::vector<std::string>& notes) {
    if (pts.empty()) return;
    double mx = 0, my = 0;
    for (const auto& q : pts) mx += q.bytes, my += q.us;
    mx /= pts.size(), my /= pts.size();
    double sxx = 0, sxy = 0;
    for (const auto& q : pts) sxx += (q.bytes - mx) * (q.bytes - mx), sxy += (q.bytes - mx) * (q.us - my);
    if (pts.size() >= 2 && sxx > 0) {
        const double slope = sxy / sxx;  // us per byte
        FANOUT_CHECK(slope > 0, "{}: {} times do not grow with the bytes sent; cannot fit a bandwidth", file, what);
        link.latency_us = std::max(0.0, my - slope * mx);
        link.eff = 1e6 / (slope * bw);
    } else {
        const auto& q = pts.front();
        FANOUT_CHECK(q.us > link.latency_us && q.bytes > 0,
                     "{}: {} point ({} us) is not above the latency ({} us); cannot set a bandwidth", file, what, q.us,
                     link.latency_us);
        link.eff = q.bytes / ((q.us - link.latency_us) * 1e-6) / bw;
    }
    FANOUT_CHECK(std::isfinite(link.eff) && link.eff <= 1.25,
                 "{}: {} points imply {:.0f}% of the link — more than it can carry (times that barely grow with the "
                 "bytes?)",
                 file, what, 100 * link.eff);
    link.source = fmt::format("{} ({} points)", file, pts.size());
    notes.push_back(
        fmt::format("{}: {} latency {:.1f} us, {:.0f}% of the link", file, what, link.latency_us, 100 * link.eff));
}

void calibrate_comm(Profile& p, const json& j, const Reader& r, const Hardware& hw, std::vector<std::string>& notes) {
    const json& pts = r.array(j, "points", "top level");
    std::map<std::string, std::vector<LinkPoint>> by;  // "nvlink dispatch" -> points
    for (size_t i = 0; i < pts.size(); ++i) {
        const std::string where = fmt::format("points[{}]", i);
        // `fanout bench comm` also times the padded `nccl` backend, the portable baseline; the
        // planner models the fast path a deployment would run, so only `nvlink` points fit NVLink.
        if (pts[i].contains("backend")) {
            FANOUT_CHECK(pts[i]["backend"].is_string(), "{}: {}.backend must be a string", r.file(), where);
            if (pts[i]["backend"].get<std::string>() != "nvlink") continue;
        }
        const double ep = r.count(pts[i], "ep", where, 2, 1 << 16);
        const double tokens = r.count(pts[i], "tokens_per_rank", where, 0, kMaxLen);
        std::string link = ep <= hw.gpus_per_node ? "nvlink" : "ib";
        if (pts[i].contains("link")) {
            FANOUT_CHECK(pts[i]["link"].is_string(), "{}: {}.link must be a string", r.file(), where);
            link = pts[i]["link"].get<std::string>();
            FANOUT_CHECK(link == "nvlink" || link == "ib", "{}: {}.link '{}' must be nvlink or ib", r.file(), where,
                         link);
        }
        const double per_node = std::min<double>(ep, hw.gpus_per_node);
        const double frac = link == "nvlink" ? (per_node - 1) / ep : (ep - per_node) / ep;
        const double copies = tokens * r.opt_count(pts[i], "topk", where, 1, 1024, v3::kTopK) * frac;
        const double hidden = r.opt_count(pts[i], "hidden", where, 1, kMaxDim, v3::kHidden);
        if (pts[i].contains("dispatch_us"))
            by[link + " dispatch"].push_back(
                {copies * (hidden + 4 * hidden / 128), r.time(pts[i], "dispatch_us", where)});
        if (pts[i].contains("combine_us"))
            by[link + " combine"].push_back({copies * 2 * hidden, r.time(pts[i], "combine_us", where)});
    }
    fit_link(p.dispatch_nvlink, by["nvlink dispatch"], hw.nvlink_bw, "NVLink dispatch", r.file(), notes);
    fit_link(p.combine_nvlink, by["nvlink combine"], hw.nvlink_bw, "NVLink combine", r.file(), notes);
    fit_link(p.dispatch_ib, by["ib dispatch"], hw.ib_bw, "IB dispatch", r.file(), notes);
    fit_link(p.combine_ib, by["ib combine"], hw.ib_bw, "IB combine", r.file(), notes);
}

void calibrate_mla(Profile& p, const json& j, const Reader& r, const Hardware& hw, std::vector<std::string>& notes) {
    note_gpu(j, r, hw, notes);
    const json& rows = r.array(j, "rows", "top level");
    // Rows over the FP8 cache ("cache": "fp8") make their own curve; the others (bf16, or no key in
    // files from before the FP8 rows) the BF16 cache's.
    std::vector<EfficiencyPoint> curve, fp8_curve;
    std::string effs, fp8_effs;
    for (size_t i = 0; i < rows.size(); ++i) {
        const std::string where = fmt::format("rows[{}]", i);
        const bool fp8 = rows[i].is_object() && rows[i].contains("cache") &&
                         gpu_kv_dtype(rows[i]["cache"], r.file(), where, "cache") == DType::kFP8E4M3;
        const double batch = r.count(rows[i], "batch", where, 1, kMaxDim);
        const double query = r.count(rows[i], "query_len", where, 1, kMaxDim);
        const double heads = r.count(rows[i], "heads", where, 1, kMaxDim);
        const double kv = r.count(rows[i], "kv_len", where, 1, kMaxLen);
        const double us = r.time(rows[i], "us", where);
        // The cost model's accounting: scores over 576 dims, values over 512.
        const double flops = 2 * batch * query * heads * kv * ((v3::kKvLora + v3::kRope) + v3::kKvLora);
        std::vector<EfficiencyPoint>& dst = fp8 ? fp8_curve : curve;
        std::string& list = fp8 ? fp8_effs : effs;
        dst.push_back({batch * query * heads, r.share(flops / (us * 1e-6) / hw.bf16_flops, where, "BF16 peak")});
        list += fmt::format("{}{:.0f}: {:.1f}%", list.empty() ? "" : ", ", batch, 100 * dst.back().eff);
    }
    if (curve.empty()) {
        notes.push_back(fmt::format("{}: no rows over the BF16 cache: attention kept", r.file()));
    } else {
        std::sort(curve.begin(), curve.end(), [](const auto& a, const auto& b) { return a.rows < b.rows; });
        p.attention_curve = curve;
        p.attention.source = fmt::format("measured curve from {} ({} points)", r.file(), curve.size());
        notes.push_back(
            fmt::format("{}: attention at a measured share of the BF16 peak, by batch (query {}, {} heads): {}",
                        r.file(), rows[0].value("query_len", 0), rows[0].value("heads", 0), effs));
    }
    // Both curves come from one file: a file without FP8 rows drops an earlier file's.
    if (!fp8_curve.empty()) {
        std::sort(fp8_curve.begin(), fp8_curve.end(), [](const auto& a, const auto& b) { return a.rows < b.rows; });
        notes.push_back(
            fmt::format("{}: attention over the FP8 KV cache at a measured share of the BF16 peak, by batch (query {}, "
                        "{} heads): {}",
                        r.file(), rows[0].value("query_len", 0), rows[0].value("heads", 0), fp8_effs));
    } else if (!p.attention_fp8_curve.empty()) {
        notes.push_back(fmt::format("{}: no rows over the FP8 cache: the earlier file's FP8 curve dropped", r.file()));
    }
    p.attention_fp8_curve = fp8_curve;
    // The MHA-form prefill rows (optional): efficiency by query tokens per request, single-request
    // points only at 128 heads (the planner's TP1 layer); the cost model's accounting (causal
    // pairs, 192 + 128 dims).
    if (!j.contains("prefill")) return;
    const json& pre = r.array(j, "prefill", "top level");
    std::map<double, EfficiencyPoint> by_tokens;
    for (size_t i = 0; i < pre.size(); ++i) {
        const std::string where = fmt::format("prefill[{}]", i);
        if (!pre[i].is_object() || !pre[i].contains("tokens_per_request")) continue;  // an older file's rows
        const double heads = r.count(pre[i], "heads", where, 1, kMaxDim);
        const double tokens = r.count(pre[i], "tokens_per_request", where, 1, kMaxLen);
        const double requests = r.opt_count(pre[i], "requests", where, 1, kMaxDim, 1);
        const double ctx = r.count(pre[i], "ctx_len_per_request", where, 1, kMaxLen), us = r.time(pre[i], "us", where);
        FANOUT_CHECK(ctx >= tokens, "{}: {} needs ctx_len_per_request >= tokens_per_request", r.file(), where);
        if (heads != v3::kHeads || requests != 1) continue;
        const double pairs = tokens * (ctx - tokens) + tokens * (tokens + 1) / 2;
        const double eff = r.share(2 * heads * pairs * (v3::kNope + v3::kRope + v3::kV) / (us * 1e-6) / hw.bf16_flops,
                                   where, "BF16 peak");
        auto [it, fresh] = by_tokens.try_emplace(tokens, EfficiencyPoint{tokens, eff});
        if (!fresh) it->second.eff = std::min(it->second.eff, eff);  // several contexts: the slower
    }
    if (by_tokens.empty()) return;
    p.mha_attention_curve.clear();
    std::string list;
    for (const auto& [tokens, pt] : by_tokens) {
        p.mha_attention_curve.push_back(pt);
        list += fmt::format("{}{:.0f}: {:.1f}%", list.empty() ? "" : ", ", tokens, 100 * pt.eff);
    }
    p.mha_attention.source = fmt::format("measured curve from {} ({} points)", r.file(), by_tokens.size());
    notes.push_back(fmt::format(
        "{}: MHA-form prefill attention at a measured share of the BF16 peak, by query tokens per request: {}",
        r.file(), list));
}

// Kernel classes a kernel benchmark runs as the very kernel the layer runs (the grouped GEMM, MLA):
// the layer calibration leaves them to those benchmarks.
bool layer_calibrates(const KernelCost& k) { return k.kind != "comm" && k.kind != "grouped" && k.kind != "attention"; }

void calibrate_layer(Profile& p, const std::string& file, const Hardware& hw, std::vector<std::string>& notes) {
    const auto points = read_layer_bench(file);
    int min_batch = std::numeric_limits<int>::max();
    for (const auto& m : points)
        if (!m.kernels.empty()) min_batch = std::min(min_batch, m.d.batch);
    if (min_batch == std::numeric_limits<int>::max()) {
        notes.push_back(fmt::format("{}: no per-kernel times; kernel costs unchanged", file));
        return;
    }
    Profile base = p;
    base.kernel_extra_us.clear();
    std::map<std::string, std::pair<double, int>> extra;  // name -> (Σ measured − model, points)
    double event_sum = 0;
    int n_points = 0;
    for (const auto& m : points) {
        if (m.d.batch != min_batch || m.kernels.empty()) continue;
        // With "marked_total_us" the per-kernel times carry the events between kernels and
        // total_us does not: each kernel's share of the difference is taken off, so the model
        // predicts the layer without events.
        const double event_us = std::isnan(m.marked_total_us) || std::isnan(m.total_us)
                                    ? 0.0
                                    : std::max(0.0, (m.marked_total_us - m.total_us) / m.kernels.size());
        event_sum += event_us;
        ++n_points;
        const double batch = m.d.schedule == Schedule::kMicroBatch ? m.d.batch / 2.0 : m.d.batch;  // rows per half
        for (const auto& k : layer_kernels(m.d, hw, base, batch, m.dense)) {
            const auto it = m.kernels.find(k.name);
            if (it == m.kernels.end() || !layer_calibrates(k)) continue;
            auto& acc = extra[k.name];
            acc.first += it->second - event_us - k.us;
            acc.second += 1;
        }
    }
    if (extra.empty()) notes.push_back(fmt::format("{}: no kernel the model names; kernel costs unchanged", file));
    std::string list;
    for (const auto& [name, acc] : extra) {
        p.kernel_extra_us[name] = acc.first / acc.second;
        list += fmt::format("{}{} {:+.1f}", list.empty() ? "" : ", ", name, p.kernel_extra_us[name]);
    }
    if (!extra.empty())
        notes.push_back(fmt::format(
            "{}: per-kernel extra us over the kernel model, from the {} batch-{} points only ({}): {}", file, n_points,
            min_batch,
            event_sum > 0 ? fmt::format("events between kernels, {:.1f} us each, taken off", event_sum / n_points)
                          : "no marked_total_us: events between kernels included, as in total_us",
            list));
}

}  // namespace

std::vector<LayerMeasurement> read_layer_bench(const std::string& path) {
    const json j = load(path);
    const Reader r(path);
    FANOUT_CHECK(j.is_object() && j.contains("benchmark") && j["benchmark"] == "layer",
                 "{}: not a `bench layer` JSON ('benchmark' must be "
                 "\"layer\")",
                 path);
    std::vector<LayerMeasurement> out;
    const json& pts = r.array(j, "points", "top level");
    for (size_t i = 0; i < pts.size(); ++i) {
        const std::string where = fmt::format("points[{}]", i);
        const json& q = pts[i];
        LayerMeasurement m;
        const std::string layer = q.contains("layer") && q["layer"].is_string() ? q["layer"].get<std::string>() : "";
        m.d.ep = int(r.opt_count(q, "ep", where, 0, 1 << 16, 1));
        // A dense layer (DeepSeek-V3's first 3) has no experts: "ep" 0 or "layer": "dense".
        m.dense = layer == "dense" || m.d.ep == 0;
        if (m.dense) m.d.ep = 1;
        m.comm_included = !(q.contains("communication") && q["communication"] == "not included");
        m.d.tp = int(r.opt_count(q, "tp", where, 1, 1 << 16, 1));
        m.d.batch = int(r.count(q, "batch", where, 1, kMaxDim));
        m.d.draft_tokens = int(r.opt_count(q, "query_len", where, 1, 1 << 16, 2)) - 1;
        m.d.kv_len = int(r.opt_count(q, "kv_len", where, 0, kMaxLen, 5000));
        if (q.contains("kv_dtype")) m.d.kv_dtype = gpu_kv_dtype(q["kv_dtype"], path, where, "kv_dtype");
        m.d.schedule = Schedule::kNoOverlap;
        // The form attention ran in; files before the MHA form was benchmarked ran the absorbed one.
        m.d.attention = AttentionForm::kAbsorbed;
        if (q.contains("attention_form")) {
            FANOUT_CHECK(
                q["attention_form"].is_string() && (q["attention_form"] == "mha" || q["attention_form"] == "absorbed"),
                "{}: {}.attention_form must be \"mha\" or \"absorbed\"", path, where);
            if (q["attention_form"] == "mha") m.d.attention = AttentionForm::kMha;
        }
        if (q.contains("schedule")) {
            FANOUT_CHECK(q["schedule"].is_string(), "{}: {}.schedule must be a string", path, where);
            m.d.schedule = parse_schedule(q["schedule"].get<std::string>());
        }
        if (q.contains("total_us")) m.total_us = r.time(q, "total_us", where);
        if (q.contains("marked_total_us")) m.marked_total_us = r.time(q, "marked_total_us", where);
        if (q.contains("kernels")) {
            const json& ks = q["kernels"];
            FANOUT_CHECK(ks.is_object(), "{}: {}.kernels must be an object of name: us", path, where);
            for (const auto& [name, v] : ks.items()) {
                // The runner names a dense layer's MLP as the shared expert's; the model says dense_*.
                std::string model_name = name;
                if (m.dense && name.rfind("shared_", 0) == 0) model_name = "dense_" + name.substr(7);
                m.kernels[model_name] = r.time(ks, name, where + ".kernels");
            }
        }
        FANOUT_CHECK(std::isfinite(m.total_us) || !m.kernels.empty(), "{}: {} has neither total_us nor kernels", path,
                     where);
        try {  // the deployment the point ran as (EP dividing the experts, TP dividing EP, ...); its
               // query may be a prefill chunk's, past the planner's draft tokens
            Deployment ran = m.d;
            ran.draft_tokens = 0;
            validate(ran, h200_sxm());
        } catch (const Error& e) {
            FANOUT_FAIL("{}: {}: {}", path, where, e.what());
        }
        out.push_back(std::move(m));
    }
    return out;
}

Profile calibrate(const Profile& base, const std::vector<std::string>& files, const Hardware& hw,
                  std::vector<std::string>* notes) {
    Profile p = base;
    std::vector<std::string> out;
    for (const auto& file : files) {
        const json j = load(file);
        const Reader r(file);
        FANOUT_CHECK(j.is_object() && j.contains("benchmark") && j["benchmark"].is_string(),
                     "{}: no string 'benchmark' key (expected \"kernels\", \"mla\", \"layer\" or \"comm\")", file);
        const std::string kind = j["benchmark"].get<std::string>();
        if (kind == "kernels")
            calibrate_kernels(p, j, r, hw, out);
        else if (kind == "comm")
            calibrate_comm(p, j, r, hw, out);
        else if (kind == "layer")
            calibrate_layer(p, file, hw, out);
        else if (kind == "mla")
            calibrate_mla(p, j, r, hw, out);
        else
            FANOUT_FAIL("{}: benchmark '{}' cannot calibrate the planner (expected kernels, mla, layer or comm)", file,
                        kind);
    }
    p.notes.insert(p.notes.end(), out.begin(), out.end());
    if (notes) notes->insert(notes->end(), out.begin(), out.end());
    return p;
}

}  // namespace fanout::plan
