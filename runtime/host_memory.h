// How the process gets memory for CPU tensors. LibTorch's CPU allocator calls posix_memalign. A
// training step allocates and frees dozens of 12-50 MB activations of the same sizes every step.
//  - glibc as configured by default serves blocks above its mmap threshold (at most 32 MiB) with a
//    fresh mmap unmapped again on free: each activation came back as new pages, zero-filled by the
//    kernel on first touch (a 16384x1536 bf16 GEMM output 52 ms -> 24 ms once its memory is reused).
//  - glibc told to keep everything in its heap reuses the pages, but its free lists fragment: at
//    the full preset the resident peak was 2.6 GB for 1.3 GB of live tensors.
//  - tcmalloc (gperftools, Debian's libtcmalloc-minimal4), linked into the nanogpt program when
//    found, keeps freed pages for reuse in size classes: the peak is the live peak (1.63 GB) at
//    glibc-heap speed. jemalloc and mimalloc gave the same peak at 1.6x the step time (docs/perf-log.md).
#pragma once

#include <string>

namespace nanogpt::runtime {

/// Makes freed CPU memory stay in the process for reuse. Under tcmalloc that is what it does
/// already: nothing to change. Under glibc: large blocks come from the heap instead of
/// per-allocation mmaps, and the heap is not trimmed after each free; the resident size stays at
/// the peak (as with PyTorch's caching CUDA allocator). Call once, early, before threads start.
/// Returns whether it changed anything.
bool retain_freed_memory();

/// "tcmalloc" when malloc is tcmalloc's, "glibc (heap kept)" after retain_freed_memory under glibc,
/// else "system".
std::string allocator_name();

}  // namespace nanogpt::runtime
