// The nanogpt program's subcommands. Each cli/cmd_<name>.cpp adds one subcommand to the app; its
// callback does the work through the libraries and throws on error. main() reports errors.
#pragma once

#include <CLI/CLI.hpp>

namespace nanogpt::cli {

void add_prepare_command(CLI::App& app);    // cmd_prepare.cpp
void add_train_command(CLI::App& app);      // cmd_train.cpp
void add_sample_command(CLI::App& app);     // cmd_sample.cpp
void add_attention_command(CLI::App& app);  // cmd_attention.cpp
void add_plot_command(CLI::App& app);       // cmd_plot.cpp
void add_export_command(CLI::App& app);     // cmd_export.cpp
void add_bench_command(CLI::App& app);      // cmd_bench.cpp
void add_import_command(CLI::App& app);     // cmd_import.cpp
void add_serve_command(CLI::App& app);      // cmd_serve.cpp

/// Exit status a subcommand wants when it ends without an error (e.g. 130 after Ctrl-C).
int& exit_status();

/// For `train` and `bench`: unless GOMP_SPINCOUNT or OMP_WAIT_POLICY is set, sets a short OpenMP spin
/// (GOMP_SPINCOUNT=10000) and restarts the program with it (openmp_env.cpp says why); otherwise returns.
void restart_with_short_openmp_spin(int argc, char** argv);

}  // namespace nanogpt::cli
