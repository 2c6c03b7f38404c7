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
#include "tensor_compare.h"
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

// Training under autocast, dense() is one autograd node (model/fast/linear.cpp) that must compute
// what autocast's at::linear computes (PyTorch's F.linear; the C++ frontend's F::linear adds a bias
// to 3-D inputs after the product, rounding twice): the same bf16 output, bit for bit, and the same
// gradient for a bf16 x. The gradients that land in fp32 (x's when x is fp32, the fp32 weight's) are
// the same products summed in fp32 and, where bf16_products_summed_in_fp32() (MKL's bf16 GEMM), not
// rounded to bf16 on the way: equal to the fp64 product of the same bf16 operands to fp32 rounding,
// and within a bf16 rounding of LibTorch's (which rounds them); elsewhere (oneDNN's, rounded once)
// equal to LibTorch's widened. The bias's gradient within bf16 rounding. Result::kWide gives the fp32
// product (the bias added in fp32; oneDNN's: autocast's product widened), and the same gradients.
// With and without a bias, for 2-D and 3-D inputs; ctest runs it under NANOGPT_BF16_GEMM=mkl and
// =onednn too, so both ways are checked on any CPU.
TEST(Bf16, AutocastDenseIsAutocastLinearInOneNode) {
  SKIP_WITHOUT_BF16();
  torch::manual_seed(5);
  const auto low = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kDouble); };
  for (bool bias : {false, true})
    for (auto x_dtype : {torch::kFloat, torch::kBFloat16})
      for (auto shape : {std::vector<int64_t>{37, 24}, std::vector<int64_t>{3, 11, 24}}) {
        const auto w0 = torch::randn({40, 24}), b0 = torch::randn({40}), x0 = torch::randn(shape).to(x_dtype);
        auto out_shape = shape;
        out_shape.back() = 40;
        const auto dy = torch::randn(out_shape).to(torch::kBFloat16);
        std::vector<torch::Tensor> out, grads;
        for (int way = 0; way < 3; ++way) {  // dense, LibTorch's linear, dense with Result::kWide
          auto w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_(), x = x0.clone().requires_grad_();
          const auto b_or_none = bias ? b : torch::Tensor();
          torch::Tensor y;
          {
            runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
            y = way == 0   ? model::dense(x, w, b_or_none)
                : way == 1 ? torch::linear(x, w, b_or_none)  // ATen's, as PyTorch's F.linear
                           : model::dense(x, w, b_or_none, model::Result::kWide);
          }
          y.backward(dy.to(y.scalar_type()));
          out.push_back(y);
          grads.insert(grads.end(), {x.grad(), w.grad(), bias ? b.grad() : torch::zeros({40})});
        }
        const std::string what = std::string(bias ? "bias" : "no bias") + ", x " + c10::toString(x_dtype) +
                                 ", rank " + std::to_string(shape.size());
        ASSERT_EQ(out[0].scalar_type(), torch::kBFloat16) << what;
        EXPECT_TRUE(torch::equal(out[0], out[1])) << what;
        // kWide: the fp32 sum of the bf16 operands' products, plus the fp32 bias.
        const auto x2 = x0.reshape({-1, 24});
        auto wide64 = low(x2).mm(low(w0).t()) + (bias ? b0.to(torch::kDouble) : torch::zeros({40}, torch::kDouble));
        ASSERT_EQ(out[2].scalar_type(), torch::kFloat) << what;
        const bool fp32_sums = model::bf16_products_summed_in_fp32();
        if (fp32_sums)
          EXPECT_LE(relative_error(out[2].reshape({-1, 40}), wide64), 1e-5) << what << ": wide output";
        else if (!bias)  // the bias is added in fp32 after the rounded product, autocast's linear in bf16
          EXPECT_TRUE(torch::equal(out[2], out[1].to(torch::kFloat))) << what << ": wide output, rounded once";
        EXPECT_LE(relative_error(out[2].reshape({-1, 40}), wide64), 1e-2) << what << ": wide output";
        EXPECT_LE(relative_error(out[1].reshape({-1, 40}), wide64), 1e-2) << what << ": within bf16 of the wide output";

        const auto dy2 = dy.reshape({-1, 40}).to(torch::kDouble);
        const auto dx64 = dy2.mm(low(w0)).reshape(shape), dw64 = dy2.t().mm(low(x2));
        EXPECT_EQ(grads[0].scalar_type(), x_dtype) << what;
        EXPECT_EQ(grads[1].scalar_type(), torch::kFloat) << what;
        if (x_dtype == torch::kBFloat16) {
          EXPECT_TRUE(torch::equal(grads[0], grads[3])) << what << ": dx";
        } else if (fp32_sums) {
          EXPECT_LE(relative_error(grads[0], dx64), 1e-5) << what << ": dx, summed in fp32";
          EXPECT_LE(relative_error(grads[3], dx64), 1e-2) << what << ": LibTorch's dx, rounded to bf16";
        } else {
          EXPECT_TRUE(torch::equal(grads[0], grads[3])) << what << ": dx, rounded once as LibTorch's";
        }
        if (fp32_sums)
          EXPECT_LE(relative_error(grads[1], dw64), 1e-5) << what << ": dw, summed in fp32";
        else
          EXPECT_TRUE(torch::equal(grads[1], grads[4])) << what << ": dw, rounded once as LibTorch's";
        EXPECT_LE(relative_error(grads[4], dw64), 1e-2) << what << ": LibTorch's dw, rounded to bf16";
        EXPECT_TRUE(torch::allclose(grads[2], grads[5], 1e-2, 1e-2)) << what << ": db";
        for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(grads[6 + i], grads[i])) << what << ": kWide's gradient " << i;
      }
}

