// Keep freed CPU memory for reuse (see host_memory.h).
#include "runtime/host_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace nanogpt::runtime {

bool retain_freed_memory() {
#if defined(__GLIBC__)
  const bool no_mmap = mallopt(M_MMAP_MAX, 0) == 1;               // large blocks from the heap too
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;   // keep up to 1 GiB free at the top
  return no_mmap && no_trim;
#else
  return false;
#endif
}

}  // namespace nanogpt::runtime
