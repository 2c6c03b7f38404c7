// nanogpt bench (placeholder until its issue lands).
#include "cli/commands.h"

namespace nanogpt::cli {
void add_bench_command(CLI::App& app) { app.add_subcommand("bench", "(not built yet)"); }
}  // namespace nanogpt::cli