// One training step under bf16 autocast follows the fp32 step: the forward runs in bf16 (logits
// bf16, the loss fp32), the loss and the gradients (the optimizer's first moments) agree to bf16
// precision, the weights stay fp32; then a few dozen bf16 steps learn the batch.
TEST(Bf16, TrainingStepTracksFloat32) {
  SKIP_WITHOUT_BF16();
  torch::manual_seed(6);
  const auto x = torch::randint(11, {4, 16}), y = torch::randint(11, {4, 16});
  const auto batch = [&] { return std::make_pair(x, y); };
  torch::manual_seed(0);
  model::GPT fp32(tiny_model_config());
  torch::manual_seed(0);
  model::GPT bf16(tiny_model_config());
  train::FlatAdamW fp32_opt(*fp32, {}), bf16_opt(*bf16, {});
  train::StepOptions fp32_step, bf16_step;
  bf16_step.autocast_dtype = torch::kBFloat16;
  {
    runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
    auto [logits, loss] = bf16->forward(x, y);
    EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  }
  const double lr = 1e-2;
  const double fp32_loss = train::train_step(fp32, fp32_opt, batch, lr, fp32_step).item<double>();
  const double bf16_loss = train::train_step(bf16, bf16_opt, batch, lr, bf16_step).item<double>();
  EXPECT_NEAR(bf16_loss, fp32_loss, 0.02);
  const auto fp32_state = fp32_opt.state(), bf16_state = bf16_opt.state();
  for (size_t i = 0; i < fp32_state.size(); ++i) {
    if (fp32_state[i].first.rfind("exp_avg.", 0) != 0) continue;
    const auto a = fp32_state[i].second, g = bf16_state[i].second;
    const double cosine = (a * g).sum().item<double>() / (a.norm() * g.norm()).item<double>();
    EXPECT_GT(cosine, 0.999) << fp32_state[i].first;
    EXPECT_NEAR(g.norm().item<double>() / a.norm().item<double>(), 1.0, 0.02) << fp32_state[i].first;
  }
  for (const auto& p : bf16->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
  double last = bf16_loss;
  for (int step = 0; step < 30; ++step) last = train::train_step(bf16, bf16_opt, batch, lr, bf16_step).item<double>();
  EXPECT_LT(last, bf16_loss - 1.0);
}

// A bf16 run with dropout, stopped and resumed, equals the uninterrupted bf16 run bit for bit:
// autocast, the fp32 dropout mask and evaluation all behave the same after a checkpoint.
TEST(Bf16, TrainingWithDropoutResumesExactly) {
  SKIP_WITHOUT_BF16();
  TempDir dir("bf16_resume");
  auto full = tiny_config(dir.path + "/full");
  full.dtype = "bfloat16";
  full.max_iters = 12;
  full.eval_interval = 6;
  const auto result = train::Trainer(full, true).run();
  EXPECT_TRUE(std::isfinite(result.last_val_loss));
  auto half = tiny_config(dir.path + "/half");
  half.dtype = "bfloat16";
  half.max_iters = 6;
  half.eval_interval = 6;
  train::Trainer(half, true).run();
  half.max_iters = 12;
  half.init_from = "resume";
  EXPECT_EQ(train::Trainer(half, true).run().last_val_loss, result.last_val_loss);
  const auto a = train_losses(full.out_dir + "/metrics.csv"), b = train_losses(half.out_dir + "/metrics.csv");
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b);
}
