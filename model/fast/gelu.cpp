// GELU with its slope in one pass (see gelu.h).
#include "model/fast/gelu.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "model/fast/avx2.h"
#include "model/fast/avx512.h"
#include "model/fast/dot.h"
#include "model/fast/simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NANOGPT_GELU_AVX512 1
// GCC 12 warns inside its own headers: _mm512_max_ps and others pass _mm512_undefined_ps() as the
// unused merge operand (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#else
#define NANOGPT_GELU_AVX512 0
#endif

namespace nanogpt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a pass writes next to GELU(h): nothing, the slope GELU'(h), or g * GELU'(h).
enum class Second { none, slope, input_grad };

constexpr int64_t kGrain = 16384;  // elements a thread takes at least

#if NANOGPT_GELU_AVX512
#define NANOGPT_AVX512 __attribute__((target("avx512f"), always_inline)) inline

// exp(x) for x <= 0, 16 lanes: simd.h's exp_nonpositive (x = n ln2 + r, Cephes' polynomial), with
// 2^n applied by vscalefps. x is clamped at -87.3, so the result is never 0. kFp32: the whole
// polynomial (~2 ulp); otherwise its terms to r^5 (relative error < 2e-6, far under bf16's 4e-3).
template <bool kFp32>
NANOGPT_AVX512 __m512 exp16_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(8.3334519073e-3f);
  if constexpr (kFp32) {
    p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  }
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// GELU(v) and GELU'(v) for 16 lanes. With z = |v| / sqrt 2: erfc(z) = t (a1 + a2 t + ... + a5 t^4)
// exp(-z^2), t = 1 / (1 + p z) (A&S 7.1.26); Phi(v) = erfc(z) / 2 for v < 0, else 1 - erfc(z) / 2;
// phi(v) = exp(-z^2) / sqrt(2 pi). t is vrcp14ps (2^-14 relative, enough under bf16's rounding), and
// for fp32 one Newton step more (~2^-28), rather than a division. z is capped at 10, where erfc is
// 2e-45 (0 in fp32). Non-finite input stays non-finite: NaN gives NaN, +-inf gives +-inf.
struct Gelu16 {
  __m512 value, slope;
};
template <bool kFp32>
NANOGPT_AVX512 Gelu16 gelu16(__m512 v) {
  const __m512 z = _mm512_min_ps(_mm512_mul_ps(_mm512_abs_ps(v), _mm512_set1_ps(0.70710678f)), _mm512_set1_ps(10.0f));
  const __m512 a = _mm512_fmadd_ps(z, _mm512_set1_ps(0.3275911f), _mm512_set1_ps(1.0f));
  __m512 t = _mm512_rcp14_ps(a);                                                     // 2^-14 relative
  if constexpr (kFp32) t = _mm512_mul_ps(t, _mm512_fnmadd_ps(a, t, _mm512_set1_ps(2.0f)));  // ~2^-28
  __m512 p = _mm512_set1_ps(1.061405429f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
  const __m512 e = exp16_nonpositive<kFp32>(_mm512_mul_ps(z, _mm512_sub_ps(_mm512_setzero_ps(), z)));  // exp(-z^2)
  const __m512 half_erfc = _mm512_mul_ps(_mm512_mul_ps(p, t), _mm512_mul_ps(e, _mm512_set1_ps(0.5f)));
  const __mmask16 negative = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 cdf = _mm512_mask_blend_ps(negative, _mm512_sub_ps(_mm512_set1_ps(1.0f), half_erfc), half_erfc);
  return {_mm512_mul_ps(v, cdf), _mm512_fmadd_ps(_mm512_mul_ps(v, _mm512_set1_ps(0.39894228f)), e, cdf)};
}

NANOGPT_AVX512 void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
NANOGPT_AVX512 void store16(uint16_t* p, __m512 v) {  // to the nearest bf16, ties to even; NaN -> 0x7FC0 (simd.h)
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), odd), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

// The inputs 2 KB ahead into L1: the hardware prefetchers did not keep up here (a 2-core VM). A
// 25M-element bf16 pass took 25.5 ms on one thread without this, 13.4 with (LibTorch's gelu: 15.2).
constexpr int64_t kPrefetchBytes = 2048;
template <typename T>
NANOGPT_AVX512 void prefetch_ahead(const T* h, const T* g) {
  _mm_prefetch(reinterpret_cast<const char*>(h) + kPrefetchBytes, _MM_HINT_T0);
  if (g) _mm_prefetch(reinterpret_cast<const char*>(g) + kPrefetchBytes, _MM_HINT_T0);
}

