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
  if (!x.is_cuda()) {
    auto h = x + attn(ln_1(x), ctx);  // (B, T, C)
    return h + mlp(ln_2(h));          // (B, T, C)
  }
  // On a GPU the same block with each residual add fused with what follows it, one kernel each
  // (model/norm.h): attention's output arrives with its dropout applied, the MLP's gets it here.
  auto [h, n] = residual_add_norm(x, attn(ln_1(x), ctx), 0.0, ln_2.get());  // h, ln_2(h): (B, T, C)
  return residual_add_norm(h, mlp->project(n), mlp->dropout_p(), nullptr).first;  // h + dropout(mlp): (B, T, C)
}

}  // namespace nanogpt::model
