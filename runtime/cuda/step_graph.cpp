// A training step as CUDA graphs (see runtime/cuda_plugin.h, capture_graph). Captured on a side
// stream, as LibTorch requires (the legacy default stream cannot capture), after one eager run of
// the same work there, which leaves the lazily made state (cuBLAS workspaces, autograd's streams)
// in place before the capture records anything.
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "runtime/cuda/training.h"

namespace nanogpt::runtime::cuda {
namespace {

class Graph final : public CapturedGraph {
 public:
  void replay() override { graph.replay(); }
  at::cuda::CUDAGraph graph;
};

// Restores autocast's weight cache as it was: a cast cached during capture would be a tensor of
// the graph's pool, read by later eager code after the graph rewrote it.
class NoAutocastCache {
 public:
  NoAutocastCache() : was_(at::autocast::is_autocast_cache_enabled()) { at::autocast::set_autocast_cache_enabled(false); }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(was_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool was_;
};

}  // namespace

std::unique_ptr<CapturedGraph> capture_graph(const std::function<void()>& work, CapturedGraph* share_pool_with) {
  auto captured = std::make_unique<Graph>();
  const auto caller = at::cuda::getCurrentCUDAStream();
  auto side = at::cuda::getStreamFromPool(/*isHighPriority=*/false, caller.device_index());
  at::cuda::CUDAEvent queued;  // the side stream starts after everything the caller queued
  queued.record(caller);
  queued.block(side);
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    NoAutocastCache no_cache;
    work();  // eager, for real
    decltype(captured->graph.pool()) pool{0, 0};  // {0, 0}: a pool of its own
    if (share_pool_with) pool = static_cast<Graph*>(share_pool_with)->graph.pool();
    captured->graph.capture_begin(pool);
    try {
      work();  // recorded, not run
    } catch (...) {
      try {
        captured->graph.capture_end();  // ends the stream's capture mode; the graph is dropped
      } catch (...) {
      }
      throw;
    }
    captured->graph.capture_end();
  }
  at::cuda::CUDAEvent done;  // the caller's later work starts after the warm-up run
  done.record(side);
  done.block(caller);
  return captured;
}

void set_sync_debug_mode(int mode) {
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(mode));
}

}  // namespace nanogpt::runtime::cuda
