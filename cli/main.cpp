// nanogpt: prepare data, train, sample, look inside, export, import and benchmark a character-level GPT.
// Thin: parse the subcommand, run it, turn any error into one clear line and a non-zero exit.
#include <cstdio>
#include <exception>

#include <string>

#include "cli/commands.h"
#include "runtime/device.h"
#include "runtime/host_memory.h"

namespace nanogpt::cli {
int& exit_status() {
  static int status = 0;
  return status;
}
}  // namespace nanogpt::cli

int main(int argc, char** argv) {
  using namespace nanogpt::cli;
  restart_with_short_openmp_spin(argc, argv);  // first: nothing has happened yet that a restart would redo
  nanogpt::runtime::retain_freed_memory();  // before any tensor: large activations are reused, not re-faulted
  CLI::App app{"nanogpt: train and sample character-level GPTs (nanoGPT, natively)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("nanogpt, LibTorch ") + nanogpt::runtime::torch_version() +
                                        (nanogpt::runtime::cuda_compiled() ? " with CUDA" : " (CPU only)"));
  add_prepare_command(app);
  add_train_command(app);
  add_sample_command(app);
  add_attention_command(app);
  add_plot_command(app);
  add_export_command(app);
  add_import_command(app);
  add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "error: unknown failure\n");
    return 1;
  }
  return exit_status();
}
