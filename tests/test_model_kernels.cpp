// NANOGPT_KERNELS: the cap the suite sets to run, on one machine, the code other CPUs run. The
// training and sampling tests run once more under `portable` (CMakeLists.txt); this checks that the
// cap they run under is in force, and that a kernel's baseline build gives what its clones give.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "model/fast/cross_entropy.h"
#include "model/fast/dropout.h"
#include "model/fast/kernel_choice.h"

using namespace nanogpt::model;

TEST(KernelChoice, FollowsNanogptKernels) {
  const char* env = std::getenv("NANOGPT_KERNELS");
  const std::string cap = env ? env : "";
  if (cap == "portable") {
    EXPECT_FALSE(simd_kernels());
    EXPECT_FALSE(avx512_kernels());
  } else {
    EXPECT_TRUE(simd_kernels());
  }
  if (cap == "portable" || cap == "avx512f") {
    EXPECT_FALSE(avx512_bf16_kernels());
    EXPECT_FALSE(vnni_kernels());
  }
  // Narrower sets only ever come with the wider ones.
  if (avx512_bf16_kernels() || vnni_kernels()) {
    EXPECT_TRUE(avx512_kernels());
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
