// Linear with a matrix-vector fast path and a one-node autocast path for CPU training (see linear.h).
#include "model/fast/linear.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace nanogpt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = x wᵀ + b computed as autocast's linear computes it on the CPU (x and w rounded to the autocast
// dtype, the product in it, b added in it), as one autograd node. Through LibTorch, autocast's linear
// records the weight's cast, a transpose, the input's reshape, the GEMM and the output's view: five
// nodes and their ~10 kernels' dispatch per layer, each way; at the CPU preset (17 linears, ~11 ms a
// step) that bookkeeping was about a tenth of the step. Backward: dx = dy w, dw = dyᵀ x (widened to
// w's fp32), db = the sum of dy over the rows, in fp32.
struct AutocastLinear : public torch::autograd::Function<AutocastLinear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, c10::ScalarType dtype) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // dtypes chosen here
    const int64_t in = x.size(-1), out = w.size(0);
    auto x2 = x.reshape({-1, in}).to(dtype);  // (N, in)
    auto w_low = w.to(dtype);                 // (out, in)
    const bool bias = b.numel() > 0;
    auto y = bias ? torch::addmm(b.to(dtype), x2, w_low.t()) : x2.mm(w_low.t());  // (N, out)
    ctx->save_for_backward({x2, w_low});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    ctx->saved_data["bias"] = bias;
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(b.scalar_type());
    auto sizes = x.sizes().vec();
    sizes.back() = out;
    return y.view(sizes);  // (..., out)
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const auto &x2 = saved[0], &w_low = saved[1];
    const auto as = [&](const char* key) { return static_cast<c10::ScalarType>(ctx->saved_data[key].toInt()); };
    auto dy = grads[0].reshape({-1, w_low.size(0)}).to(w_low.scalar_type());  // (N, out)
    auto dx = dy.mm(w_low).to(as("x_dtype"));                               // (N, in)
    auto dw = dy.t().mm(x2).to(as("w_dtype"));                              // (out, in)
    auto db = ctx->saved_data["bias"].toBool() ? dy.sum(0, false, torch::kFloat).to(as("b_dtype")) : torch::Tensor();
    auto sizes = grads[0].sizes().vec();
    sizes.back() = x2.size(1);
    return {dx.view(sizes), dw, db, torch::Tensor()};
  }
};

// No bias: custom functions take defined tensors only, so an empty one stands for it.
const torch::Tensor& kNoBias() {
  static const torch::Tensor none = torch::empty({0});
  return none;
}

}  // namespace

torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const int64_t in = x.size(-1);
  const bool autocast = at::autocast::is_autocast_enabled(at::kCPU);
  if (autocast && x.device().is_cpu() && torch::GradMode::is_enabled() && x.numel() != in) {
    const auto dtype = at::autocast::get_autocast_dtype(at::kCPU);
    if (w.scalar_type() == torch::kFloat && (dtype == torch::kBFloat16 || dtype == torch::kHalf))
      return AutocastLinear::apply(x, w, b.defined() ? b : kNoBias(), dtype);
  }
  // Under autocast, linear computes in bf16 / fp16 and mv (not on the CPU's autocast list) would
  // stay fp32: a lone row must get the same dtype and rounding as the rows of a batch.
  if (x.numel() != in || !x.device().is_cpu() || x.scalar_type() != w.scalar_type() || autocast)
    return torch::nn::functional::linear(x, w, b);
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  auto y = torch::mv(w, x.reshape({in}));  // (out,)
  if (b.defined()) y = y + b;
  return y.view(sizes);  // (..., out)
}

}  // namespace nanogpt::model
