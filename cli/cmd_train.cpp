// nanogpt train (placeholder until its issue lands).
#include "cli/commands.h"

namespace nanogpt::cli {
void add_train_command(CLI::App& app) { app.add_subcommand("train", "(not built yet)"); }
}  // namespace nanogpt::cli
