// Fast CPU dropout (see dropout.h).
#include "model/fast/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>

#include "model/fast/simd.h"

namespace nanogpt::model {
namespace {

NANOGPT_INLINE uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// y = x * mask, where the mask of `seed` (see dropout.h) starts at global element `offset`. Each
// 64-bit hash decides 4 consecutive global elements: its four 16-bit slices, in memory order, are
// the elements' draws. A block first fills its hashes (64-bit multiplies, vectorised where the CPU has
// them; by ISA, not CPU model: see simd.h), then reads them as an array of 16-bit draws, one per element, in a loop the compiler
// vectorises too. A chunk that starts mid-word still draws exactly the values the whole tensor would.
// At the full preset these masks are 13 dropouts and 3 passes of attention weights per layer, 0.5 s
// of a 2.4 s step as the scalar loop it replaces.

constexpr int64_t kBlockWords = 1024;  // hashes per block: 8 KB, 4096 draws

NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, fill_hashes, (uint64_t* __restrict h, int64_t first_word, int64_t n,
               uint64_t seed), (h, first_word, n, seed), {
  for (int64_t k = 0; k < n; ++k) h[k] = splitmix64(seed + static_cast<uint64_t>(first_word + k + 1) * 0x9E3779B97F4A7C15ULL);
})

// bf16 travels as its raw 16 bits (uint16_t) through the vectorised loops (model/fast/simd.h).
template <typename in_t, typename out_t>
NANOGPT_INLINE void scale_kept(const uint16_t* __restrict draw, const in_t* __restrict x,
                                                      out_t* __restrict y, int64_t n, uint16_t threshold, float keep) {
  for (int64_t i = 0; i < n; ++i) {
    const float factor = draw[i] >= threshold ? keep : 0.0f;  // x * mask, as the mask tensor it replaces
    store_float(load_float(x[i]) * factor, y + i);
  }
}

#define NANOGPT_SCALE_KEPT(in_t, out_t, name)                                                                  \
  NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, name, (const uint16_t* draw, const in_t* x, out_t* y, int64_t n,        \
                 uint16_t threshold, float keep), (draw, x, y, n, threshold, keep),                             \
                 { scale_kept(draw, x, y, n, threshold, keep); })
NANOGPT_SCALE_KEPT(float, float, scale_kept_f32_f32)
NANOGPT_SCALE_KEPT(float, uint16_t, scale_kept_f32_bf16)
NANOGPT_SCALE_KEPT(uint16_t, float, scale_kept_bf16_f32)
NANOGPT_SCALE_KEPT(uint16_t, uint16_t, scale_kept_bf16_bf16)
#undef NANOGPT_SCALE_KEPT

template <typename in_t, typename out_t>
void scale_kept_any(const uint16_t* draw, const in_t* x, out_t* y, int64_t n, uint16_t threshold, double keep) {
  if constexpr (std::is_same_v<in_t, float> && std::is_same_v<out_t, float>) {
    scale_kept_f32_f32(draw, x, y, n, threshold, static_cast<float>(keep));
  } else if constexpr (std::is_same_v<in_t, float> && std::is_same_v<out_t, c10::BFloat16>) {
    scale_kept_f32_bf16(draw, x, bits(y), n, threshold, static_cast<float>(keep));
  } else if constexpr (std::is_same_v<in_t, c10::BFloat16> && std::is_same_v<out_t, float>) {
    scale_kept_bf16_f32(draw, bits(x), y, n, threshold, static_cast<float>(keep));
  } else if constexpr (std::is_same_v<in_t, c10::BFloat16> && std::is_same_v<out_t, c10::BFloat16>) {
    scale_kept_bf16_bf16(draw, bits(x), bits(y), n, threshold, static_cast<float>(keep));
  } else {  // fp64 and fp16: the plain loop, in fp64 when either side is
    using acc_t = std::conditional_t<std::is_same_v<in_t, double> || std::is_same_v<out_t, double>, double, float>;
    for (int64_t i = 0; i < n; ++i)
      y[i] = static_cast<out_t>(draw[i] >= threshold ? static_cast<acc_t>(x[i]) * static_cast<acc_t>(keep) : acc_t(0));
  }
}

