// The optimizer through ATen's fused AdamW (train/adamw.h, Options::fused): the same updates as
// the loop it replaces, with clipping folded into grad_scale and an fp16 skip into found_inf, a
// learning rate read from its tensor at every step, and checkpoints that carry over either way.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "train/adamw.h"
#include "train/grad_scaler.h"
#include "train/lr_schedule.h"
#include "train/step.h"
#include "train_fixture.h"

using namespace nanogpt;

namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

// A matrix (weight decay) and a vector (none), the same values for every call with one seed.
Named make_params(uint64_t seed) {
  torch::manual_seed(seed);
  return {{"w", torch::randn({48, 24}).requires_grad_()}, {"b", torch::randn({24}).requires_grad_()}};
}

train::FlatAdamW::Options options(bool fused) {
  train::FlatAdamW::Options o;
  o.weight_decay = 0.1;
  o.fused = fused;
  return o;
}

// Writes the same gradients into both optimizers: large enough that clipping at 1.0 acts.
void set_gradients(train::FlatAdamW& a, train::FlatAdamW& b, int step) {
  torch::manual_seed(1000 + static_cast<uint64_t>(step));
  for (size_t i = 0; i < 2; ++i) {
    auto g = torch::randn_like(a.flat_grads()[i]) * 3.0;
    a.flat_grads()[i].copy_(g);
    b.flat_grads()[i].copy_(g);
  }
}

// Relative to the tensor's size (L2): one value near zero would make an elementwise ratio of the
// last bit's rounding (multiplying by the clip factor here, dividing by its inverse there) look large.
void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  const double err = ((got - want).norm() / want.norm()).item<double>();
  EXPECT_LE(err, 1e-6) << what << ": relative difference " << err;
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>()) << what;
}

}  // namespace

TEST(FusedAdamW, MatchesTheLoopOver100StepsWithClippingAndASkippedStep) {
  auto loop_params = make_params(0), fused_params = make_params(0);
  train::FlatAdamW loop(loop_params, options(false)), fused(fused_params, options(true));
  ASSERT_FALSE(loop.fused());
  ASSERT_TRUE(fused.fused());
  train::LrSchedule schedule{1e-2, 1e-3, 10, 100, true};
  const int skipped = 37;  // an fp16 step whose gradients overflowed
  auto found_inf = torch::zeros({1});
  for (int step = 0; step < 100; ++step) {
    set_gradients(loop, fused, step);
    const double lr = schedule.at(step);
    const double norm = loop.clip_grad_norm(1.0).item<double>();
    ASSERT_GT(norm, 1.0) << "clipping must act at step " << step;
    if (step != skipped) loop.step(lr);
    fused.set_lr(lr);
    found_inf.fill_(step == skipped ? 1.0 : 0.0);
    fused.step(fused.clip_divisor(1.0), found_inf);
    loop.zero_grad();
    fused.zero_grad();
  }
  EXPECT_EQ(loop.steps(), 99);
  EXPECT_EQ(fused.steps(), 99);
  for (size_t i = 0; i < loop_params.size(); ++i)
    expect_close(fused_params[i].second.detach(), loop_params[i].second.detach(), loop_params[i].first);
  const auto loop_state = loop.state(), fused_state = fused.state();
  ASSERT_EQ(loop_state.size(), fused_state.size());
  for (size_t i = 0; i < loop_state.size(); ++i) {
    EXPECT_EQ(fused_state[i].first, loop_state[i].first);
    if (loop_state[i].first == "step")
      EXPECT_EQ(fused_state[i].second.item<int64_t>(), loop_state[i].second.item<int64_t>());
    else
      expect_close(fused_state[i].second, loop_state[i].second, loop_state[i].first);
  }
}

