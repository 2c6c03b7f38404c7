// Fast CPU dropout (see dropout.h).
#include "model/fast/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <mutex>

namespace nanogpt::model {
namespace {

inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t next_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

// mask[i] = (hash slice >= threshold) * scale, in fp32 or fp64: a bf16 or fp16 mask would round the
// scale (1 / 0.9 becomes 1.109375 in bf16), so those inputs get an fp32 mask (see fast_dropout).
torch::Tensor make_mask(const torch::Tensor& like, double p) {
  const auto dtype = like.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  auto mask = torch::empty(like.sizes(), like.options().dtype(dtype).memory_format(torch::MemoryFormat::Contiguous));
  const int64_t n = mask.numel();
  const uint64_t seed = next_seed();
  const uint32_t threshold = static_cast<uint32_t>(std::lround(p * 65536.0));
  const double scale = 1.0 / (1.0 - p);
  AT_DISPATCH_FLOATING_TYPES(mask.scalar_type(), "nanogpt_dropout_mask", [&] {
    scalar_t* out = mask.data_ptr<scalar_t>();
    const scalar_t keep = static_cast<scalar_t>(scale), drop = static_cast<scalar_t>(0);
    const int64_t words = (n + 3) / 4;  // each 64-bit hash decides 4 elements
    at::parallel_for(0, words, 16384, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end; ++w) {
        const uint64_t h = splitmix64(seed + static_cast<uint64_t>(w + 1) * 0x9E3779B97F4A7C15ULL);
        const int64_t base = w * 4, count = std::min<int64_t>(4, n - base);
        for (int64_t j = 0; j < count; ++j)
          out[base + j] = ((h >> (16 * j)) & 0xFFFF) >= threshold ? keep : drop;
      }
    });
  });
  return mask;
}

}  // namespace

torch::Tensor fast_dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0.0) return x;
  if (!x.device().is_cpu()) return torch::dropout(x, p, training);
  torch::Tensor mask;
  {
    torch::NoGradGuard no_grad;
    mask = make_mask(x, p);
  }
  // A bf16 / fp16 x times the fp32 mask is an fp32 product, rounded once to x's dtype: each kept
  // value is x / (1 - p) to the nearest bf16 (as CUDA's fused dropout computes it), and so is its
  // gradient (autograd casts it back through the same two steps).
  auto y = x * mask;
  return y.scalar_type() == x.scalar_type() ? y : y.to(x.scalar_type());
}

}  // namespace nanogpt::model
