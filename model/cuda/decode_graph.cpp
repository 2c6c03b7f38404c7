// One CUDA graph per batch-size bucket of the decode step (see decode_graph.h).
#include "model/cuda/decode_graph.h"


#include <map>
#include <stdexcept>

#include "runtime/cuda/training.h"

namespace nanogpt::model::cuda {
namespace {

class DecodeGraphs final : public StepGraphs {
 public:
  void capture(int64_t bucket, const std::function<void()>& step) override {
    // Every bucket in the first one's pool: their intermediates are freed by the end of each capture,
    // and the replays never overlap (one stream, one at a time).
    runtime::CapturedGraph* pool = graphs_.empty() ? nullptr : graphs_.begin()->second.get();
    graphs_[bucket] = runtime::cuda::capture_graph(step, pool);
  }
  void replay(int64_t bucket) override {
    auto it = graphs_.find(bucket);
    if (it == graphs_.end()) throw std::logic_error("[sample] no decode graph for a batch of " + std::to_string(bucket));
    it->second->replay();
  }

 private:
  std::map<int64_t, std::unique_ptr<runtime::CapturedGraph>> graphs_;
};

}  // namespace

std::unique_ptr<StepGraphs> decode_graphs() { return std::make_unique<DecodeGraphs>(); }

}  // namespace nanogpt::model::cuda
