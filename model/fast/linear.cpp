// Linear with a matrix-vector fast path (see linear.h).
#include "model/fast/linear.h"

#include <ATen/autocast_mode.h>

namespace nanogpt::model {

torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const int64_t in = x.size(-1);
  // Under autocast, linear computes in bf16 / fp16 and mv (not on the CPU's autocast list) would
  // stay fp32: a lone row must get the same dtype and rounding as the rows of a batch.
  if (x.numel() != in || !x.device().is_cpu() || x.scalar_type() != w.scalar_type() ||
      at::autocast::is_autocast_enabled(at::kCPU))
    return torch::nn::functional::linear(x, w, b);
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  auto y = torch::mv(w, x.reshape({in}));  // (out,)
  if (b.defined()) y = y + b;
  return y.view(sizes);  // (..., out)
}

}  // namespace nanogpt::model
