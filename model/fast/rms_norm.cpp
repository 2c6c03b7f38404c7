// RMSNorm in one pass each way (see rms_norm.h).
#include "model/fast/rms_norm.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/fast/simd.h"

namespace nanogpt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kBlockRows = 64;      // the weight's gradient: one partial sum per block of rows
constexpr int64_t kGrainElements = 16384;  // elements a thread takes at least

// Rows [r0, r1) of x (C wide): y = (x s) w (w may be null), s = 1 / sqrt(mean(x²) + eps) kept in inv.
template <typename T>
NANOGPT_INLINE void forward_rows(const T* __restrict x, const float* __restrict w, T* __restrict y,
                                 float* __restrict inv, int64_t C, float eps, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * C;
    T* yr = y + r * C;
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < C; ++i) squares += load_float(xr[i]) * load_float(xr[i]);
    const float s = 1.0f / std::sqrt(squares / static_cast<float>(C) + eps);
    inv[r] = s;
    if (w) {
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) store_float(load_float(xr[i]) * s * w[i], yr + i);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) store_float(load_float(xr[i]) * s, yr + i);
    }
  }
}

// Rows [r0, r1): with g = dy w (dy without a weight), dx = s g - x s³ mean(g x), as autograd of the
// operations computes it (s³ mean(g x) is one factor per row); the weight's gradient sum(dy x s)
// over the rows is added to dw (when given).
template <typename T>
NANOGPT_INLINE void backward_rows(const T* __restrict x, const float* __restrict w, const T* __restrict dy,
                                  const float* __restrict inv, T* __restrict dx, float* __restrict dw, int64_t C,
                                  int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * C;
    const T* gr = dy + r * C;
    T* dxr = dx + r * C;
    const float s = inv[r];
    float dot = 0.0f;  // sum(g x)
    if (w) {
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < C; ++i) dot += load_float(gr[i]) * w[i] * load_float(xr[i]);
    } else {
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < C; ++i) dot += load_float(gr[i]) * load_float(xr[i]);
    }
    const float c = s * s * s * (dot / static_cast<float>(C));
    if (w) {
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) store_float(s * (load_float(gr[i]) * w[i]) - load_float(xr[i]) * c, dxr + i);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) store_float(s * load_float(gr[i]) - load_float(xr[i]) * c, dxr + i);
    }
    if (dw) {
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) dw[i] += load_float(gr[i]) * (load_float(xr[i]) * s);
    }
  }
}

NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, rms_forward_f32, (const float* x, const float* w, float* y, float* inv,
               int64_t C, float eps, int64_t r0, int64_t r1), (x, w, y, inv, C, eps, r0, r1),
               { forward_rows(x, w, y, inv, C, eps, r0, r1); })
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, rms_forward_bf16, (const uint16_t* x, const float* w, uint16_t* y, float* inv,
               int64_t C, float eps, int64_t r0, int64_t r1), (x, w, y, inv, C, eps, r0, r1),
               { forward_rows(x, w, y, inv, C, eps, r0, r1); })
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, rms_backward_f32, (const float* x, const float* w, const float* dy,
               const float* inv, float* dx, float* dw, int64_t C, int64_t r0, int64_t r1),
               (x, w, dy, inv, dx, dw, C, r0, r1), { backward_rows(x, w, dy, inv, dx, dw, C, r0, r1); })
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, rms_backward_bf16, (const uint16_t* x, const float* w, const uint16_t* dy,
               const float* inv, uint16_t* dx, float* dw, int64_t C, int64_t r0, int64_t r1),
               (x, w, dy, inv, dx, dw, C, r0, r1), { backward_rows(x, w, dy, inv, dx, dw, C, r0, r1); })

bool covered(const torch::Tensor& x, const std::optional<torch::Tensor>& w) {
  if (!x.is_cpu() || x.dim() == 0 || x.numel() == 0 || x.size(-1) == 0) return false;
  if (w && w->defined())
    return x.scalar_type() == torch::kFloat && w->scalar_type() == torch::kFloat && w->is_cpu() && w->dim() == 1 &&
           w->size(0) == x.size(-1);
  return x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16;
}

int64_t grain_rows(int64_t C) { return std::max<int64_t>(1, kGrainElements / C); }

