// Tools over the library: the benchmark behind `nanogpt bench`.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "tools/bench.h"
#include "train/trainer.h"
#include "train_fixture.h"

using namespace nanogpt;
using namespace nanogpt::testing;

// The bench report is JSON for scripts: strings escaped, and a non-finite number (a diverged loss,
// an MFU without a measured peak) written as null, which JSON has, not nan, which it has not.
TEST(Bench, JsonReportIsValidJsonWithNullForNonFiniteNumbers) {
  tools::BenchReport report;
  report.torch_version = "2.11.0";
  report.device = "cpu";
  report.config_summary = "6L \"quoted\" \\ C=384\nnext";
  report.gemm.push_back({"square", "bf16", 2048, 2048, 2048, 123.5});
  report.final_loss = std::nan("");
  report.mfu = std::numeric_limits<double>::infinity();
  report.step_ms_median = 18.75;
  const auto json = nlohmann::json::parse(report.json());  // throws on invalid JSON
  EXPECT_EQ(json["model"], report.config_summary);
  EXPECT_TRUE(json["train"]["final_loss"].is_null());
  EXPECT_TRUE(json["train"]["mfu"].is_null());
  EXPECT_EQ(json["train"]["median_ms"], 18.75);
  EXPECT_EQ(json["gemm"][0]["shape"], "square");
  EXPECT_EQ(json["gemm"][0]["m"], 2048);
  EXPECT_EQ(json["gemm"][0]["gflops"], 123.5);
}

// `bench` times the step the config trains: the same model, batches and optimizer (Muon too), so
// after N steps at a constant learning rate its last loss is the trainer's loss at iteration N-1.
TEST(Bench, TimesTheStepTheTrainerRunsWithEitherOptimizer) {
  for (const std::string optimizer : {"adamw", "muon"}) {
    SCOPED_TRACE(optimizer);
    TempDir dir("bench_step_" + optimizer);
    auto c = tiny_config(dir.path);
    c.optimizer = optimizer;
    c.model.dropout = 0.0;
    c.decay_lr = false;  // bench steps at learning_rate
    c.max_iters = 4;
    c.eval_interval = 100;
    train::Trainer(c, true).run();
    const auto rows = metrics_rows(c.out_dir + "/metrics.csv");
    double trained = std::nan("");
    for (const auto& r : rows)
      if (r.split == "train" && r.iter == 3) trained = std::stod(r.loss);
    ASSERT_TRUE(std::isfinite(trained));
    tools::BenchOptions options;
    options.iters = 4;
    options.warmup = 0;
    options.sample_tokens = 0;
    const auto report = tools::run_bench(c, options);
    EXPECT_NEAR(report.final_loss, trained, 1e-4 * trained);
  }
}
