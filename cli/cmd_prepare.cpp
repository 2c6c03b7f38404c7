// nanogpt prepare (placeholder until its issue lands).
#include "cli/commands.h"

namespace nanogpt::cli {
void add_prepare_command(CLI::App& app) { app.add_subcommand("prepare", "(not built yet)"); }
}  // namespace nanogpt::cli