// x contiguous (N rows of C), w contiguous or undefined: {y, 1/rms of each row (N,) fp32}.
std::pair<torch::Tensor, torch::Tensor> norm_forward(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  RECORD_FUNCTION("nanogpt::rms_norm", std::vector<c10::IValue>());
  const int64_t C = x.size(-1), N = x.numel() / C;
  auto y = torch::empty_like(x);
  auto inv = torch::empty({N}, x.options().dtype(torch::kFloat));
  const float* wp = w.defined() ? w.data_ptr<float>() : nullptr;
  float* ip = inv.data_ptr<float>();
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  at::parallel_for(0, N, grain_rows(C), [&](int64_t r0, int64_t r1) {
    if (bf16)
      rms_forward_bf16(bits(x.data_ptr<c10::BFloat16>()), wp, bits(y.data_ptr<c10::BFloat16>()), ip, C,
                       static_cast<float>(eps), r0, r1);
    else
      rms_forward_f32(x.data_ptr<float>(), wp, y.data_ptr<float>(), ip, C, static_cast<float>(eps), r0, r1);
  });
  return {y, inv};
}

// dx (and dw when `w` is defined and wanted) for the saved x, w (or undefined) and row scales.
std::pair<torch::Tensor, torch::Tensor> norm_backward(const torch::Tensor& x, const torch::Tensor& w,
                                                      const torch::Tensor& inv, const torch::Tensor& grad, bool want_dw) {
  RECORD_FUNCTION("nanogpt::rms_norm_backward", std::vector<c10::IValue>());
  auto dy = grad.to(x.scalar_type()).contiguous();
  const int64_t C = x.size(-1), N = x.numel() / C;
  want_dw = want_dw && w.defined();
  auto dx = torch::empty_like(x);
  const int64_t blocks = (N + kBlockRows - 1) / kBlockRows;
  std::vector<float> partial(want_dw ? static_cast<size_t>(blocks * C) : 0, 0.0f);  // one row per block
  const float* wp = w.defined() ? w.data_ptr<float>() : nullptr;
  const float* ip = inv.data_ptr<float>();
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  at::parallel_for(0, blocks, std::max<int64_t>(1, grain_rows(C) / kBlockRows), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kBlockRows, r1 = std::min(N, r0 + kBlockRows);
      float* dw = want_dw ? partial.data() + b * C : nullptr;
      if (bf16)
        rms_backward_bf16(bits(x.data_ptr<c10::BFloat16>()), wp, bits(dy.data_ptr<c10::BFloat16>()), ip,
                          bits(dx.data_ptr<c10::BFloat16>()), dw, C, r0, r1);
      else
        rms_backward_f32(x.data_ptr<float>(), wp, dy.data_ptr<float>(), ip, dx.data_ptr<float>(), dw, C, r0, r1);
    }
  });
  torch::Tensor dw;
  if (want_dw) {  // the blocks' sums added in block order
    dw = torch::zeros({C}, w.options());
    float* out = dw.data_ptr<float>();
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t i = 0; i < C; ++i) out[i] += partial[static_cast<size_t>(b * C + i)];
  }
  return {dx, dw};
}

struct WeightedRmsNorm : public torch::autograd::Function<WeightedRmsNorm> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w, double eps) {
    auto xc = x.contiguous(), wc = w.contiguous();
    auto [y, inv] = norm_forward(xc, wc, eps);
    ctx->save_for_backward({xc, wc, inv});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dw] = norm_backward(saved[0], saved[1], saved[2], grads[0], ctx->needs_input_grad(1));
    return {dx, dw, torch::Tensor()};
  }
};

struct UnweightedRmsNorm : public torch::autograd::Function<UnweightedRmsNorm> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, double eps) {
    auto xc = x.contiguous();
    auto [y, inv] = norm_forward(xc, torch::Tensor(), eps);
    ctx->save_for_backward({xc, inv});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {norm_backward(saved[0], torch::Tensor(), saved[1], grads[0], false).first, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fast_rms_norm(const torch::Tensor& x, const std::optional<torch::Tensor>& weight, double eps) {
  if (!covered(x, weight)) {
    if (!weight || !weight->defined()) return torch::rms_norm(x, {x.size(-1)}, std::nullopt, eps);
    auto xf = x.to(torch::kFloat);
    auto y = (xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
    return y * *weight;
  }
  const torch::Tensor w = weight ? *weight : torch::Tensor();
  if (torch::GradMode::is_enabled() && (x.requires_grad() || (w.defined() && w.requires_grad())))
    return w.defined() ? WeightedRmsNorm::apply(x, w, eps) : UnweightedRmsNorm::apply(x, eps);
  return norm_forward(x.contiguous(), w.defined() ? w.contiguous() : w, eps).first;
}

}  // namespace nanogpt::model
