// Keep freed CPU memory for reuse (see host_memory.h).
#include "runtime/host_memory.h"

#include <dlfcn.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace nanogpt::runtime {
namespace {

bool retained = false;

// tcmalloc exports its malloc also as tc_malloc: the same function when it is the process's malloc.
bool malloc_is_tcmalloc() {
  void* tc = dlsym(RTLD_DEFAULT, "tc_malloc");
  return tc != nullptr && tc == dlsym(RTLD_DEFAULT, "malloc");
}

}  // namespace

bool retain_freed_memory() {
  if (malloc_is_tcmalloc()) return false;
#if defined(__GLIBC__)
  const bool no_mmap = mallopt(M_MMAP_MAX, 0) == 1;               // large blocks from the heap too
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;   // keep up to 1 GiB free at the top
  retained = no_mmap && no_trim;
#endif
  return retained;
}

std::string allocator_name() {
  if (malloc_is_tcmalloc()) return "tcmalloc";
  return retained ? "glibc (heap kept)" : "system";
}

}  // namespace nanogpt::runtime
