// nanogpt sample (placeholder until its issue lands).
#include "cli/commands.h"

namespace nanogpt::cli {
void add_sample_command(CLI::App& app) { app.add_subcommand("sample", "(not built yet)"); }
}  // namespace nanogpt::cli
