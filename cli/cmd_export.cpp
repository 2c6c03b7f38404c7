// nanogpt export (placeholder until its issue lands).
#include "cli/commands.h"

namespace nanogpt::cli {
void add_export_command(CLI::App& app) { app.add_subcommand("export", "(not built yet)"); }
}  // namespace nanogpt::cli
