// What of CUDA graph training runs on a CPU: the cuda_graphs setting's resolution, the fixed batch
// buffers a step reads (train/device_batch.h), and GraphedStep's eager path and fallback, which
// must compute exactly what train_step computes. The graphs themselves: tests/test_cuda.cpp.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "data/batch_sampler.h"
#include "train/adamw.h"
#include "train/device_batch.h"
#include "train/graphed_step.h"
#include "train/step.h"
#include "train/trainer.h"
#include "train_fixture.h"

using namespace nanogpt;

TEST(CudaGraphs, AutoIsOnForOneCudaProcessWithTheFusedOptimizerOnly) {
  const torch::Device cpu(torch::kCPU), gpu(torch::kCUDA, 0);
  EXPECT_TRUE(train::resolve_cuda_graphs("auto", gpu, 1, true).on);
  EXPECT_TRUE(train::resolve_cuda_graphs("auto", gpu, 1, true).note.empty());
  EXPECT_TRUE(train::resolve_cuda_graphs("true", gpu, 1, true).on);
  EXPECT_FALSE(train::resolve_cuda_graphs("false", gpu, 1, true).on);
  const auto on_cpu = train::resolve_cuda_graphs("auto", cpu, 1, true);
  EXPECT_FALSE(on_cpu.on);
  EXPECT_TRUE(on_cpu.note.empty()) << "auto on a CPU says nothing";
  const auto asked_on_cpu = train::resolve_cuda_graphs("true", cpu, 1, false);
  EXPECT_FALSE(asked_on_cpu.on);
  EXPECT_NE(asked_on_cpu.note.find("no effect"), std::string::npos) << asked_on_cpu.note;
  const auto ddp = train::resolve_cuda_graphs("auto", gpu, 2, true);
  EXPECT_FALSE(ddp.on);
  EXPECT_NE(ddp.note.find("[ddp]"), std::string::npos) << ddp.note;
  EXPECT_FALSE(train::resolve_cuda_graphs("auto", gpu, 1, false).on);
  EXPECT_THROW(train::resolve_cuda_graphs("yes", gpu, 1, true), std::runtime_error);
}

TEST(DeviceBatch, EveryMicroBatchLandsInTheSameBuffers) {
  const auto tokens = torch::arange(500, torch::kInt32) % 37;
  data::BatchSampler sampler(tokens, 4, 16, 7), reference(tokens, 4, 16, 7);
  train::DeviceBatch batch(4, 16, torch::kCPU);
  const void* x_ptr = batch.x().data_ptr();
  const void* y_ptr = batch.y().data_ptr();
  for (int i = 0; i < 5; ++i) {
    batch.load(sampler);
    EXPECT_EQ(batch.x().data_ptr(), x_ptr);
    EXPECT_EQ(batch.y().data_ptr(), y_ptr);
    const auto [x, y] = reference.next();
    EXPECT_TRUE(torch::equal(batch.x(), x)) << "batch " << i;
    EXPECT_TRUE(torch::equal(batch.y(), y)) << "batch " << i;
  }
  EXPECT_EQ(sampler.state(), reference.state()) << "the generator moved as next() moves it";
}

TEST(DeviceBatch, NextIntoRefusesBuffersOfAnotherShape) {
  data::BatchSampler sampler(torch::arange(100, torch::kInt32), 2, 8, 1);
  auto x = torch::empty({2, 9}, torch::kInt64), y = torch::empty({2, 8}, torch::kInt64);
  EXPECT_THROW(sampler.next_into(x, y), std::runtime_error);
  auto x32 = torch::empty({2, 8}, torch::kInt32);
  EXPECT_THROW(sampler.next_into(x32, y), std::runtime_error);
}

// Without the CUDA plugin capture fails at the first step after the warm-up: one line, and the
// run goes on eagerly. Every step, before and after, equals train_step's on the same batches.
TEST(GraphedStep, WarmUpAndFallbackStepsEqualTrainStepBitForBit) {
  auto config = nanogpt::testing::tiny_model_config();
  config.dropout = 0.1;
  torch::manual_seed(5);
  model::GPT eager_model(config), graphed_model(config);
  {
    torch::NoGradGuard no_grad;
    auto source = eager_model->named_parameters();
    for (auto& p : graphed_model->named_parameters()) p.value().copy_(source[p.key()]);
  }
  train::FlatAdamW::Options o;
  o.fused = true;
  train::FlatAdamW eager_opt(*eager_model, o), graphed_opt(*graphed_model, o);
  train::StepOptions step;
  step.gradient_accumulation_steps = 2;
  std::vector<std::string> lines;
  train::GraphedStep graphed(graphed_model, graphed_opt, step, 2, [&](const std::string& l) { lines.push_back(l); });

  const auto tokens = torch::arange(2000, torch::kInt32) % config.vocab_size;
  data::BatchSampler eager_sampler(tokens, 3, config.block_size, 11), graphed_sampler(tokens, 3, config.block_size, 11);
  train::DeviceBatch eager_batch(3, config.block_size, torch::kCPU), graphed_batch(3, config.block_size, torch::kCPU);
  uint64_t eager_micro = 0, graphed_micro = 0;  // dropout's seed per micro-batch, as the trainer sets it
  auto next = [](data::BatchSampler& sampler, train::DeviceBatch& batch, uint64_t& micro) {
    torch::manual_seed(1000 + micro++);
    batch.load(sampler);
    return std::make_pair(batch.x(), batch.y());
  };
  for (int s = 0; s < 6; ++s) {
    const double lr = 1e-3 * (s + 1);
    const double want = train::train_step(eager_model, eager_opt,
                                          [&] { return next(eager_sampler, eager_batch, eager_micro); }, lr, step)
                            .item<double>();
    const double got = graphed.step([&] { return next(graphed_sampler, graphed_batch, graphed_micro); }, lr).item<double>();
    EXPECT_EQ(got, want) << "step " << s;
  }
  EXPECT_TRUE(graphed.failed());
  EXPECT_FALSE(graphed.replaying());
  ASSERT_EQ(lines.size(), 1u) << "one line when capture fails";
  EXPECT_NE(lines[0].find("CUDA graphs off"), std::string::npos) << lines[0];
  auto eager_params = eager_model->named_parameters();
  for (const auto& p : graphed_model->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), eager_params[p.key()])) << p.key();
  EXPECT_EQ(graphed_opt.steps(), eager_opt.steps());
}

TEST(CudaGraphs, TheKeyIsCheckedAndOnACpuTrueSaysItHasNoEffect) {
  nanogpt::testing::TempDir dir("graphs_key");
  auto c = nanogpt::testing::tiny_config(dir.path);
  c.cuda_graphs = "maybe";
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.cuda_graphs = "true";
  c.device = "cpu";
  c.max_iters = 4;
  const auto result = train::Trainer(c, true).run();
  EXPECT_EQ(result.iter, 4);
  const std::string log = nanogpt::testing::read_text(c.out_dir + "/train.log");
  EXPECT_NE(log.find("cuda_graphs: true has no effect on cpu"), std::string::npos) << log;
}
