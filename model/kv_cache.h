// KVCache: the keys and values of every layer for the tokens seen so far, so that generating one
// more token costs one position's work instead of re-running the whole context. Buffers are
// allocated once for block_size positions and filled in place: appending a token copies one
// position, not the whole cache. They are rings: position p lives in slot p % block_size, so a
// RoPE model can keep appending past block_size, each new token overwriting the oldest (attention
// does not care in which order the keys lie).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace nanogpt::model {

struct KVCache {
  std::vector<torch::Tensor> k;  // per layer (B, nkv, block_size, hs), undefined until first use
  std::vector<torch::Tensor> v;  // per layer (B, nkv, block_size, hs)
  int64_t len = 0;               // positions appended since clear(), the same in every layer

  int64_t length() const { return len; }
  /// Forgets the contents; the buffers are kept for reuse.
  void clear() { len = 0; }
};

}  // namespace nanogpt::model
