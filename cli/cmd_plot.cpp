// nanogpt plot: redraw a training run's curves (loss, learning rate, tokens/s) from its metrics.csv.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "viz/loss_plot.h"

namespace nanogpt::cli {

void add_plot_command(CLI::App& app) {
  struct Options {
    std::string out_dir = "out";
    std::string out;  // default: out_dir/loss.png
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("plot", "Draw the loss, learning-rate and tokens/s curves of a training run (out_dir/metrics.csv)");
  cmd->add_option("--out_dir", opts->out_dir, "Training folder holding metrics.csv")->capture_default_str();
  cmd->add_option("--out", opts->out, "Output PNG, or SVG when it ends in .svg (default: OUT_DIR/loss.png)");
  cmd->callback([opts] {
    const std::filesystem::path dir(opts->out_dir);
    const std::string out = opts->out.empty() ? (dir / "loss.png").string() : opts->out;
    viz::plot_loss_curves((dir / "metrics.csv").string(), out);
    std::printf("[plot] wrote %s\n", out.c_str());
  });
}

}  // namespace nanogpt::cli
