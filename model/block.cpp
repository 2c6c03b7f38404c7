// Block (see block.h).
#include "model/block.h"

namespace nanogpt::model {

BlockImpl::BlockImpl(const ModelConfig& config, Fill fill) {
  ln_1 = register_module("ln_1", Norm(config.norm, config.n_embd, config.bias, config.norm_eps));
  attn = register_module("attn", CausalSelfAttention(config, fill));
  ln_2 = register_module("ln_2", Norm(config.norm, config.n_embd, config.bias, config.norm_eps));
  mlp = register_module("mlp", MLP(config, fill));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const AttentionContext& ctx) {
  auto h = x + attn(ln_1(x), ctx);  // (B, T, C)
  return h + mlp(ln_2(h));          // (B, T, C)
}

}  // namespace nanogpt::model
