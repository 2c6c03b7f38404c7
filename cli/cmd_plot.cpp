// nanogpt plot (placeholder until its issue lands).
#include "cli/commands.h"

namespace nanogpt::cli {
void add_plot_command(CLI::App& app) { app.add_subcommand("plot", "(not built yet)"); }
}  // namespace nanogpt::cli
