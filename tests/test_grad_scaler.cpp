// float16 training: the dynamic loss scaler against a written-out reference of GradScaler's rules,
// a skipped step that leaves the weights alone, and exact resume with the scale in the checkpoint.
// Everything runs on CPU tensors (CPU autocast has float16 too); tests/test_cuda.cpp repeats the
// training on a GPU where there is one.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "train/checkpoint.h"
#include "train/grad_scaler.h"
#include "train/step.h"
#include "train/trainer.h"
#include "train_fixture.h"

using namespace nanogpt;
using namespace nanogpt::testing;

// GradScaler's rules, written out: halve on inf/NaN and restart the count; double after
// `interval` good steps in a row.
struct ReferenceScaler {
  double scale;
  int64_t good = 0, interval;
  void update(bool found_inf) {
    if (found_inf) {
      scale *= 0.5;
      good = 0;
    } else if (++good == interval) {
      scale *= 2.0;
      good = 0;
    }
  }
};

TEST(GradScaler, UnscalesAndFollowsGrowthAndBackoffRules) {
  train::GradScaler::Options o;
  o.init_scale = 1024.0;
  o.growth_interval = 3;
  train::GradScaler scaler(torch::kCPU, true, o);
  ReferenceScaler ref{1024.0, 0, 3};
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  // A pattern of good and bad steps, with inf and NaN in either of two gradient buffers.
  const std::vector<int> pattern = {0, 0, 0, 0, 1, 0, 0, 0, 0, 2, 0, 1, 1, 0, 0, 0};
  for (size_t step = 0; step < pattern.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const double s = scaler.current_scale();
    ASSERT_EQ(s, ref.scale);
    auto a = torch::tensor({1.0f, -2.0f, 3.0f}) * s, b = torch::tensor({0.5f}) * s;
    if (pattern[step] == 1) a[1] = inf;
    if (pattern[step] == 2) b[0] = nan;
    EXPECT_TRUE(torch::allclose(scaler.scale(torch::tensor(2.0f)), torch::tensor(static_cast<float>(2.0 * s))));
    scaler.unscale({a, b});
    EXPECT_EQ(scaler.step_ok(), pattern[step] == 0);
    if (pattern[step] == 0) {  // divided back exactly (powers of two)
      EXPECT_TRUE(torch::equal(a, torch::tensor({1.0f, -2.0f, 3.0f})));
      EXPECT_TRUE(torch::equal(b, torch::tensor({0.5f})));
    }
    scaler.update();
    ref.update(pattern[step] != 0);
    EXPECT_EQ(scaler.growth_tracker(), ref.good);
  }
  EXPECT_NE(ref.scale, 1024.0);  // the pattern moved the scale both ways
}

TEST(GradScaler, DisabledPassesThrough) {
  train::GradScaler scaler(torch::kCPU, false);
  auto loss = torch::tensor(3.0f);
  EXPECT_TRUE(torch::equal(scaler.scale(loss), loss));
  auto g = torch::tensor({std::numeric_limits<float>::infinity()});
  scaler.unscale({g});
  EXPECT_TRUE(scaler.step_ok());
  EXPECT_EQ(scaler.current_scale(), 1.0);
}

TEST(GradScaler, RestoreRejectsNonsense) {
  train::GradScaler scaler(torch::kCPU, true);
  EXPECT_THROW(scaler.restore(std::nan(""), 0), std::runtime_error);
  EXPECT_THROW(scaler.restore(-1.0, 0), std::runtime_error);
  scaler.restore(512.0, 7);
  EXPECT_EQ(scaler.current_scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 7);
}

// A scale so large that fp16 gradients overflow: the step is skipped (weights and optimizer
// untouched) and the scale halves, until it fits and steps are taken again.
TEST(GradScaler, OverflowingStepIsSkippedAndTheScaleBacksOff) {
  TempDir dir("fp16_skip");
  auto c = tiny_config(dir.path);
  c.model.dropout = 0.0;
  torch::manual_seed(0);
  c.model.vocab_size = 65;
  model::GPT model(c.model);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
  train::FlatAdamW optimizer(named, {});
  train::GradScaler::Options o;
  o.init_scale = std::ldexp(1.0, 60);
  train::GradScaler scaler(torch::kCPU, true, o);
  train::StepOptions step;
  step.autocast_dtype = torch::kHalf;
  step.scaler = &scaler;
  auto x = torch::randint(65, {4, 16}), y = torch::randint(65, {4, 16});
  auto next = [&] { return std::make_pair(x, y); };
  auto before = model->named_parameters()["h.0.attn.q_proj.weight"].clone();
  train::train_step(model, optimizer, next, 1e-3, step);
  EXPECT_TRUE(torch::equal(model->named_parameters()["h.0.attn.q_proj.weight"], before)) << "an overflowing step changed the weights";
  EXPECT_EQ(optimizer.steps(), 0);
  EXPECT_EQ(scaler.current_scale(), std::ldexp(1.0, 59));
  int skipped = 1;
  while (optimizer.steps() == 0 && skipped < 60) {
    train::train_step(model, optimizer, next, 1e-3, step);
    skipped += optimizer.steps() == 0;
  }
  EXPECT_EQ(optimizer.steps(), 1);
  EXPECT_FALSE(torch::equal(model->named_parameters()["h.0.attn.q_proj.weight"], before));
  EXPECT_GT(skipped, 10);  // 2^60 is far above what fp16 gradients hold
}

TEST(GradScaler, Float16TrainingLearnsAndResumesExactlyWithTheScaleInTheCheckpoint) {
  TempDir dir("fp16_resume");
  auto full = tiny_config(dir.path + "/full");
  full.dtype = "float16";
  auto result = train::Trainer(full, true).run();
  EXPECT_LT(result.last_val_loss, std::log(65.0) - 0.5);
  auto half = tiny_config(dir.path + "/half");
  half.dtype = "float16";
  half.max_iters = 10;
  train::Trainer(half, true).run();
  const auto meta = train::read_checkpoint_meta(half.out_dir + "/" + train::kLastCheckpoint);
  EXPECT_GT(meta.loss_scale, 1.0);
  half.max_iters = 20;
  half.init_from = "resume";
  train::Trainer(half, true).run();
  auto a = train_losses(full.out_dir + "/metrics.csv"), b = train_losses(half.out_dir + "/metrics.csv");
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
}
