// How the process gets memory for CPU tensors. LibTorch's CPU allocator calls posix_memalign, and
// glibc serves every block above its mmap threshold (at most 32 MiB) with a fresh mmap that is
// unmapped again on free. A training step allocates and frees dozens of 25-100 MB activations, so
// each one came back as new pages, zero-filled by the kernel on first touch: page faults that cost
// more than the GEMM writing into them (measured: a 16384x1536 bf16 GEMM output 52 ms -> 24 ms once
// the memory is reused). See BENCHMARKS.md.
#pragma once

namespace nanogpt::runtime {

/// Makes freed CPU memory stay in the process for reuse: large blocks come from the heap instead of
/// per-allocation mmaps, and the heap is not trimmed after each free. The resident size stays at
/// the peak (as with PyTorch's caching CUDA allocator). Call once, early, before threads start.
/// A no-op outside glibc. Returns whether it changed anything.
bool retain_freed_memory();

}  // namespace nanogpt::runtime
