// Causal softmax forward and backward in one pass each (see causal_softmax.h).
#include "model/fast/causal_softmax.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "model/fast/simd.h"

namespace nanogpt::model {
namespace {

// One row's first n keys: w = softmax(scale * s), the rest of the row (T - n) zero. e is fp32 scratch.
template <typename S>
NANOGPT_INLINE void softmax_row(const S* __restrict s, S* __restrict w, float* __restrict e, int64_t n, int64_t T, float scale) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) e[j] = scale * load_float(s[j]);
  const float inv = 1.0f / exp_shifted_sum(e, max_of(e, n), e, n);  // e = exp(e - max)
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) store_float(e[j] * inv, w + j);
  std::fill(w + n, w + T, S{});
}

// One row's gradient: ds = scale * w (dw - <w, dw>) over the first n keys, zero after.
template <typename S>
NANOGPT_INLINE void softmax_backward_row(const S* __restrict dw, const S* __restrict w, S* __restrict ds, int64_t n,
                                 int64_t T, float scale) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < n; ++j) dot += load_float(w[j]) * load_float(dw[j]);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) store_float(scale * load_float(w[j]) * (load_float(dw[j]) - dot), ds + j);
  std::fill(ds + n, ds + T, S{});
}

// Rows [begin, end) of the (g * T, T) scores; row r is query r % T.
#define NANOGPT_SOFTMAX_ROWS(S, name)                                                                          \
  NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, name, (const S* s, S* w, int64_t begin, int64_t end, int64_t T,  \
                 float scale), (s, w, begin, end, T, scale), {                                                \
    std::vector<float> e(static_cast<size_t>(T));                                                             \
    for (int64_t r = begin; r < end; ++r) softmax_row(s + r * T, w + r * T, e.data(), r % T + 1, T, scale);    \
  })
NANOGPT_SOFTMAX_ROWS(float, softmax_rows_f32)
NANOGPT_SOFTMAX_ROWS(uint16_t, softmax_rows_bf16)
#undef NANOGPT_SOFTMAX_ROWS

#define NANOGPT_SOFTMAX_BACKWARD_ROWS(S, name)                                                              \
  NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, name, (const S* dw, const S* w, S* ds, int64_t begin, int64_t end, \
                 int64_t T, float scale), (dw, w, ds, begin, end, T, scale), {                                \
    for (int64_t r = begin; r < end; ++r)                                                                   \
      softmax_backward_row(dw + r * T, w + r * T, ds + r * T, r % T + 1, T, scale);                          \
  })
NANOGPT_SOFTMAX_BACKWARD_ROWS(float, softmax_backward_rows_f32)
NANOGPT_SOFTMAX_BACKWARD_ROWS(uint16_t, softmax_backward_rows_bf16)
#undef NANOGPT_SOFTMAX_BACKWARD_ROWS

void check_scores(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 3 && t.size(1) == t.size(2), "causal_softmax: ", what, " must be (g, T, T), got ",
              t.sizes());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), "causal_softmax: ", what, " must be floating point");
}

// What the loops take: fp32 and bf16 on the CPU. The rest (CUDA, fp16, fp64) computes the same as
// LibTorch ops, in fp32 or wider.
bool native(const torch::Tensor& t) {
  return t.device().is_cpu() && (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16);
}
c10::ScalarType wide(const torch::Tensor& t) { return at::promote_types(t.scalar_type(), torch::kFloat); }

torch::Tensor causal_softmax_ops(const torch::Tensor& scores, double scale) {
  const int64_t T = scores.size(1);
  auto hidden = torch::ones({T, T}, scores.options().dtype(torch::kBool)).triu(1);  // (T, T): key j > query i
  auto s = (scores.to(wide(scores)) * scale).masked_fill(hidden, -std::numeric_limits<double>::infinity());
  return torch::softmax(s, -1).to(scores.scalar_type());
}

torch::Tensor causal_softmax_backward_ops(const torch::Tensor& d_weights, const torch::Tensor& weights, double scale) {
  auto w = weights.to(wide(weights)), dw = d_weights.to(wide(weights));
  return (scale * w * (dw - (w * dw).sum(-1, true))).to(weights.scalar_type());  // 0 where w is 0: the masked keys
}

// Rows per task: about 32K scores, so a (12 * 4 * 64)-row step splits across the threads.
int64_t grain_rows(int64_t T) { return std::max<int64_t>(1, (int64_t{32} << 10) / std::max<int64_t>(T, 1)); }

}  // namespace

torch::Tensor causal_softmax(const torch::Tensor& scores, double scale) {
  check_scores(scores, "scores");
  if (!native(scores)) return causal_softmax_ops(scores, scale);
  auto s = scores.contiguous();
  auto w = torch::empty_like(s);
  const int64_t T = s.size(1), rows = s.size(0) * T;
  const auto f = static_cast<float>(scale);
  if (s.scalar_type() == torch::kFloat) {
    const float* in = s.data_ptr<float>();
    float* out = w.data_ptr<float>();
    at::parallel_for(0, rows, grain_rows(T), [&](int64_t b, int64_t e) { softmax_rows_f32(in, out, b, e, T, f); });
  } else {
    const uint16_t* in = bits(s.data_ptr<c10::BFloat16>());
    uint16_t* out = bits(w.data_ptr<c10::BFloat16>());
    at::parallel_for(0, rows, grain_rows(T), [&](int64_t b, int64_t e) { softmax_rows_bf16(in, out, b, e, T, f); });
  }
  return w;
}

torch::Tensor causal_softmax_backward(const torch::Tensor& d_weights, const torch::Tensor& weights, double scale) {
  check_scores(weights, "weights");
  TORCH_CHECK(d_weights.sizes() == weights.sizes() && d_weights.scalar_type() == weights.scalar_type(),
              "causal_softmax_backward: d_weights must match weights in shape and dtype");
  if (!native(weights)) return causal_softmax_backward_ops(d_weights, weights, scale);
  auto w = weights.contiguous(), dw = d_weights.contiguous();
  auto ds = torch::empty_like(w);
  const int64_t T = w.size(1), rows = w.size(0) * T;
  const auto f = static_cast<float>(scale);
  if (w.scalar_type() == torch::kFloat) {
    const float *pw = w.data_ptr<float>(), *pdw = dw.data_ptr<float>();
    float* out = ds.data_ptr<float>();
    at::parallel_for(0, rows, grain_rows(T),
                     [&](int64_t b, int64_t e) { softmax_backward_rows_f32(pdw, pw, out, b, e, T, f); });
  } else {
    const uint16_t *pw = bits(w.data_ptr<c10::BFloat16>()), *pdw = bits(dw.data_ptr<c10::BFloat16>());
    uint16_t* out = bits(ds.data_ptr<c10::BFloat16>());
    at::parallel_for(0, rows, grain_rows(T),
                     [&](int64_t b, int64_t e) { softmax_backward_rows_bf16(pdw, pw, out, b, e, T, f); });
  }
  return ds;
}

}  // namespace nanogpt::model