template <Second second, typename T>
NANOGPT_AVX512 void gelu_step16(const T* h, const T* g, T* y, T* out) {
  const Gelu16 r = gelu16<std::is_same_v<T, float>>(load16(h));
  store16(y, r.value);
  if constexpr (second == Second::slope) store16(out, r.slope);
  if constexpr (second == Second::input_grad) store16(out, _mm512_mul_ps(r.slope, load16(g)));
}

// n elements of h (and g) -> y (and out), 16 at a time; the last < 16 through a zero-padded copy.
template <Second second, typename T>
__attribute__((target("avx512f"))) void gelu_avx512(const T* h, const T* g, T* y, T* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(h + i, g ? g + i : nullptr);
    gelu_step16<second>(h + i, g ? g + i : nullptr, y + i, out ? out + i : nullptr);
  }
  if (i == n) return;
  T hb[16] = {}, gb[16] = {}, yb[16], ob[16];
  std::memcpy(hb, h + i, (n - i) * sizeof(T));
  if (g) std::memcpy(gb, g + i, (n - i) * sizeof(T));
  gelu_step16<second>(hb, gb, yb, ob);
  std::memcpy(y + i, yb, (n - i) * sizeof(T));
  if (out) std::memcpy(out + i, ob, (n - i) * sizeof(T));
}

// bf16 with AVX512-BF16: vcvtne2ps2bf16 rounds 32 values to bf16 in one instruction (ties to even, as
// store16; NaN stays a NaN). With the integer rounding above instead (NANOGPT_KERNELS=avx512f), the
// CPU preset's forward took 110 us against 85, and the backward pass 150 against 103.
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline void store32(uint16_t* p, __m512 lo, __m512 hi) {
  _mm512_storeu_si512(p, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
}
template <Second second>
__attribute__((target("avx512f,avx512bf16"))) void gelu_avx512_bf16(const uint16_t* h, const uint16_t* g, uint16_t* y,
                                                                     uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    prefetch_ahead(h + i, g ? g + i : nullptr);
    const Gelu16 lo = gelu16<false>(load16(h + i)), hi = gelu16<false>(load16(h + i + 16));
    store32(y + i, lo.value, hi.value);
    if constexpr (second == Second::slope) store32(out + i, lo.slope, hi.slope);
    if constexpr (second == Second::input_grad)
      store32(out + i, _mm512_mul_ps(lo.slope, load16(g + i)), _mm512_mul_ps(hi.slope, load16(g + i + 16)));
  }
  if (i < n) gelu_avx512<second>(h + i, g ? g + i : nullptr, y + i, out ? out + i : nullptr, n - i);
}
// out = a * b elementwise in bf16 (fp32 products rounded once), for backward's dy * slope.
__attribute__((target("avx512f,avx512bf16"))) void multiply_bf16(const uint16_t* a, const uint16_t* b, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    prefetch_ahead(a + i, b + i);
    store32(out + i, _mm512_mul_ps(load16(a + i), load16(b + i)), _mm512_mul_ps(load16(a + i + 16), load16(b + i + 16)));
  }
  for (; i < n; ++i) out[i] = float_to_bf16_bits(bf16_bits_to_float(a[i]) * bf16_bits_to_float(b[i]));
}
#undef NANOGPT_AVX512

// The same for CPUs without AVX-512 (a laptop's AVX2 + FMA), 8 lanes a register: 2^n built in the
// exponent bits (no vscalefps; n is in [-126, 0] after the clamp), and t from vrcpps (2^-12
// relative) with one Newton step (~2^-23) in either dtype. bf16 rounded by shifts (avx2.h).
#define NANOGPT_AVX2_GELU __attribute__((target("avx2,fma"), always_inline)) inline

template <bool kFp32>
NANOGPT_AVX2_GELU __m256 exp8_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(8.3334519073e-3f);
  if constexpr (kFp32) {
    p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  }
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

