// relu(h)² in one pass each way (see relu_squared.h).
#include "model/fast/relu_squared.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <vector>

#include "model/fast/simd.h"

namespace nanogpt::model {
namespace {

constexpr int64_t kGrain = 16384;  // elements a thread takes at least

// a = r², with r = h where h is not below 0 (NaN kept), else 0.
NANOGPT_INLINE float relu_of(float h) { return h < 0.0f ? 0.0f : h; }

template <typename T>
NANOGPT_INLINE void forward_elements(const T* __restrict h, T* __restrict a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float r = relu_of(load_float(h[i]));
    store_float(r * r, a + i);
  }
}

// a as forward, and dh = (2 r) g, or 0 where h <= 0 (relu's gradient mask: 0 there whatever g holds).
template <typename T>
NANOGPT_INLINE void backward_elements(const T* __restrict h, const T* __restrict g, T* __restrict a, T* __restrict dh,
                                      int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = load_float(h[i]);
    const float r = relu_of(v);
    store_float(r * r, a + i);
    const float d = load_float(g[i]) * (2.0f * r);
    store_float(v <= 0.0f ? 0.0f : d, dh + i);  // threshold_backward's test
  }
}

NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, relu_squared_f32, (const float* h, float* a, int64_t n), (h, a, n),
               { forward_elements(h, a, n); })
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, relu_squared_bf16, (const uint16_t* h, uint16_t* a, int64_t n), (h, a, n),
               { forward_elements(h, a, n); })
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, relu_squared_backward_f32, (const float* h, const float* g, float* a,
               float* dh, int64_t n), (h, g, a, dh, n), { backward_elements(h, g, a, dh, n); })
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, relu_squared_backward_bf16, (const uint16_t* h, const uint16_t* g,
               uint16_t* a, uint16_t* dh, int64_t n), (h, g, a, dh, n), { backward_elements(h, g, a, dh, n); })

bool covered(const torch::Tensor& h) {
  return h.is_cpu() && (h.scalar_type() == torch::kFloat || h.scalar_type() == torch::kBFloat16);
}

}  // namespace

torch::Tensor fast_relu_squared(const torch::Tensor& h) {
  if (!covered(h) || (torch::GradMode::is_enabled() && h.requires_grad())) return torch::relu(h).square();
  RECORD_FUNCTION("nanogpt::relu_squared", std::vector<c10::IValue>());
  auto hc = h.contiguous();
  auto a = torch::empty_like(hc);
  const bool bf16 = hc.scalar_type() == torch::kBFloat16;
  at::parallel_for(0, hc.numel(), kGrain, [&](int64_t begin, int64_t end) {
    if (bf16)
      relu_squared_bf16(bits(hc.data_ptr<c10::BFloat16>()) + begin, bits(a.data_ptr<c10::BFloat16>()) + begin, end - begin);
    else
      relu_squared_f32(hc.data_ptr<float>() + begin, a.data_ptr<float>() + begin, end - begin);
  });
  return a;
}

std::pair<torch::Tensor, torch::Tensor> fast_relu_squared_backward(const torch::Tensor& h, const torch::Tensor& g) {
  torch::NoGradGuard no_grad;
  auto gh = g.to(h.scalar_type());
  if (!covered(h)) {
    auto r = torch::relu(h);
    return {r.square(), torch::threshold_backward(gh * (2 * r), h, 0)};
  }
  RECORD_FUNCTION("nanogpt::relu_squared_backward", std::vector<c10::IValue>());
  auto hc = h.contiguous(), gc = gh.contiguous().view(hc.sizes());
  auto a = torch::empty_like(hc), dh = torch::empty_like(hc);
  const bool bf16 = hc.scalar_type() == torch::kBFloat16;
  at::parallel_for(0, hc.numel(), kGrain, [&](int64_t begin, int64_t end) {
    const int64_t n = end - begin;
    if (bf16)
      relu_squared_backward_bf16(bits(hc.data_ptr<c10::BFloat16>()) + begin, bits(gc.data_ptr<c10::BFloat16>()) + begin,
                                 bits(a.data_ptr<c10::BFloat16>()) + begin, bits(dh.data_ptr<c10::BFloat16>()) + begin, n);
    else
      relu_squared_backward_f32(hc.data_ptr<float>() + begin, gc.data_ptr<float>() + begin, a.data_ptr<float>() + begin,
                                dh.data_ptr<float>() + begin, n);
  });
  return {a, dh};
}

}  // namespace nanogpt::model
