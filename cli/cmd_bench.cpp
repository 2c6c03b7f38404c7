// nanogpt bench [CONFIG] [--iters N] [--json FILE] [--key=value ...]: measure this machine.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "io/atomic_file.h"
#include "tools/bench.h"
#include "train/config.h"

namespace nanogpt::cli {

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Benchmark GEMMs, training steps and sampling for a config on this machine");
  auto config_path = std::make_shared<std::string>("configs/shakespeare_char_cpu.yaml");
  auto json_path = std::make_shared<std::string>();
  auto options = std::make_shared<tools::BenchOptions>();
  cmd->add_option("config", *config_path, "YAML config")->capture_default_str();
  cmd->add_option("--iters", options->iters, "Timed training steps")->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_option("--sample_tokens", options->sample_tokens, "Tokens per sampling measurement; 0 = skip")->capture_default_str();
  cmd->add_option("--sample_batch", options->sample_batch, "Samples in the batched measurement")->capture_default_str();
  cmd->add_option("--json", *json_path, "Also write the results as JSON to this file");
  cmd->add_option("--profile", options->profile_path,
                  "Profile 3 more training steps; write a Chrome trace (chrome://tracing) here; "
                  "summarise it with scripts/profile_summary.py");
  cmd->allow_extras();  // --key=value config overrides, e.g. --dtype=float32
  cmd->callback([cmd, config_path, json_path, options] {
    if (options->iters < 1 || options->warmup < 0 || options->sample_tokens < 0 || options->sample_batch < 1)
      throw std::invalid_argument("[bench] --iters must be >= 1, --warmup/--sample_tokens >= 0, --sample_batch >= 1");
    auto config = train::load_config(*config_path);
    train::apply_overrides(config, cmd->remaining());
    config.validate();
    const auto report = tools::run_bench(config, *options);
    std::fputs(report.table().c_str(), stdout);
    if (!json_path->empty()) io::write_bytes_atomically(*json_path, report.json(), "bench");
  });
}

}  // namespace nanogpt::cli
