// Cross-entropy as an autograd Function over the CUDA kernels (see cross_entropy_kernel.h), on the
// current stream of the logits' device; on CPU tensors the same per-logit lines in a host loop.
// Legend as cross_entropy_kernel_math.h.
#include "model/cuda/cross_entropy_kernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/cuda/cross_entropy_kernel_math.h"

namespace nanogpt::model::cuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Calls f with a value of the logits' element type: float, c10::BFloat16 or c10::Half.
template <class F>
void with_logit_type(c10::ScalarType dtype, F&& f) {
  if (dtype == torch::kFloat) return f(float{});
  if (dtype == torch::kBFloat16) return f(c10::BFloat16{});
  if (dtype == torch::kHalf) return f(c10::Half{});
  throw std::logic_error(std::string("[model] the cross-entropy kernel has no ") + c10::toString(dtype) + " form");
}

template <class T>
CrossEntropyRows<T> rows_of(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                            const torch::Tensor& row_loss) {
  return {static_cast<const T*>(logits.data_ptr()), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
          row_loss.defined() ? row_loss.data_ptr<float>() : nullptr};
}

// The forward on the host: the kernels' lines, one row at a time, then the mean.
template <class T>
void forward_on_host(const CrossEntropyRows<T>& t, float* loss, float* count, int64_t N, int64_t V) {
  float sum = 0.0f, n = 0.0f;
  for (int64_t row = 0; row < N; ++row) {
    const int64_t target = t.targets[row];
    if (target == kCrossEntropyIgnore) {
      t.lse[row] = t.row_loss[row] = 0.0f;
      continue;
    }
    const T* x = t.logits + row * V;
    // As the kernel's warp: 32 lanes each sum every 32nd logit, then merge pairwise (a butterfly).
    SoftmaxSum lanes[32];
    for (int lane = 0; lane < 32; ++lane) {
      lanes[lane] = {-HUGE_VALF, 0.0f};
      for (int64_t v = lane; v < V; v += 32) lanes[lane] = softmax_add(lanes[lane], static_cast<float>(x[v]));
    }
    for (int o = 16; o > 0; o >>= 1) {
      SoftmaxSum merged[32];
      for (int lane = 0; lane < 32; ++lane) merged[lane] = softmax_merge(lanes[lane], lanes[lane ^ o]);
      std::copy(merged, merged + 32, lanes);
    }
    t.lse[row] = log_sum_exp(lanes[0]);
    t.row_loss[row] = target >= 0 && target < V ? t.lse[row] - static_cast<float>(x[target]) : NAN;
    sum += t.row_loss[row];
    n += 1.0f;
  }
  *loss = sum / n;
  *count = n;
}

template <class T>
void backward_on_host(const CrossEntropyRows<T>& t, const float* grad_loss, const float* count, T* grad, int64_t N,
                      int64_t V) {
  for (int64_t row = 0; row < N; ++row) {
    const int64_t target = t.targets[row];
    const T* x = t.logits + row * V;
    T* out = grad + row * V;
    const float scale = *grad_loss / *count;
    for (int64_t v = 0; v < V; ++v)
      out[v] = static_cast<T>(target == kCrossEntropyIgnore
                                  ? 0.0f
                                  : cross_entropy_grad(static_cast<float>(x[v]), t.lse[row], v == target, scale));
  }
}

cudaStream_t stream_of(const torch::Tensor& t) { return at::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

struct CrossEntropyKernel : public torch::autograd::Function<CrossEntropyKernel> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets) {
    const int64_t N = logits.size(0), V = logits.size(1);
    const auto fp32 = logits.options().dtype(torch::kFloat);
    auto lse = torch::empty({N}, fp32), row_loss = torch::empty({N}, fp32);
    auto loss = torch::empty({}, fp32), count = torch::empty({}, fp32);
    with_logit_type(logits.scalar_type(), [&](auto element) {
      using T = decltype(element);
      const auto t = rows_of<T>(logits, targets, lse, row_loss);
      if (logits.is_cuda()) {
        c10::cuda::CUDAGuard on_device(logits.device());
        launch_cross_entropy_forward(t, loss.data_ptr<float>(), count.data_ptr<float>(), N, V, stream_of(logits));
      } else {
        forward_on_host(t, loss.data_ptr<float>(), count.data_ptr<float>(), N, V);
      }
    });
    ctx->save_for_backward({logits, targets, lse, count});  // the logits the caller holds anyway
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &logits = saved[0], &targets = saved[1], &lse = saved[2], &count = saved[3];
    const int64_t N = logits.size(0), V = logits.size(1);
    const auto grad_loss = grads[0].to(torch::kFloat).contiguous();  // a device scalar: not read by the host
    auto grad = torch::empty_like(logits);                            // (N, V) in the logits' dtype
    with_logit_type(logits.scalar_type(), [&](auto element) {
      using T = decltype(element);
      const auto t = rows_of<T>(logits, targets, lse, torch::Tensor());
      auto* out = static_cast<T*>(grad.data_ptr());
      if (logits.is_cuda()) {
        c10::cuda::CUDAGuard on_device(logits.device());
        launch_cross_entropy_backward(t, grad_loss.data_ptr<float>(), count.data_ptr<float>(), out, N, V,
                                      stream_of(logits));
      } else {
        backward_on_host(t, grad_loss.data_ptr<float>(), count.data_ptr<float>(), out, N, V);
      }
    });
    return {grad, torch::Tensor()};
  }
};

}  // namespace

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  const auto dtype = logits.scalar_type();
  if (logits.dim() != 2 || logits.layout() != torch::kStrided ||
      (dtype != torch::kFloat && dtype != torch::kBFloat16 && dtype != torch::kHalf))
    return {};  // not one it takes: the caller's own path
  if (targets.dim() != 1 || targets.size(0) != logits.size(0) || targets.scalar_type() != torch::kLong ||
      targets.device() != logits.device() || logits.size(1) < 1)
    throw std::invalid_argument("[model] cross-entropy kernel: wants logits (N, V) and int64 targets (N,) on one "
                                "device, got " + c10::str(logits.sizes()) + " on " + logits.device().str() + " and " +
                                c10::str(targets.sizes()) + " " + c10::toString(targets.scalar_type()) + " on " +
                                targets.device().str());
  return CrossEntropyKernel::apply(logits.contiguous(), targets.contiguous());
}

}  // namespace nanogpt::model::cuda
