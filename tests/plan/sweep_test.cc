// `fanout plan sweep` and `recommend` as library calls: the grid, the frontiers, the files and the
// figure (gnuplot-nox is installed by scripts/install_deps.sh), and the recommender's choices and
// errors.
#include "fanout/plan/sweep.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace fanout::plan {
namespace {

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

class PlanSweep : public testing::TempDirTest {};

TEST_F(PlanSweep, GridFrontiersFilesAndFigure) {
    const SweepOptions o;
    const auto points = run_sweep(o, default_profile());
    // 5 EP × 4 TP × 8 batches × 2 schedules, less microbatch at batch 1.
    EXPECT_EQ(points.size(), 5u * 4 * (8 + 7));
    for (int ep : o.eps) {
        const auto f = pareto_frontier(points, ep);
        ASSERT_GE(f.size(), 3u) << "EP" << ep;
        for (size_t i = 1; i < f.size(); ++i) {  // fastest first, throughput rising
            EXPECT_LT(f[i].speed, f[i - 1].speed);
            EXPECT_GT(f[i].throughput_node, f[i - 1].throughput_node);
        }
        for (const auto& p : points) {  // nothing fitting beats the frontier on both axes
            if (p.d.ep != ep || !p.fits) continue;
            for (const auto& q : f) EXPECT_FALSE(p.speed > q.speed && p.throughput_node > q.throughput_node);
        }
    }
    EXPECT_EQ(points.front().hardware, "H200 SXM");  // the seed's EP8 node
    EXPECT_EQ(points.back().hardware, "H100 SXM");   // and its multi-node EP128

    write_sweep_csv(path("sweep.csv"), points);
    write_sweep_json(path("sweep.json"), o, points);
    std::istringstream csv(slurp(path("sweep.csv")));
    std::string line;
    std::getline(csv, line);
    EXPECT_EQ(line.rfind("hardware,ep,dp,tp,batch,", 0), 0u);
    size_t rows = 0;
    while (std::getline(csv, line)) ++rows;
    EXPECT_EQ(rows, points.size());
    const auto j = nlohmann::json::parse(slurp(path("sweep.json")));
    EXPECT_EQ(j["points"].size(), points.size());
    EXPECT_EQ(j["frontiers"].size(), 5u);
    EXPECT_EQ(j["frontiers"]["EP128"].size(), pareto_frontier(points, 128).size());

    const std::string why = write_pareto_figure(dir_, points, o.eps);
    ASSERT_EQ(why, "") << "install gnuplot-nox (scripts/install_deps.sh)";
    const std::string png = slurp(path("pareto.png")), svg = slurp(path("pareto.svg"));
    ASSERT_GT(png.size(), 1000u);
    EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    for (int ep : o.eps) EXPECT_NE(svg.find(fmt::format(">EP{}<", ep)), std::string::npos) << "legend EP" << ep;
    EXPECT_NE(svg.find("throughput per machine"), std::string::npos);
    EXPECT_NE(slurp(path("pareto.gp")).find("set logscale y"), std::string::npos);
    EXPECT_TRUE(std::filesystem::exists(path("frontier_ep128.dat")));
}

RecommendOptions h200_options(int gpus, double min_speed) {
    RecommendOptions o;
    o.gpus = gpus;
    o.min_speed = min_speed;
    o.hardware = "h200";
    return o;
}

TEST(PlanRecommend, PicksTheMostThroughputAtTheSpeedFloor) {
    RecommendOptions o = h200_options(16, 50);
    const auto best = recommend(o, default_profile());
    ASSERT_GE(best.size(), 2u);
    for (size_t i = 0; i < best.size(); ++i) {
        EXPECT_GE(best[i].speed, 50.0);
        EXPECT_TRUE(best[i].fits);
        EXPECT_EQ(16 % best[i].d.ep, 0);
        if (i) {
            EXPECT_LE(best[i].throughput_gpu, best[0].throughput_gpu);
        }
    }
    // A higher floor costs throughput.
    o.min_speed = 100;
    EXPECT_LT(recommend(o, default_profile())[0].throughput_gpu, best[0].throughput_gpu);
}

// With FP8 KV entries the layouts that memory capped (EP8 on one node at 5,000 tokens) fit larger
// batches, and every recommended deployment carries the cache's dtype into its prediction.
TEST(PlanRecommend, Fp8KvCacheLiftsTheMemoryCap) {
    RecommendOptions o = h200_options(8, 15);
    const auto bf16 = recommend(o, default_profile());
    o.kv_dtype = DType::kFP8E4M3;
    const auto fp8 = recommend(o, default_profile());
    ASSERT_FALSE(bf16.empty());
    ASSERT_FALSE(fp8.empty());
    for (const auto& p : fp8) EXPECT_EQ(p.d.kv_dtype, DType::kFP8E4M3);
    EXPECT_GT(fp8[0].max_batch, bf16[0].max_batch);
    EXPECT_GT(fp8[0].throughput_gpu, bf16[0].throughput_gpu);
}

TEST(PlanRecommend, BadRequestsAreClearErrors) {
    RecommendOptions o;
    o.gpus = 12;
    o.min_speed = 10;
    EXPECT_NE(
        testing::error_of([&] { recommend(o, default_profile()); }).find("--gpus 12 is not a whole number of 8-GPU"),
        std::string::npos);
    o.gpus = 8;
    o.hardware = "b200";
    EXPECT_NE(testing::error_of([&] { recommend(o, default_profile()); }).find("unknown hardware preset 'b200'"),
              std::string::npos);
    o.hardware = "h200";
    o.min_speed = 5000;
    EXPECT_NE(testing::error_of([&] { recommend(o, default_profile()); }).find("reaches 5000 tok/s"),
              std::string::npos);
    o.hardware = "h100";
    o.min_speed = 10;  // 8 H100s cannot hold the model
    EXPECT_NE(testing::error_of([&] { recommend(o, default_profile()); }).find("nothing fits 8 H100 SXM GPUs"),
              std::string::npos);
}

}  // namespace
}  // namespace fanout::plan
