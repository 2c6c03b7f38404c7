// Tools over the library: the benchmark behind `nanogpt bench`.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "tools/bench.h"

using namespace nanogpt;

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