struct Gelu8 {
  __m256 value, slope;
};
template <bool kFp32>
NANOGPT_AVX2_GELU Gelu8 gelu8(__m256 v) {
  const __m256 z = _mm256_min_ps(_mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), _mm256_set1_ps(0.70710678f)),
                                 _mm256_set1_ps(10.0f));
  const __m256 a = _mm256_fmadd_ps(z, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.0f));
  __m256 t = _mm256_rcp_ps(a);                                                    // 2^-12 relative
  t = _mm256_mul_ps(t, _mm256_fnmadd_ps(a, t, _mm256_set1_ps(2.0f)));             // ~2^-23
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  const __m256 e = exp8_nonpositive<kFp32>(_mm256_mul_ps(z, _mm256_sub_ps(_mm256_setzero_ps(), z)));  // exp(-z^2)
  const __m256 half_erfc = _mm256_mul_ps(_mm256_mul_ps(p, t), _mm256_mul_ps(e, _mm256_set1_ps(0.5f)));
  const __m256 negative = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 cdf = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), half_erfc), half_erfc, negative);
  return {_mm256_mul_ps(v, cdf), _mm256_fmadd_ps(_mm256_mul_ps(v, _mm256_set1_ps(0.39894228f)), e, cdf)};
}

NANOGPT_AVX2_GELU void store16(float* p, __m256 lo, __m256 hi) {
  _mm256_storeu_ps(p, lo);
  _mm256_storeu_ps(p + 8, hi);
}
NANOGPT_AVX2_GELU void store16(uint16_t* p, __m256 lo, __m256 hi) { store16_bf16(p, lo, hi); }

template <Second second, typename T>
NANOGPT_AVX2_GELU void gelu_step16_avx2(const T* h, const T* g, T* y, T* out) {
  constexpr bool fp32 = std::is_same_v<T, float>;
  const Gelu8 lo = gelu8<fp32>(load8(h)), hi = gelu8<fp32>(load8(h + 8));
  store16(y, lo.value, hi.value);
  if constexpr (second == Second::slope) store16(out, lo.slope, hi.slope);
  if constexpr (second == Second::input_grad)
    store16(out, _mm256_mul_ps(lo.slope, load8(g)), _mm256_mul_ps(hi.slope, load8(g + 8)));
}

// n elements of h (and g) -> y (and out), 16 at a time; the last < 16 through a zero-padded copy.
template <Second second, typename T>
__attribute__((target("avx2,fma"))) void gelu_avx2(const T* h, const T* g, T* y, T* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(h + i) + kPrefetchBytes, _MM_HINT_T0);
    if (g) _mm_prefetch(reinterpret_cast<const char*>(g + i) + kPrefetchBytes, _MM_HINT_T0);
    gelu_step16_avx2<second>(h + i, g ? g + i : nullptr, y + i, out ? out + i : nullptr);
  }
  if (i == n) return;
  T hb[16] = {}, gb[16] = {}, yb[16], ob[16];
  std::memcpy(hb, h + i, (n - i) * sizeof(T));
  if (g) std::memcpy(gb, g + i, (n - i) * sizeof(T));
  gelu_step16_avx2<second>(hb, gb, yb, ob);
  std::memcpy(y + i, yb, (n - i) * sizeof(T));
  if (out) std::memcpy(out + i, ob, (n - i) * sizeof(T));
}
#undef NANOGPT_AVX2_GELU
#endif

// Whether the pass covers h: a CPU tensor in fp32 or bf16, on a CPU with AVX-512 or AVX2 + FMA (and
// the hand-written kernels not capped at portable).
bool covered(const torch::Tensor& h) {
  return NANOGPT_GELU_AVX512 && h.is_cpu() && (h.scalar_type() == torch::kFloat || h.scalar_type() == torch::kBFloat16) &&
         (avx512_kernels() || avx2_kernels());
}

