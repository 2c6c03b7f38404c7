// RoPE's rotation as an autograd Function over the CUDA kernel (see rope_kernel.h): one launch
// forward, one backward, on the current stream of x's device. Legend as rope_kernel_math.h.
#include "model/cuda/rope_kernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "model/cuda/rope_kernel_math.h"

namespace nanogpt::model::cuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool takes_dtype(c10::ScalarType dtype) {
  return dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf;
}

// Calls f with a value of the element type of `dtype` (one that takes_dtype accepts).
template <class F>
void with_element_type(c10::ScalarType dtype, F&& f) {
  if (dtype == torch::kFloat) return f(float{});
  if (dtype == torch::kBFloat16) return f(c10::BFloat16{});
  if (dtype == torch::kHalf) return f(c10::Half{});
  throw std::logic_error(std::string("[model] the RoPE kernel has no ") + c10::toString(dtype) + " form");
}

// t itself when its rows of hs values are packed, else a packed copy (the one copy made).
torch::Tensor packed_rows(const torch::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// The rows of t (B, T, heads, hs), or of t (B, heads, T, hs) when `heads_first`; null rows (zeros)
// for an undefined t.
template <class T>
HeadRows<T> rows_of(const torch::Tensor& t, bool heads_first) {
  if (!t.defined()) return {nullptr, 0, 0, 0};
  return {static_cast<T*>(t.data_ptr()), t.stride(0), t.stride(heads_first ? 2 : 1), t.stride(heads_first ? 1 : 2)};
}

// x (B, T, H, hs): all H heads in one tensor.
template <class T>
SplitHeads<T> all_heads(const torch::Tensor& x) {
  const HeadRows<T> rows = rows_of<T>(x, false);
  return {rows, rows, x.size(2)};
}

// first (B, n_first, T, hs) and second (B, H - n_first, T, hs): the queries and the keys.
template <class T>
SplitHeads<T> two_parts(const torch::Tensor& first, const torch::Tensor& second, int64_t n_first) {
  return {rows_of<T>(first, true), rows_of<T>(second, true), n_first};
}

// in -> out over every pair: the kernel on a GPU, the same arithmetic in a loop on the host.
template <class T>
void rotate(bool backward, const SplitHeads<const T>& in, const SplitHeads<T>& out, const torch::Tensor& cos2,
            const torch::Tensor& sin2, int64_t start, int64_t B, int64_t Tn, int64_t H, int64_t hs,
            c10::Device device) {
  const float* c = cos2.data_ptr<float>();
  const float* s = sin2.data_ptr<float>();
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard on_device(device);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device.index()).stream();
    launch_rope_rotate(backward, in, out, c, s, start, B, Tn, H, hs, stream);
    return;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t head = 0; head < H; ++head)
        for (int64_t i = 0; i < hs / 2; ++i)
          rope_rotate_pair(backward, in.row(b, t, head), out.row(b, t, head), c + (start + t) * hs,
                           s + (start + t) * hs, i, hs / 2);
}

struct RopeRotateKernel : public torch::autograd::Function<RopeRotateKernel> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& cos2,
                               const torch::Tensor& sin2, int64_t start, int64_t n_first) {
    const auto x = packed_rows(x_in);  // a slice of the QKV product is packed already: no copy
    const int64_t B = x.size(0), Tn = x.size(1), H = x.size(2), hs = x.size(3);
    auto first = torch::empty({B, n_first, Tn, hs}, x.options());       // (B, n_first, T, hs)
    auto second = torch::empty({B, H - n_first, Tn, hs}, x.options());  // (B, H - n_first, T, hs)
    with_element_type(x.scalar_type(), [&](auto element) {
      using T = decltype(element);
      rotate<T>(false, all_heads<const T>(x), two_parts<T>(first, second, n_first), cos2, sin2, start, B, Tn, H, hs,
                x.device());
    });
    ctx->save_for_backward({cos2, sin2});  // the tables, not activations
    ctx->saved_data["start"] = start;
    ctx->saved_data["heads"] = H;
    ctx->saved_data["n_first"] = n_first;
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->set_materialize_grads(false);  // a gradient that never arrived is read as zeros, not made
    return {first, second};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined() && !grads[1].defined()) return variable_list(5);  // no gradient for any input
    const auto saved = ctx->get_saved_variables();
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t start = ctx->saved_data["start"].toInt(), H = ctx->saved_data["heads"].toInt(),
                  n_first = ctx->saved_data["n_first"].toInt();
    torch::Tensor dy[2];
    for (int part = 0; part < 2; ++part)
      if (grads[part].defined()) dy[part] = packed_rows(grads[part].to(dtype));  // (B, heads, T, hs)
    const auto& ref = dy[0].defined() ? dy[0] : dy[1];
    const int64_t B = ref.size(0), Tn = ref.size(2), hs = ref.size(3);
    auto dx = torch::empty({B, Tn, H, hs}, ref.options());  // (B, T, H, hs)
    with_element_type(dtype, [&](auto element) {
      using T = decltype(element);
      rotate<T>(true, two_parts<const T>(dy[0], dy[1], n_first), all_heads<T>(dx), saved[0], saved[1], start, B, Tn, H,
                hs, dx.device());
    });
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> rope_rotate_split(const at::Tensor& x, const at::Tensor& cos2, const at::Tensor& sin2,
                                                    int64_t start, int64_t n_first) {
  if (x.dim() != 4 || x.layout() != torch::kStrided || !takes_dtype(x.scalar_type()) || x.size(3) % 2 != 0)
    return {};  // not one it takes: the caller's own path
  const auto where = [&] {
    return std::string(" (x ") + c10::str(x.sizes()) + " on " + x.device().str() + ", tables " + c10::str(cos2.sizes()) +
           " " + c10::toString(cos2.scalar_type()) + " on " + cos2.device().str() + ", positions " +
           std::to_string(start) + " .. " + std::to_string(start + x.size(1) - 1) + ")";
  };
  if (n_first < 0 || n_first > x.size(2))
    throw std::invalid_argument("[model] RoPE kernel: " + std::to_string(n_first) + " first heads of " +
                                std::to_string(x.size(2)));
  if (cos2.scalar_type() != torch::kFloat || sin2.scalar_type() != torch::kFloat || !cos2.is_contiguous() ||
      !sin2.is_contiguous() || cos2.sizes() != sin2.sizes() || cos2.device() != x.device() ||
      sin2.device() != x.device() || cos2.size(-1) != x.size(3) || start < 0 || cos2.size(0) < start + x.size(1))
    throw std::invalid_argument("[model] RoPE kernel: the tables must be fp32, contiguous, on x's device and cover its "
                                "positions" + where());
  if (x.size(0) * x.size(1) > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("[model] RoPE kernel: more (batch, position) rows than one launch's blocks" + where());
  auto out = RopeRotateKernel::apply(x, cos2, sin2, start, n_first);
  return {out[0], out[1]};
}

}  // namespace nanogpt::model::cuda
