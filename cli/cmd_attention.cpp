// nanogpt attention (placeholder until its issue lands).
#include "cli/commands.h"

namespace nanogpt::cli {
void add_attention_command(CLI::App& app) { app.add_subcommand("attention", "(not built yet)"); }
}  // namespace nanogpt::cli
