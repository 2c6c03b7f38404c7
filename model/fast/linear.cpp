// Linear with a matrix-vector fast path (see linear.h).
#include "model/fast/linear.h"

namespace nanogpt::model {

torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const int64_t in = x.size(-1);
  if (x.numel() != in || !x.device().is_cpu() || x.scalar_type() != w.scalar_type())
    return torch::nn::functional::linear(x, w, b);
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  auto y = torch::mv(w, x.reshape({in}));  // (out,)
  if (b.defined()) y = y + b;
  return y.view(sizes);  // (..., out)
}

}  // namespace nanogpt::model