template <typename in_t, typename out_t>
void masked_scale(const in_t* x, out_t* y, int64_t n, double p, uint64_t seed, int64_t offset) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the 16-bit draws are read in little-endian order");
  const auto threshold = static_cast<uint16_t>(std::min<long>(65535, std::lround(p * 65536.0)));
  const double keep = 1.0 / (1.0 - p);
  const int64_t first_word = offset / 4, last_word = (offset + n - 1) / 4;
  const int64_t blocks = (last_word - first_word + kBlockWords) / kBlockWords;
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    uint64_t hashes[kBlockWords];
    for (int64_t b = begin; b < end; ++b) {
      const int64_t w0 = first_word + b * kBlockWords, words = std::min(kBlockWords, last_word + 1 - w0);
      fill_hashes(hashes, w0, words, seed);
      const int64_t lo = std::max(w0 * 4, offset), hi = std::min((w0 + words) * 4, offset + n);  // global elements
      const auto* draws = reinterpret_cast<const uint16_t*>(hashes) + (lo - w0 * 4);
      scale_kept_any(draws, x + (lo - offset), y + (lo - offset), hi - lo, threshold, keep);
    }
  });
}

// Forward applies a fresh mask; backward applies the same one to the gradient, from the seed.
struct DropoutFunction : public torch::autograd::Function<DropoutFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, double p) {
    const uint64_t seed = draw_dropout_seed();
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    return apply_dropout_mask(x, p, seed, 0, x.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const double p = ctx->saved_data["p"].toDouble();
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    return {apply_dropout_mask(grads[0], p, seed, 0, grads[0].scalar_type()), torch::Tensor()};
  }
};

}  // namespace

uint64_t draw_dropout_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

namespace {

// x >> s with zeros shifted in (int64 tensors hold the uint64 hashes; their >> is arithmetic).
torch::Tensor shift_right_logical(const torch::Tensor& x, int64_t s) {
  return x.bitwise_right_shift(s).bitwise_and(static_cast<int64_t>((~0ULL) >> s));
}

}  // namespace

torch::Tensor apply_dropout_mask_by_ops(const torch::Tensor& x, double p, uint64_t seed, int64_t offset,
                                        torch::ScalarType out_dtype) {
  const int64_t n = x.numel();
  auto i64 = x.options().dtype(torch::kLong);
  // int64 products wrap as uint64 ones do: the same hashes as splitmix64 above.
  auto element = torch::arange(offset, offset + n, i64);                            // (n,) global indices
  auto z = element.bitwise_right_shift(2).add(1).mul(static_cast<int64_t>(0x9E3779B97F4A7C15ULL))
               .add(static_cast<int64_t>(seed));                                    // seed + (word + 1) * golden
  z = z.bitwise_xor(shift_right_logical(z, 30)).mul(static_cast<int64_t>(0xBF58476D1CE4E5B9ULL));
  z = z.bitwise_xor(shift_right_logical(z, 27)).mul(static_cast<int64_t>(0x94D049BB133111EBULL));
  z = z.bitwise_xor(shift_right_logical(z, 31));
  auto draw = z.bitwise_right_shift(element.bitwise_and(3).mul(16)).bitwise_and(0xFFFF);  // element's 16-bit slice
  const int64_t threshold = std::min<long>(65535, std::lround(p * 65536.0));
  const bool wide = x.scalar_type() == torch::kDouble || out_dtype == torch::kDouble;
  auto xs = x.reshape({n}).to(wide ? torch::kDouble : torch::kFloat);
  // The CPU loop's arithmetic: x times 1 / (1 - p), that factor rounded to fp32 unless either side is fp64.
  const double keep = wide ? 1.0 / (1.0 - p) : static_cast<double>(static_cast<float>(1.0 / (1.0 - p)));
  auto y = torch::where(draw.ge(threshold), xs * keep, torch::zeros({}, xs.options()));
  return y.to(out_dtype).view(x.sizes());
}

torch::Tensor apply_dropout_mask(const torch::Tensor& x, double p, uint64_t seed, int64_t offset,
                                 torch::ScalarType out_dtype) {
  if (!x.device().is_cpu()) return apply_dropout_mask_by_ops(x, p, seed, offset, out_dtype);
  auto in = x.contiguous();
  auto y = torch::empty(in.sizes(), in.options().dtype(out_dtype));
  if (in.numel() == 0) return y;
  // bf16 and fp16 are scaled in fp32 and rounded once (1 / 0.9 is 1.109375 in bf16): each kept value
  // is x / (1 - p) to the nearest bf16, as CUDA's fused dropout computes it.
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.scalar_type(), "nanogpt_dropout_in", [&] {
    using in_t = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out_dtype, "nanogpt_dropout_out", [&] {
      masked_scale(in.const_data_ptr<in_t>(), y.mutable_data_ptr<scalar_t>(), in.numel(), p, seed, offset);
    });
  });
  return y;
}

torch::Tensor fast_dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0.0) return x;
  if (!x.device().is_cpu()) return torch::dropout(x, p, training);
  return DropoutFunction::apply(x, p);
}

}  // namespace nanogpt::model
