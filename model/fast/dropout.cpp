// Fast CPU dropout (see dropout.h).
#include "model/fast/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>

namespace nanogpt::model {
namespace {

inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// y = x * mask, where the mask of `seed` (see dropout.h) starts at global element `offset`. Each
// 64-bit hash decides 4 consecutive global elements, so a chunk that starts mid-word still draws
// exactly the values the whole tensor would.
template <typename in_t, typename out_t>
void masked_scale(const in_t* x, out_t* y, int64_t n, double p, uint64_t seed, int64_t offset) {
  using acc_t = std::conditional_t<std::is_same_v<in_t, double> || std::is_same_v<out_t, double>, double, float>;
  const uint32_t threshold = static_cast<uint32_t>(std::lround(p * 65536.0));
  const acc_t keep = static_cast<acc_t>(1.0 / (1.0 - p));
  const int64_t first_word = offset / 4, last_word = (offset + n - 1) / 4;
  at::parallel_for(first_word, last_word + 1, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const uint64_t h = splitmix64(seed + static_cast<uint64_t>(w + 1) * 0x9E3779B97F4A7C15ULL);
      const int64_t lo = std::max<int64_t>(w * 4, offset), hi = std::min<int64_t>(w * 4 + 4, offset + n);
      for (int64_t g = lo; g < hi; ++g) {
        const bool kept = ((h >> (16 * (g - w * 4))) & 0xFFFF) >= threshold;
        y[g - offset] = static_cast<out_t>(kept ? static_cast<acc_t>(x[g - offset]) * keep : acc_t(0));
      }
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

torch::Tensor apply_dropout_mask(const torch::Tensor& x, double p, uint64_t seed, int64_t offset,
                                 torch::ScalarType out_dtype) {
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