// The pass over contiguous h (and g, same dtype): y = GELU(h), out = the slope or g * slope.
template <Second second>
void run(const torch::Tensor& h, const torch::Tensor& g, torch::Tensor& y, torch::Tensor& out) {
#if NANOGPT_GELU_AVX512
  RECORD_FUNCTION(second == Second::none ? "nanogpt::gelu" : second == Second::slope ? "nanogpt::gelu_and_slope" : "nanogpt::gelu_backward",
                  std::vector<c10::IValue>());  // rows in bench --profile
  const bool bf16 = h.scalar_type() == torch::kBFloat16, bf16_insn = bf16 && avx512_bf16_kernels();
  const auto* hp = static_cast<const char*>(h.data_ptr());
  const auto* gp = g.defined() ? static_cast<const char*>(g.data_ptr()) : nullptr;
  auto* yp = static_cast<char*>(y.data_ptr());
  auto* op = out.defined() ? static_cast<char*>(out.data_ptr()) : nullptr;
  const int64_t size = h.element_size();
  at::parallel_for(0, h.numel(), kGrain, [&](int64_t begin, int64_t end) {
    const int64_t at = begin * size, n = end - begin;
    const auto* gb = gp ? gp + at : nullptr;
    auto* ob = op ? op + at : nullptr;
    if (!avx512_kernels()) {
      if (bf16)
        gelu_avx2<second>(reinterpret_cast<const uint16_t*>(hp + at), reinterpret_cast<const uint16_t*>(gb),
                          reinterpret_cast<uint16_t*>(yp + at), reinterpret_cast<uint16_t*>(ob), n);
      else
        gelu_avx2<second>(reinterpret_cast<const float*>(hp + at), reinterpret_cast<const float*>(gb),
                          reinterpret_cast<float*>(yp + at), reinterpret_cast<float*>(ob), n);
    } else if (bf16_insn) {
      gelu_avx512_bf16<second>(reinterpret_cast<const uint16_t*>(hp + at), reinterpret_cast<const uint16_t*>(gb),
                               reinterpret_cast<uint16_t*>(yp + at), reinterpret_cast<uint16_t*>(ob), n);
    } else if (bf16) {
      gelu_avx512<second>(reinterpret_cast<const uint16_t*>(hp + at), reinterpret_cast<const uint16_t*>(gb),
                          reinterpret_cast<uint16_t*>(yp + at), reinterpret_cast<uint16_t*>(ob), n);
    } else {
      gelu_avx512<second>(reinterpret_cast<const float*>(hp + at), reinterpret_cast<const float*>(gb),
                          reinterpret_cast<float*>(yp + at), reinterpret_cast<float*>(ob), n);
    }
  });
#endif
}

// Forward keeps GELU'(h) (not h); backward is dy * GELU'(h).
struct GeluWithSlope : public torch::autograd::Function<GeluWithSlope> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h) {
    auto hc = h.contiguous();
    auto y = torch::empty_like(hc), slope = torch::empty_like(hc);
    run<Second::slope>(hc, {}, y, slope);
    ctx->save_for_backward({slope});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto slope = ctx->get_saved_variables()[0];
    auto g = grads[0].to(slope.scalar_type()).contiguous();
#if NANOGPT_GELU_AVX512
    if (slope.scalar_type() == torch::kBFloat16 && avx512_bf16_kernels()) {
      RECORD_FUNCTION("nanogpt::gelu_slope_times_grad", std::vector<c10::IValue>());
      auto out = torch::empty_like(slope);
      const auto* a = reinterpret_cast<const uint16_t*>(g.data_ptr());
      const auto* b = reinterpret_cast<const uint16_t*>(slope.data_ptr());
      auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
      at::parallel_for(0, slope.numel(), kGrain, [&](int64_t begin, int64_t end) { multiply_bf16(a + begin, b + begin, o + begin, end - begin); });
      return {out};
    }
#endif
    return {g * slope};
  }
};

}  // namespace

torch::Tensor fast_gelu(const torch::Tensor& h) {
  if (!covered(h)) return torch::gelu(h);
  if (torch::GradMode::is_enabled() && h.requires_grad()) return GeluWithSlope::apply(h);
  auto hc = h.contiguous();
  auto y = torch::empty_like(hc);
  torch::Tensor none;
  run<Second::none>(hc, {}, y, none);
  return y;
}

std::pair<torch::Tensor, torch::Tensor> fast_gelu_backward(const torch::Tensor& h, const torch::Tensor& g) {
  torch::NoGradGuard no_grad;
  auto gh = g.to(h.scalar_type());
  if (!covered(h)) return {torch::gelu(h), torch::gelu_backward(gh, h)};
  auto hc = h.contiguous(), gc = gh.contiguous().view(hc.sizes());
  auto y = torch::empty_like(hc), dh = torch::empty_like(hc);
  run<Second::input_grad>(hc, gc, y, dh);
  return {y, dh};
}

}  // namespace nanogpt::model
