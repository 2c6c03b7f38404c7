// NANOGPT_KERNELS: the cap the suite sets to run, on one machine, the code other CPUs run. The
// training and sampling tests run once more under `avx2` and under `portable` (CMakeLists.txt); this
// checks that the cap they run under is in force (against the CPU's flags in /proc/cpuinfo), and
// that a kernel's AVX2 and baseline builds give what its clones give.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "model/fast/cross_entropy.h"
#include "model/fast/dropout.h"
#include "model/fast/kernel_choice.h"

using namespace nanogpt::model;

namespace {
// The CPU's flags as the kernel lists them (an independent reading of what the CPU has).
bool cpu_has(const std::string& flag) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}
}  // namespace

TEST(KernelChoice, FollowsNanogptKernels) {
  const char* env = std::getenv("NANOGPT_KERNELS");
  const std::string cap = env ? env : "";
  if (cap == "portable") {
    EXPECT_FALSE(simd_kernels());
    EXPECT_FALSE(avx512_kernels());
    EXPECT_FALSE(avx2_kernels());
  } else {
    EXPECT_TRUE(simd_kernels());
  }
  if (cap == "portable" || cap == "avx512f" || cap == "avx2") {
    EXPECT_FALSE(avx512_bf16_kernels());
    EXPECT_FALSE(vnni_kernels());
  }
  if (cap == "avx2") {
    EXPECT_FALSE(avx512_kernels());
  }
  // The loops' AVX2 builds stand in for a wider clone only under avx2, on a CPU with AVX-512.
  EXPECT_EQ(simd_capped_at_avx2(), cap == "avx2" && cpu_has("avx512f"));
#if defined(__x86_64__)
  if (cap != "portable") {  // every cap but portable takes what the CPU has, up to it
    EXPECT_EQ(avx2_kernels(), cpu_has("avx2") && cpu_has("fma"));
    if (cap != "avx2") {
      EXPECT_EQ(avx512_kernels(), cpu_has("avx512f"));
    }
  }
#endif
  // Narrower sets only ever come with the wider ones.
  if (avx512_bf16_kernels() || vnni_kernels()) {
    EXPECT_TRUE(avx512_kernels());
  }
  if (avx512_kernels()) {
    EXPECT_TRUE(avx2_kernels());
  }
}

TEST(KernelChoice, DropoutAndTheLossAgreeWithTheirReferencesUnderEveryCap) {
  // Under any cap, the kernels' results are the references' (the tensor-op dropout mask; LibTorch's
  // cross-entropy): run under `portable` this is the baseline builds' check.
  torch::manual_seed(3);
  auto x = torch::randn({7, 333});
  EXPECT_TRUE(torch::equal(apply_dropout_mask(x, 0.3, 42, 5, torch::kFloat),
                           apply_dropout_mask_by_ops(x, 0.3, 42, 5, torch::kFloat)));
  auto logits = torch::randn({37, 65}), targets = torch::randint(65, {37});
  auto ours = nanogpt::model::cross_entropy(logits, targets), ref = torch::nn::functional::cross_entropy(logits, targets);
  EXPECT_NEAR(ours.item<double>(), ref.item<double>(), 1e-5);
}
