// nanogpt: prepare data, train, sample, look inside, export, import and benchmark a character-level GPT.
// Thin: parse the subcommand, run it, turn any error into one clear line and a non-zero exit.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "runtime/device.h"
#include "runtime/environment.h"
#include "runtime/host_memory.h"

namespace nanogpt::cli {
int& exit_status() {
  static int status = 0;
  return status;
}

namespace {

// Ends the program without the static destructors of the libraries it loaded: LibTorch's take each
// of its thousands of operators out of the dispatcher again, 50-80 ms at the end of every run, to
// tidy memory the kernel frees anyway (a 1-token `sample` of the CPU-preset model, 30 alternating
// runs: median 0.273 -> 0.225 s). Nothing of ours needs them: every object of ours lives in the
// subcommand's callback, so by now each file is written and closed and each thread joined. What is
// left is buffered output, flushed here; failing to write it (a full disk under `> file`) is an
// error, not a silent exit 0. Sanitizer builds exit as usual: LeakSanitizer checks at exit.
[[noreturn]] void exit_now(int status) {
  std::cout.flush();
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {  // now, or in an earlier flush (CLI11's std::endl, a sample's)
    std::fprintf(stderr, "error: could not write all of the output: check the disk or where it goes\n");
    if (status == 0) status = 1;
  }
  std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  std::exit(status);
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  std::exit(status);
#endif
#endif
  ::_exit(status);
}

}  // namespace
}  // namespace nanogpt::cli

int main(int argc, char** argv) {
  using namespace nanogpt::cli;
  restart_with_short_openmp_spin(argc, argv);  // first: nothing has happened yet that a restart would redo
  nanogpt::runtime::set_nccl_defaults();       // before any thread: setenv is not thread-safe
  nanogpt::runtime::retain_freed_memory();  // before any tensor: large activations are reused, not re-faulted
  CLI::App app{"nanogpt: train and sample character-level GPTs (nanoGPT, natively)"};
  app.require_subcommand(1);
  // Names the CUDA plugin a GPU run would load, so that an installed program can be checked.
  app.set_version_flag("--version", [] {
    using namespace nanogpt::runtime;
    return "nanogpt, LibTorch " + torch_version() +
           (cuda_compiled() ? " with CUDA (plugin " + cuda_plugin_path() + ")" : " (CPU only)");
  });
  add_prepare_command(app);
  add_train_command(app);
  add_sample_command(app);
  add_attention_command(app);
  add_plot_command(app);
  add_export_command(app);
  add_import_command(app);
  add_bench_command(app);
  add_serve_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    exit_now(app.exit(e));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    exit_now(1);
  } catch (...) {
    std::fprintf(stderr, "error: unknown failure\n");
    exit_now(1);
  }
  exit_now(exit_status());
}
