// How long LibTorch's OpenMP threads spin before they sleep (see commands.h).
//
// libgomp spins a waiting thread for GOMP_SPINCOUNT iterations (300,000 by default: hundreds of
// microseconds) before it sleeps. On a quiet machine that saves a wake-up at each of the hundreds of
// parallel regions in a step. On a busy one (another program on one of the cores) it is ruinous: a
// thread that is done spins on its core while the thread it waits for sits in the run queue for
// that core. Measured on the 2-core CPU preset with two other processes running: 1,972 ms/iter by
// default, 51 ms with a spin count of 1,000; on the quiet machine 20.6-20.9 ms either way
// (docs/perf-log.md). libgomp reads the variable once, when it is loaded, before main() runs (and the C
// library resets the environment after the program's own .preinit_array functions), so the program
// sets it and starts itself again: the same process (exec keeps the pid, so torchrun and signals
// are unaffected), about 0.2 s more start-up, paid by the long-running commands only.
//
// The count was 1,000 until an Intel Xeon VM (family 6 model 207) trained the CPU preset at 111
// ms/iter with it against 37 with the default, fp32, quiet machine: there a sleeping thread halts
// its virtual CPU, and every wake-up is a trip through the hypervisor. 10,000 ran 37.3-38.7 there
// (the default 37.1-38.2, 3,000 45.1-47.1), and beside one busy program 146 ms/iter against 83 for
// 1,000 and 359 for 100,000 (docs/perf-log.md).
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "cli/commands.h"

namespace nanogpt::cli {

void restart_with_short_openmp_spin(int argc, char** argv) {
  if (argc < 2 || (std::strcmp(argv[1], "train") != 0 && std::strcmp(argv[1], "bench") != 0)) return;
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY")) return;  // the user's, or already set
  if (setenv("GOMP_SPINCOUNT", "10000", 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: then go on with libgomp's default
}

}  // namespace nanogpt::cli