TEST(FusedAdamW, ASkippedStepChangesNothing) {
  auto params = make_params(1), other = make_params(1);
  train::FlatAdamW fused(params, options(true)), unused(other, options(true));
  set_gradients(fused, unused, 0);
  fused.set_lr(1e-2);
  fused.step(std::nullopt, torch::zeros({1}));  // one real step, so the moments are not zero
  const auto before = params[0].second.detach().clone();
  const auto state_before = fused.state();
  std::vector<torch::Tensor> moments;
  for (const auto& [name, t] : state_before) moments.push_back(t.clone());
  set_gradients(fused, unused, 1);
  fused.step(fused.clip_divisor(1.0), torch::ones({1}));
  EXPECT_TRUE(torch::equal(params[0].second.detach(), before));
  EXPECT_EQ(fused.steps(), 1);
  const auto state_after = fused.state();
  for (size_t i = 0; i < moments.size(); ++i) EXPECT_TRUE(torch::equal(state_after[i].second, moments[i])) << state_after[i].first;
}

TEST(FusedAdamW, OnlyTheLearningRateTensorChangesTheUpdate) {
  auto a_params = make_params(2), b_params = make_params(2);
  train::FlatAdamW a(a_params, options(true)), b(b_params, options(true));
  const auto start = a_params[1].second.detach().clone();  // the bias: no weight decay
  set_gradients(a, b, 0);
  a.set_lr(1e-2);
  b.set_lr(1e-2);
  b.lr_tensor().fill_(2e-2);  // the tensor alone: the kernel must read it, not a copy of set_lr's value
  a.step(std::nullopt, std::nullopt);
  b.step(std::nullopt, std::nullopt);
  const auto step_a = a_params[1].second.detach() - start, step_b = b_params[1].second.detach() - start;
  ASSERT_GT(step_a.abs().max().item<double>(), 0.0);
  EXPECT_TRUE(torch::allclose(step_b, 2.0 * step_a, 1e-5, 1e-9)) << "AdamW's first step is lr * sign(g): twice the rate, twice the step";
}

TEST(FusedAdamW, ACheckpointCarriesOverBetweenFusedAndLoop) {
  auto params = make_params(3), resumed_params = make_params(99), loop_params = make_params(98);
  train::FlatAdamW fused(params, options(true)), resumed(resumed_params, options(true));
  train::FlatAdamW loop(loop_params, options(false));
  for (int step = 0; step < 4; ++step) {
    set_gradients(fused, loop, step);
    fused.step(1e-2);
    fused.zero_grad();
    loop.zero_grad();
  }
  const auto state = fused.state();
  resumed.load_state(state);
  loop.load_state(state);
  EXPECT_EQ(resumed.steps(), 4);
  EXPECT_EQ(loop.steps(), 4);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      resumed_params[i].second.copy_(params[i].second);
      loop_params[i].second.copy_(params[i].second);
    }
  }
  // One more step each: the resumed fused optimizer bit for bit, the loop within round-off.
  set_gradients(fused, resumed, 4);
  set_gradients(loop, resumed, 4);
  fused.step(5e-3);
  resumed.step(5e-3);
  loop.step(5e-3);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed_params[i].second, params[i].second)) << params[i].first;
    expect_close(loop_params[i].second.detach(), params[i].second.detach(), params[i].first);
  }
}

TEST(FusedAdamW, ATrainingStepWithTheLossScalerSkipsOnTheDeviceFlag) {
  // update_weights with a scaler whose scale overflows: the fused step reads found_inf itself.
  auto params = make_params(4);
  train::FlatAdamW fused(params, options(true));
  train::GradScaler::Options so;
  so.init_scale = 1024.0;
  train::GradScaler scaler(torch::kCPU, true, so);
  train::StepOptions step;
  step.scaler = &scaler;
  const auto before = params[0].second.detach().clone();
  fused.flat_grads()[0].fill_(std::numeric_limits<float>::infinity());
  train::optimizer_step(fused, 1e-2, step);
  EXPECT_TRUE(torch::equal(params[0].second.detach(), before));
  EXPECT_EQ(fused.steps(), 0);
  EXPECT_EQ(scaler.current_scale(), 512.0);
  fused.flat_grads()[0].fill_(512.0);  // 1 once unscaled
  train::optimizer_step(fused, 1e-2, step);
  EXPECT_EQ(fused.steps(), 1);
  EXPECT_FALSE(torch::equal(params[0].second.detach(), before));
  EXPECT_TRUE(fused.flat_grads()[0].eq(0).all().item<bool>()) << "the step zeroes the gradients";
}
