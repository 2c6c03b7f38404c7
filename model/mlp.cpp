// MLP (see mlp.h).
#include "model/mlp.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <tuple>

#include "model/fast/gelu.h"
#include "model/fast/linear.h"
#include "model/fast/relu_squared.h"

namespace nanogpt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// activation(h) · wᵀ keeping only h for backward, which recomputes the activation from it: the
// activation's output (H wide, 4 C) is the largest tensor a block would otherwise keep for backward,
// 50 MB per layer at the full preset in bf16, and recomputing it is one elementwise pass. The product
// runs in h's dtype (w rounded to it, as autocast's linear would); on the CPU, for fp32 master
// weights, it comes out in fp32 like dense()'s Result::kWide, since it joins the fp32 residual
// stream, and dw is summed in fp32 (mm_to_float: without a bf16 rounding where MKL's bf16 GEMM is fast). CUDA keeps h's dtype.
struct ProjectActivation : public torch::autograd::Function<ProjectActivation> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const std::string& kind) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // dtypes are the caller's
    auto w_low = w.to(h.scalar_type());  // (C, H)
    ctx->save_for_backward({h, w_low});
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    auto a = mlp_activation(kind, h);  // (B, T, H)
    if (w.scalar_type() == h.scalar_type() || !h.device().is_cpu()) return dense(a, w_low);  // (B, T, C) in h's dtype
    auto sizes = a.sizes().vec();
    sizes.back() = w.size(0);
    return mm_to_float(a.reshape({-1, a.size(-1)}), w_low.t()).to(w.scalar_type()).view(sizes);  // (B, T, C)
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &w_low = saved[1];
    const auto kind = ctx->saved_data["kind"].toStringRef();
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    auto dy = grads[0].to(h.scalar_type());                              // (B, T, C)
    auto dy2 = dy.reshape({-1, dy.size(-1)});                            // (B*T, C)
    auto da = dy.matmul(w_low);  // (B, T, H): the gradient at the activation's output
    torch::Tensor a, dh;         // the activation (recomputed) and the gradient at h
    if (kind == "gelu") {
      std::tie(a, dh) = fast_gelu_backward(h, da);  // one pass over h
    } else if (kind == "relu2") {
      std::tie(a, dh) = fast_relu_squared_backward(h, da);  // one pass over h
    } else {
      torch::AutoGradMode grad_on(true);
      auto h_again = h.detach().requires_grad_(true);
      a = mlp_activation(kind, h_again);                    // (B, T, H), recomputed
      dh = torch::autograd::grad({a}, {h_again}, {da})[0];  // through the activation
    }
    auto dw = mm_into(dy2.t(), a.detach().reshape({-1, a.size(-1)}), w_dtype);  // (C, H)
    return {dh, dw, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor mlp_activation(const std::string& kind, const torch::Tensor& h) {
  if (kind == "gelu") return fast_gelu(h);  // exact (erf) GELU like nanoGPT, its slope kept for backward
  if (kind == "gelu_tanh") return torch::gelu(h, "tanh");  // GPT-2's approximation ("gelu_new")
  if (kind == "relu2") return fast_relu_squared(h);
  auto gate_up = h.chunk(2, -1);  // swiglu
  return torch::silu(gate_up[0]) * gate_up[1];  // (B, T, H)
}

MLPImpl::MLPImpl(const ModelConfig& config, Fill fill) : activation_(config.mlp) {
  const int64_t C = config.n_embd, H = config.mlp_hidden(), fc_out = activation_ == "swiglu" ? 2 * H : H;
  c_fc = register_module("c_fc", Linear(C, fc_out, config.bias, fill));
  c_proj = register_module("c_proj", Linear(H, C, config.bias, fill));
  dropout = register_module("dropout", Dropout(config.dropout));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) { return dropout(project(x)); }  // (B, T, C)

torch::Tensor MLPImpl::project(const torch::Tensor& x) {
  auto h = dense(x, c_fc->weight, c_fc->bias);  // (B, T, H), swiglu (B, T, 2H)
  torch::Tensor y;
  if (torch::GradMode::is_enabled() && is_training() && h.numel() >= kRecomputeMinValues) {
    // Training with a large activation: recomputed in backward instead of kept; c_proj computes in
    // h's dtype (bf16 under autocast, as autocast's linear would), its bias added after in fp32.
    y = ProjectActivation::apply(h, c_proj->weight, activation_);
    if (c_proj->bias.defined()) y = y + c_proj->bias.to(y.scalar_type());
  } else {
    y = dense(mlp_activation(activation_, h), c_proj->weight, c_proj->bias, Result::kWide);  // joins the residual
  }
  return y;  // (B, T, C)
}

}  // namespace nanogpt::model
