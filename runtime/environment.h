// The process environment the program sets for the libraries it loads. setenv is not thread-safe
// (a thread reading the environment while it grows may read freed memory), so these run first
// thing in main, before LibTorch, OpenMP or any thread of ours starts; nowhere else changes it.
#pragma once

namespace nanogpt::runtime {

/// LibTorch's NCCL settings for multi-GPU training, unless the user set them:
/// TORCH_NCCL_BLOCKING_WAIT=1 and TORCH_NCCL_ASYNC_ERROR_HANDLING=0. With LibTorch's defaults
/// wait() only orders the current stream after the collective, and failures are left to a
/// watchdog thread that kills the process with a stack dump; a blocking wait instead returns when
/// the all-reduce has finished, so the time spent in it is measured truly, and throws when it fails
/// or passes the timeout: train/distributed.h's one-line "lost rank N". With no asynchronous
/// handling the watchdog does not race it. ProcessGroupNCCL reads them when a group is made.
void set_nccl_defaults();

}  // namespace nanogpt::runtime
