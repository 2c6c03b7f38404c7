// bf16 autocast on the CPU, against fp32 references: dropout's scale, the one-row dense path, a
// training step, and a bf16 training run that resumes exactly. A CPU without bf16 instructions runs
// these through LibTorch's scalar kernels: slow for real models, a second or two for these.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <memory>

#include "model/fast/dropout.h"
#include "model/fast/linear.h"
#include "model/gpt.h"
#include "runtime/device.h"
#include "train/adamw.h"
#include "train/step.h"
#include "train/trainer.h"
#include "train_fixture.h"

using namespace nanogpt;
using namespace nanogpt::testing;

namespace {

// Whether this LibTorch build multiplies bf16 matrices on the CPU at all (fast or not).
bool cpu_runs_bf16() {
  try {
    const auto a = torch::ones({4, 4}, torch::kBFloat16);
    return a.matmul(a).sum().item<double>() == 64.0;
  } catch (const std::exception&) {
    return false;
  }
}

#define SKIP_WITHOUT_BF16() \
  if (!cpu_runs_bf16()) GTEST_SKIP() << "this LibTorch cannot multiply bf16 matrices on the CPU"

}  // namespace

// Kept values are x / (1 - p) rounded once to bf16, not x times a bf16-rounded scale (1 / 0.9 is
// 1.109375 in bf16, 0.16% low); the gradient likewise.
TEST(Bf16, DropoutScalesKeptValuesByExactlyOneOverOneMinusP) {
  SKIP_WITHOUT_BF16();
  const double p = 0.1;
  torch::manual_seed(3);
  // [1, 2): positive, and x / 0.9 needs more bits than bf16 holds, so any rounding of the scale shows.
  auto x = (torch::rand({256, 256}) + 1.0).to(torch::kBFloat16).requires_grad_();
  torch::Tensor y;
  {
    runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
    model::Dropout dropout(p);
    y = dropout(x);
  }
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  const auto kept = y != 0;
  EXPECT_NEAR(1.0 - kept.to(torch::kDouble).mean().item<double>(), p, 0.005);
  const auto expected = (x.detach().to(torch::kFloat) * (1.0 / (1.0 - p))).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(y.masked_select(kept), expected.masked_select(kept)));
  const double scale = y.detach().to(torch::kDouble).sum().item<double>() /
                       (x.detach().to(torch::kDouble) * kept).sum().item<double>();
  std::cout << "[bf16] dropout p=0.1: kept values scaled by " << scale << " (1 / 0.9 = " << 1.0 / 0.9 << ")\n";
  EXPECT_NEAR(scale, 1.0 / (1.0 - p), 1e-4);

  const auto grad_out = (torch::rand({256, 256}) + 1.0).to(torch::kBFloat16);
  y.backward(grad_out);
  const auto expected_grad = (grad_out.to(torch::kFloat) * kept * (1.0 / (1.0 - p))).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(x.grad(), expected_grad));
}

// One row under autocast takes linear's bf16 arithmetic, as every row of a batch does, not the
// fp32 matrix-vector fast path; outside autocast the fast path agrees with linear.
TEST(Bf16, OneRowDenseUnderAutocastMatchesLinear) {
  SKIP_WITHOUT_BF16();
  torch::manual_seed(4);
  const auto w = torch::randn({48, 32}, torch::requires_grad()), b = torch::randn({48}, torch::requires_grad());
  const auto x = torch::randn({1, 1, 32});
  torch::Tensor y, reference;
  {
    runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
    y = model::dense(x, w, b);
    reference = torch::nn::functional::linear(x, w, b);
  }
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(y.sizes(), reference.sizes());
  EXPECT_TRUE(torch::equal(y, reference));
  y.to(torch::kFloat).sum().backward();
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat);  // fp32 master weights get fp32 gradients
  EXPECT_TRUE(torch::allclose(w.grad(), x.reshape({1, 32}).expand({48, 32}), 1e-2, 1e-2));
  EXPECT_TRUE(torch::allclose(model::dense(x, w, b), torch::nn::functional::linear(x, w, b), 1e-5, 1e-6));
}
