// What the GPU did during a few training steps (see runtime/cuda_plugin.h, profile): LibTorch's
// Kineto profiler with CUDA activities, reduced to GPU busy time against wall time, kernel
// launches, and the time of each kernel name.
#include <torch/csrc/autograd/profiler_kineto.h>

#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "runtime/cuda/training.h"

namespace nanogpt::runtime::cuda {

GpuProfile profile(const std::function<void()>& work) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const prof::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  at::cuda::device_synchronize();
  prof::enableProfiler(config, activities);
  const auto t0 = std::chrono::steady_clock::now();
  work();
  at::cuda::device_synchronize();
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto result = prof::disableProfiler();

  GpuProfile p;
  p.wall_ms = wall_ms;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [start, end) ns of everything the GPU ran
  std::map<std::string, GpuProfile::Kernel> kernels;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA || e.durationNs() == 0) continue;
    spans.emplace_back(e.startNs(), e.endNs());
    const std::string name = e.name();
    if (name.rfind("Memcpy", 0) == 0 || name.rfind("Memset", 0) == 0) continue;
    auto& k = kernels[name];
    k.name = name;
    ++k.calls;
    k.total_ms += static_cast<double>(e.durationNs()) / 1e6;
    ++p.kernels;
  }
  std::sort(spans.begin(), spans.end());
  uint64_t busy = 0, covered_to = 0;
  for (const auto& [start, end] : spans) {  // the union of the intervals: overlapping kernels count once
    if (end <= covered_to) continue;
    busy += end - std::max(start, covered_to);
    covered_to = end;
  }
  p.gpu_busy_ms = static_cast<double>(busy) / 1e6;
  for (auto& [name, k] : kernels) p.by_time.push_back(std::move(k));
  std::sort(p.by_time.begin(), p.by_time.end(), [](const auto& a, const auto& b) { return a.total_ms > b.total_ms; });
  return p;
}

}  // namespace nanogpt::runtime::cuda
