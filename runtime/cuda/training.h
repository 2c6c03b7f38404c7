// The plugin's training entries (runtime/cuda_plugin.h's "training" block): CUDA graphs of a step
// (step_graph.cpp), the Kineto profile of a few steps (gpu_profile.cpp), and c10's sync debug mode.
#pragma once

#include <functional>
#include <memory>

#include "runtime/cuda_plugin.h"

namespace nanogpt::runtime::cuda {

std::unique_ptr<CapturedGraph> capture_graph(const std::function<void()>& work, CapturedGraph* share_pool_with);
GpuProfile profile(const std::function<void()>& work);
void set_sync_debug_mode(int mode);

}  // namespace nanogpt::runtime::cuda
