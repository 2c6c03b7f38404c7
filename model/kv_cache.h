// KVCache: the keys and values of every layer for the tokens seen so far, so that generating one
// more token costs one position's work instead of re-running the whole context.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace nanogpt::model {

struct KVCache {
  std::vector<torch::Tensor> k;  // per layer (B, nkv, T_cached, hs), undefined while empty
  std::vector<torch::Tensor> v;  // per layer (B, nkv, T_cached, hs)

  int64_t length() const { return k.empty() || !k[0].defined() ? 0 : k[0].size(2); }
  void clear() {
    for (auto& t : k) t = torch::Tensor();
    for (auto& t : v) t = torch::Tensor();
  }
};

}  // namespace nanogpt::model
