// How long LibTorch's OpenMP threads spin before they sleep (see commands.h).
//
// libgomp spins a waiting thread for GOMP_SPINCOUNT iterations (300,000 by default: hundreds of
// microseconds) before it sleeps. On a quiet machine that saves a wake-up at each of the hundreds of
// parallel regions in a step. On a busy one (another program on one of the cores) it is ruinous: a
// thread that is done spins on its core while the thread it waits for sits in the run queue for
// that core. Measured on the 2-core CPU preset with two other processes running: 1,972 ms/iter by
// default, 51 ms with a spin count of 1,000; on the quiet machine 20.6-20.9 ms either way
// (BENCHMARKS.md). libgomp reads the variable once, when it is loaded, before main() runs (and the C
// library resets the environment after the program's own .preinit_array functions), so the program
// sets it and starts itself again: the same process (exec keeps the pid, so torchrun and signals
// are unaffected), about 0.2 s more start-up, paid by the long-running commands only.
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "cli/commands.h"

namespace nanogpt::cli {

void restart_with_short_openmp_spin(int argc, char** argv) {
  if (argc < 2 || (std::strcmp(argv[1], "train") != 0 && std::strcmp(argv[1], "bench") != 0)) return;
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY")) return;  // the user's, or already set
  if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: then go on with libgomp's default
}

}  // namespace nanogpt::cli
