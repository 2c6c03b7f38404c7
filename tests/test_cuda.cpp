// On a CUDA GPU: device choice, the fused attention against the math path, bf16 and float16
// (loss-scaled) training, exact checkpoints of the scaler, the out-of-memory message, steps as
// CUDA graphs (against eager steps, under sync debug mode, resumed) with the profile of a step, and
// RoPE's kernel against the lesson's three kernels. Every test skips with the reason on a machine
// without a GPU (scripts/gpu_check.sh runs them on one), except CudaRope.*OnTheCpu: the plugin
// loads without a GPU, and its RoPE entry runs the kernel's arithmetic on CPU tensors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "data/batch_sampler.h"
#include "model/fast/dropout.h"
#include "model/generate.h"
#include "model/positions.h"
#include "model/static_decoder.h"
#include "runtime/cuda_plugin.h"
#include "runtime/device.h"
#include "model/gpt.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/device_batch.h"
#include "train/graphed_step.h"
#include "train/step.h"
#include "train/trainer.h"
#include "train_fixture.h"

using namespace nanogpt;
using namespace nanogpt::testing;

#define REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU on this machine (LibTorch " << runtime::torch_version() << ")"

TEST(Cuda, AutoPicksTheGpu) {
  REQUIRE_GPU();
  EXPECT_TRUE(runtime::resolve_device("auto").is_cuda());
}

TEST(Cuda, SdpaMatchesMathOnTheGpu) {
  REQUIRE_GPU();
  for (int64_t nkv : {4, 2}) {
    model::ModelConfig c;
    c.vocab_size = 11;
    c.block_size = 64;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = nkv;
    c.n_embd = 64;
    c.attention = "math";
    auto s = c;
    s.attention = "sdpa";
    torch::manual_seed(3);
    model::GPT math_model(c), sdpa_model(s);
    {
      torch::NoGradGuard no_grad;
      auto src = math_model->named_parameters();
      for (auto& p : sdpa_model->named_parameters()) p.value().copy_(src[p.key()]);
    }
    math_model->to(torch::kCUDA);
    sdpa_model->to(torch::kCUDA);
    auto idx = torch::randint(11, {4, 64}).to(torch::kCUDA);
    for (bool bf16 : {false, true}) {
      torch::Tensor a, b;
      {
        runtime::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, bf16);
        a = math_model->logits(idx).to(torch::kFloat);
        b = sdpa_model->logits(idx).to(torch::kFloat);
      }
      const double rel = ((a - b).abs().max() / b.abs().max()).item<double>();
      EXPECT_LE(rel, bf16 ? 2e-2 : 1e-4) << "nkv=" << nkv << (bf16 ? " bf16" : " fp32");
    }
  }
}

TEST(Cuda, Bfloat16AndFloat16TrainingLearn) {
  REQUIRE_GPU();
  for (const char* dtype : {"bfloat16", "float16"}) {
    TempDir dir(std::string("cuda_") + dtype);
    auto c = tiny_config(dir.path);
    c.device = "cuda";
    c.dtype = dtype;
    c.max_iters = 60;
    c.eval_interval = 30;
    auto result = train::Trainer(c, true).run();
    EXPECT_LT(result.last_val_loss, std::log(65.0) - 0.5) << dtype;
    const auto meta = train::read_checkpoint_meta(c.out_dir + "/" + train::kLastCheckpoint);
    if (std::string(dtype) == "float16")
      EXPECT_GT(meta.loss_scale, 1.0);
    else
      EXPECT_EQ(meta.loss_scale, 1.0);
  }
}

TEST(Cuda, OutOfMemoryIsOneLineNamingTheSizes) {
  REQUIRE_GPU();
  TempDir dir("cuda_oom");
  auto c = tiny_config(dir.path, 400000);
  c.device = "cuda";
  c.model.n_embd = 1024;
  c.model.n_head = 8;
  c.model.block_size = 1024;
  c.batch_size = 1 << 14;  // (B, T, 4C) activations of 256 GiB
  c.max_iters = 1;
  try {
    train::Trainer(c, true).run();
    FAIL() << "no out-of-memory error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(what.find("out of memory on cuda"), std::string::npos) << what;
    EXPECT_NE(what.find("batch_size 16384"), std::string::npos) << what;
    EXPECT_NE(what.find("gradient_accumulation_steps"), std::string::npos) << what;
  }
}

TEST(Cuda, Float32TrainingUsesTf32AsTheConfigSays) {
  REQUIRE_GPU();
  for (bool tf32 : {true, false}) {
    TempDir dir(std::string("cuda_fp32_") + (tf32 ? "tf32" : "ieee"));
    auto c = tiny_config(dir.path);
    c.device = "auto";  // resolves to "cuda" without an index: the process's own GPU
    c.dtype = "float32";
    c.tf32 = tf32;
    c.max_iters = 60;
    c.eval_interval = 30;
    train::Trainer trainer(c, true);
    EXPECT_EQ(at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL),
              tf32 ? at::Float32Precision::TF32 : at::Float32Precision::IEEE);
    auto result = trainer.run();
    EXPECT_LT(result.last_val_loss, std::log(65.0) - 0.5);
    EXPECT_GT(result.peak_gpu_allocated_mb, 0.0);
    EXPECT_NE(read_text(c.out_dir + "/train.log").find("peak GPU memory"), std::string::npos);
  }
}

TEST(Cuda, ChunkedAttentionWithDropoutDrawsTheCpuMaskAndTrains) {
  REQUIRE_GPU();
  auto x = torch::randn({4, 64, 64});
  auto on_cpu = model::apply_dropout_mask(x, 0.2, 99, 17, torch::kFloat);
  auto on_gpu = model::apply_dropout_mask(x.to(torch::kCUDA), 0.2, 99, 17, torch::kFloat).cpu();
  EXPECT_TRUE(torch::equal(on_cpu, on_gpu));
  TempDir dir("cuda_chunked");
  auto c = tiny_config(dir.path);
  c.device = "cuda";
  c.model.attention = "chunked";
  c.model.dropout = 0.1;
  c.max_iters = 40;
  c.eval_interval = 40;
  EXPECT_LT(train::Trainer(c, true).run().last_val_loss, std::log(65.0) - 0.3);
}

TEST(Cuda, SdpaGradientsMatchTheMathPath) {
  REQUIRE_GPU();
  // The fused kernels' backward (flash in bf16/fp16, efficient or math in fp32) against the spelled-out
  // softmax(q kᵀ / √hs) v, causal, in fp64 on the GPU.
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    torch::manual_seed(11);
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
    auto q = torch::randn({2, 4, 128, 64}, opts).requires_grad_(true);
    auto k = torch::randn({2, 4, 128, 64}, opts).requires_grad_(true);
    auto v = torch::randn({2, 4, 128, 64}, opts).requires_grad_(true);
    auto dy = torch::randn({2, 4, 128, 64}, opts);
    auto y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    auto grads = torch::autograd::grad({y}, {q, k, v}, {dy});
    auto q64 = q.detach().to(torch::kDouble).requires_grad_(true), k64 = k.detach().to(torch::kDouble).requires_grad_(true),
         v64 = v.detach().to(torch::kDouble).requires_grad_(true);
    auto mask = torch::ones({128, 128}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBool)).tril();
    auto att = q64.matmul(k64.transpose(-2, -1)) / 8.0;  // (B, nh, T, T)
    auto y64 = att.masked_fill(mask.logical_not(), -INFINITY).softmax(-1).matmul(v64);
    auto ref = torch::autograd::grad({y64}, {q64, k64, v64}, {dy.to(torch::kDouble)});
    const double tol = dtype == torch::kFloat ? 1e-3 : 3e-2;
    auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
      return ((a.to(torch::kDouble) - b).abs().max() / b.abs().max()).item<double>();
    };
    EXPECT_LE(rel(y.detach(), y64.detach()), tol) << c10::toString(dtype);
    for (int i = 0; i < 3; ++i) EXPECT_LE(rel(grads[i], ref[i]), tol) << c10::toString(dtype) << " grad " << i;
  }
}

TEST(Cuda, SamplingOnTheGpuMatchesTheCpu) {
  REQUIRE_GPU();
  TempDir dir("cuda_sample");
  auto c = tiny_config(dir.path);
  c.max_iters = 30;
  c.eval_interval = 30;
  train::Trainer(c, true).run();  // on the CPU
  auto load = [&](torch::Device device) { return train::load_model(c.out_dir + "/" + train::kLastCheckpoint, device).model; };
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, at::Float32Precision::IEEE);
  auto cpu = load(torch::kCPU), gpu = load(torch::Device("cuda:0"));
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  std::mt19937_64 rng_a(1), rng_b(1);
  const std::vector<int64_t> prompt = {1, 2, 3};
  auto a = model::generate(cpu, prompt, 1, 60, greedy, rng_a), b = model::generate(gpu, prompt, 1, 60, greedy, rng_b);
  EXPECT_EQ(a, b) << "greedy tokens, KV cache";
  greedy.use_cache = false;
  EXPECT_EQ(model::generate(gpu, prompt, 1, 60, greedy, rng_b), a) << "greedy tokens, no cache";
  model::BeamOptions beam;
  beam.width = 3;
  auto ba = model::beam_search(cpu, prompt, 30, beam), bb = model::beam_search(gpu, prompt, 30, beam);
  ASSERT_EQ(ba.size(), bb.size());
  for (size_t i = 0; i < ba.size(); ++i) {
    EXPECT_EQ(ba[i].tokens, bb[i].tokens) << "beam " << i;
    EXPECT_NEAR(ba[i].log_prob, bb[i].log_prob, 1e-3) << "beam " << i;
  }
  // Sampled (temperature 1): the same seed gives the same text on the GPU twice, streamed or not.
  model::SamplingOptions sampled;
  sampled.temperature = 1.0;
  std::mt19937_64 r1(5), r2(5);
  std::vector<int64_t> streamed;
  auto s1 = model::generate(gpu, prompt, 1, 40, sampled, r1, [&](const std::vector<int64_t>& t, const torch::Tensor&) {
    streamed.push_back(t[0]);
    return true;
  });
  auto s2 = model::generate(gpu, prompt, 1, 40, sampled, r2);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(std::vector<int64_t>(s1[0].begin() + 3, s1[0].end()), streamed);
}

TEST(Cuda, ACheckpointMovesCpuToGpuToCpuAndResumesExactly) {
  REQUIRE_GPU();
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, at::Float32Precision::IEEE);
  TempDir dir("cuda_moves");
  auto base = tiny_config(dir.path);
  base.model.dropout = 0.0;     // CPU and GPU draw dropout masks from different generators
  base.model.attention = "math";  // deterministic backward on the GPU (the fused kernels' may not be)
  base.tf32 = false;
  auto leg = [&](const std::string& out, const std::string& device, int64_t max_iters, bool resume) {
    auto c = base;
    c.out_dir = dir.path + "/" + out;
    c.device = device;
    c.max_iters = max_iters;
    c.init_from = resume ? "resume" : "scratch";
    return train::Trainer(c, true).run();
  };
  // CPU for 10 steps; the checkpoint goes on on the GPU to 20; that one goes back to the CPU to 30.
  leg("moved", "cpu", 10, false);
  leg("moved", "cuda", 20, true);
  const auto back = leg("moved", "cpu", 30, true);
  EXPECT_EQ(back.iter, 30);
  // The GPU leg against a GPU run that resumed the same CPU checkpoint, bit for bit; the whole run
  // against the CPU all the way, within float32 rounding.
  leg("cpu_only", "cpu", 30, false);
  auto moved = train_losses(dir.path + "/moved/metrics.csv"), cpu_only = train_losses(dir.path + "/cpu_only/metrics.csv");
  ASSERT_EQ(moved.size(), 30u);
  ASSERT_EQ(cpu_only.size(), 30u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(moved[i], cpu_only[i]) << "iter " << i << " (the CPU leg)";
  for (size_t i = 10; i < 30; ++i) EXPECT_NEAR(std::stod(moved[i]), std::stod(cpu_only[i]), 2e-3) << "iter " << i;
  leg("gpu_a", "cpu", 10, false);
  leg("gpu_a", "cuda", 20, true);
  leg("gpu_b", "cpu", 10, false);
  leg("gpu_b", "cuda", 15, true);
  leg("gpu_b", "cuda", 20, true);
  EXPECT_EQ(train_losses(dir.path + "/gpu_a/metrics.csv"), train_losses(dir.path + "/gpu_b/metrics.csv"))
      << "resuming on the GPU from a GPU checkpoint is exact";
}

// ---- CUDA graphs of a step, the fused optimizer, no host syncs, the profile ----------------------

namespace {

// A model, its fused optimizer and its batches on the GPU, as the trainer sets them up.
struct GpuRun {
  model::GPT model{nullptr};
  std::unique_ptr<train::FlatAdamW> optimizer;
  std::unique_ptr<data::BatchSampler> sampler;
  std::unique_ptr<train::DeviceBatch> batch;
  train::StepOptions step;
  uint64_t micro = 0;

  GpuRun(const model::ModelConfig& config, int64_t batch_size, int64_t micro_steps, torch::ScalarType dtype) {
    torch::manual_seed(42);
    model = model::GPT(config);
    model->to(torch::kCUDA);
    optimizer = std::make_unique<train::FlatAdamW>(*model, train::FlatAdamW::Options{});
    const auto tokens = torch::randint(config.vocab_size, {200000}, torch::kInt32);
    sampler = std::make_unique<data::BatchSampler>(tokens, batch_size, config.block_size, 7);
    batch = std::make_unique<train::DeviceBatch>(batch_size, config.block_size, torch::Device(torch::kCUDA, 0));
    step.gradient_accumulation_steps = micro_steps;
    step.autocast_dtype = dtype;
    step.device = torch::Device(torch::kCUDA, 0);
  }
  // Each micro-batch's dropout seed, as the trainer sets it: the masks follow (run, micro-batch).
  std::pair<torch::Tensor, torch::Tensor> next() {
    auto gen = at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, 0));
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_current_seed(1000 + micro++);
    }
    batch->load(*sampler);
    return {batch->x(), batch->y()};
  }
};

model::ModelConfig graph_test_model() {
  auto c = tiny_model_config();
  c.vocab_size = 65;
  c.block_size = 64;
  c.dropout = 0.1;  // masks must match eager's through the generator's graph-safe offsets
  c.attention = "math";  // deterministic backward
  return c;
}

}  // namespace

TEST(CudaGraphs, TwentyReplayedStepsEqualEagerSteps) {
  REQUIRE_GPU();
  runtime::resolve_device("cuda");  // loads the plugin that captures
  runtime::set_tf32(false);
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    GpuRun eager(graph_test_model(), 8, 2, dtype), graphed(graph_test_model(), 8, 2, dtype);
    std::vector<std::string> lines;
    train::GraphedStep steps(graphed.model, *graphed.optimizer, graphed.step, 3, [&](const std::string& l) { lines.push_back(l); });
    const double tolerance = dtype == torch::kFloat ? 1e-6 : 2e-2;
    for (int s = 0; s < 20; ++s) {
      const double lr = 1e-3 * (1 + s % 5);
      const double want = train::train_step(eager.model, *eager.optimizer, [&] { return eager.next(); }, lr, eager.step).item<double>();
      const double got = steps.step([&] { return graphed.next(); }, lr).item<double>();
      EXPECT_NEAR(got, want, tolerance * std::abs(want)) << "step " << s << (dtype == torch::kFloat ? " fp32" : " bf16");
    }
    EXPECT_TRUE(steps.replaying()) << (lines.empty() ? "" : lines[0]);
    EXPECT_EQ(graphed.optimizer->steps(), 20);
  }
  runtime::set_tf32(true);
}

TEST(CudaFusedAdamW, MatchesTheLoopOnTheCpu) {
  REQUIRE_GPU();
  torch::manual_seed(9);
  auto w = torch::randn({64, 32}), b = torch::randn({32});
  std::vector<std::pair<std::string, torch::Tensor>> cpu = {{"w", w.clone().requires_grad_()}, {"b", b.clone().requires_grad_()}};
  std::vector<std::pair<std::string, torch::Tensor>> gpu = {{"w", w.to(torch::kCUDA).requires_grad_()},
                                                            {"b", b.to(torch::kCUDA).requires_grad_()}};
  train::FlatAdamW loop(cpu, {}), fused(gpu, {});
  ASSERT_FALSE(loop.fused());
  ASSERT_TRUE(fused.fused()) << "CUDA parameters take ATen's fused kernel by default";
  for (int s = 0; s < 50; ++s) {
    for (size_t i = 0; i < 2; ++i) {
      auto g = torch::randn_like(loop.flat_grads()[i]) * 3.0;
      loop.flat_grads()[i].copy_(g);
      fused.flat_grads()[i].copy_(g);
    }
    loop.clip_grad_norm(1.0);
    loop.step(1e-2 / (1 + s));
    fused.set_lr(1e-2 / (1 + s));
    fused.step(fused.clip_divisor(1.0), std::nullopt);
  }
  for (size_t i = 0; i < 2; ++i) {
    const auto got = gpu[i].second.detach().cpu(), want = cpu[i].second.detach();
    EXPECT_LE(((got - want).norm() / want.norm()).item<double>(), 1e-6) << cpu[i].first;
  }
  EXPECT_EQ(fused.steps(), 50);
}

TEST(CudaGraphs, AStepReadsNothingBackUnderSyncDebugError) {
  REQUIRE_GPU();
  runtime::resolve_device("cuda");
  const auto* plugin = runtime::cuda_plugin();
  ASSERT_NE(plugin, nullptr);
  GpuRun run(graph_test_model(), 8, 2, torch::kBFloat16);
  train::GraphedStep graphed(run.model, *run.optimizer, run.step, 3, nullptr);
  train::GraphedStep eager(run.model, *run.optimizer, run.step, 1000, nullptr);  // never captures
  for (int s = 0; s < 5; ++s) graphed.step([&] { return run.next(); }, 1e-3);  // warm-up and capture
  ASSERT_TRUE(graphed.replaying());
  torch::cuda::synchronize();
  plugin->set_sync_debug_mode(2);  // a host sync throws from here
  EXPECT_NO_THROW(graphed.step([&] { return run.next(); }, 1e-3)) << "a replayed step";
  EXPECT_NO_THROW(eager.step([&] { return run.next(); }, 1e-3)) << "an eager step with the fused optimizer";
  plugin->set_sync_debug_mode(0);
  std::printf("[sync] one replayed step and one eager step ran under sync debug mode error\n");
}

TEST(CudaGraphs, ResumeFromACheckpointTakenUnderGraphsIsExact) {
  REQUIRE_GPU();
  TempDir dir("cuda_graph_resume");
  auto base = tiny_config(dir.path);
  base.device = "cuda";
  base.cuda_graphs = "true";
  base.model.attention = "math";
  base.tf32 = false;
  auto leg = [&](const std::string& out, int64_t max_iters, bool resume, const std::string& graphs) {
    auto c = base;
    c.out_dir = dir.path + "/" + out;
    c.max_iters = max_iters;
    c.init_from = resume ? "resume" : "scratch";
    c.cuda_graphs = graphs;
    return train::Trainer(c, true).run();
  };
  leg("whole", 20, false, "true");
  leg("halves", 10, false, "true");
  leg("halves", 20, true, "true");
  leg("eager", 20, false, "false");
  const auto whole = train_losses(dir.path + "/whole/metrics.csv"), halves = train_losses(dir.path + "/halves/metrics.csv");
  EXPECT_EQ(whole, halves) << "resuming under graphs is exact";
  const auto eager = train_losses(dir.path + "/eager/metrics.csv");
  ASSERT_EQ(whole.size(), eager.size());
  ASSERT_GT(whole.size(), 5u);
  const auto loss_of = [](const std::string& row) { return std::stod(row.substr(row.find(':') + 1)); };  // "iter:loss"
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_NEAR(loss_of(whole[i]), loss_of(eager[i]), 1e-6 * loss_of(eager[i])) << whole[i] << " against " << eager[i];
}

// The full Shakespeare preset's step (6 layers, 6 heads, 384 wide, block 256, batch 64, bf16),
// eager and replayed, under the Kineto profiler: the table scripts/gpu_check.sh prints.
TEST(CudaProfile, ThreeStepsOfTheFullPresetEagerAndReplayed) {
  REQUIRE_GPU();
  runtime::resolve_device("cuda");
  const auto* plugin = runtime::cuda_plugin();
  ASSERT_NE(plugin, nullptr);
  auto c = model::ModelConfig{};
  c.vocab_size = 65;
  c.block_size = 256;
  c.n_layer = 6;
  c.n_head = 6;
  c.n_embd = 384;
  c.dropout = 0.2;
  GpuRun run(c, 64, 1, torch::kBFloat16);
  for (bool graphs : {false, true}) {
    train::GraphedStep steps(run.model, *run.optimizer, run.step, graphs ? 3 : 1000000, nullptr);
    for (int s = 0; s < 5; ++s) steps.step([&] { return run.next(); }, 1e-3);
    const auto p = plugin->profile([&] {
      for (int s = 0; s < 3; ++s) steps.step([&] { return run.next(); }, 1e-3);
    });
    const char* name = graphs ? "graphs" : "eager";
    std::printf("[profile] %s: 3 steps in %.2f ms wall, GPU busy %.2f ms (%.0f%%), %.0f kernels per step\n", name,
                p.wall_ms, p.gpu_busy_ms, 100.0 * p.gpu_busy_ms / p.wall_ms, static_cast<double>(p.kernels) / 3.0);
    std::printf("[profile] %s: %-60s %8s %10s\n", name, "top kernels", "calls", "ms");
    for (size_t i = 0; i < std::min<size_t>(10, p.by_time.size()); ++i)
      std::printf("[profile] %s: %-60.60s %8lld %10.3f\n", name, p.by_time[i].name.c_str(),
                  static_cast<long long>(p.by_time[i].calls), p.by_time[i].total_ms);
    EXPECT_GT(p.kernels, 0);
    EXPECT_LE(p.gpu_busy_ms, p.wall_ms * 1.01);
  }
}

// ---- Sampling on the GPU: the static KV cache and its step as CUDA graphs (model/static_decoder.h) ----

namespace {
// A checkpoint trained briefly on the CPU, loaded on the GPU in fp32 with TF32 off.
model::GPT static_test_gpu_model(const std::string& name) {
  TempDir dir(name);
  auto c = tiny_config(dir.path);
  c.max_iters = 30;
  c.eval_interval = 30;
  train::Trainer(c, true).run();
  runtime::resolve_device("cuda");  // the plugin, for its graphs
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, at::Float32Precision::IEEE);
  return train::load_model(c.out_dir + "/" + train::kLastCheckpoint, torch::Device("cuda:0")).model;
}

std::unique_ptr<model::StepGraphs> gpu_graphs() {
  const auto* plugin = runtime::cuda_plugin();
  return plugin ? plugin->decode_graphs() : nullptr;
}
}  // namespace

// Greedy through the graphs equals the general path on the GPU, past block_size (16) with the RoPE
// window sliding and exact; the capture succeeds.
TEST(CudaSampling, GraphedGreedyEqualsTheGeneralPath) {
  REQUIRE_GPU();
  auto gpu = static_test_gpu_model("cuda_static_greedy");
  ASSERT_NE(runtime::cuda_plugin(), nullptr);
  for (bool exact : {false, true}) {
    model::SamplingOptions greedy;
    greedy.temperature = 0.0;
    greedy.exact_window = exact;
    std::mt19937_64 rng(1);
    const std::vector<int64_t> prompt = {1, 2, 3, 4, 5};
    auto expected = model::generate(gpu, prompt, 2, 60, greedy, rng);
    model::StaticDecoder decoder(gpu, 2, torch::kFloat, exact);
    EXPECT_EQ(decoder.capture(gpu_graphs()), "");
    EXPECT_TRUE(decoder.graphed());
    EXPECT_EQ(model::generate_static(decoder, prompt, 2, 60, greedy), expected) << (exact ? "exact window" : "sliding");
  }
}

// fp32, TF32 off: each of 16 prompts gives the same greedy text alone (bucket 1) as in a batch of 16
// (bucket 16: other GEMM shapes, maybe other kernels), and its logits agree within 1e-4.
TEST(CudaSampling, GreedyAloneEqualsInABatchOf16) {
  REQUIRE_GPU();
  auto gpu = static_test_gpu_model("cuda_static_batch");
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t i = 0; i < 16; ++i) prompts.push_back({1 + i % 7, 2 + i % 5, 3 + i, 10 + i % 3});
  model::StaticDecoder batch(gpu, 16, torch::kFloat, false), alone(gpu, 1, torch::kFloat, false);
  ASSERT_EQ(batch.capture(gpu_graphs()), "");
  ASSERT_EQ(alone.capture(gpu_graphs()), "");
  std::vector<std::vector<int64_t>> texts = prompts;
  std::vector<torch::Tensor> batch_logits;
  for (int64_t i = 0; i < 16; ++i) {
    batch.set_options(i, greedy);
    batch.start(i, prompts[i]);
  }
  for (int step = 0; step < 40; ++step) {
    auto tokens = batch.step(16);
    batch_logits.push_back(batch.logits(16));
    for (int64_t i = 0; i < 16; ++i) texts[i].push_back(tokens[i]);
  }
  for (int64_t i = 0; i < 16; ++i) {
    alone.set_options(0, greedy);
    alone.start(0, prompts[i]);
    std::vector<int64_t> text = prompts[i];
    for (int step = 0; step < 40; ++step) {
      text.push_back(alone.step(1)[0]);
      const double diff = (alone.logits(1)[0] - batch_logits[step][i]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-4) << "prompt " << i << " step " << step;
    }
    EXPECT_EQ(text, texts[i]) << "prompt " << i;
  }
}

// Sampled through the graphs: every token had a non-zero probability under top-k 3, the same seed
// draws the same text (the generator's philox state read at each replay), another seed another.
TEST(CudaSampling, GraphedDrawsFollowTheSeedAndTheFilters) {
  REQUIRE_GPU();
  auto gpu = static_test_gpu_model("cuda_static_sampled");
  model::SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 3;
  model::StaticDecoder decoder(gpu, 4, torch::kFloat, false);
  ASSERT_EQ(decoder.capture(gpu_graphs()), "");
  auto run = [&](uint64_t seed) {
    torch::manual_seed(seed);
    return model::generate_static(
        decoder, {1, 2, 3}, 4, 50, o,
        [&](const std::vector<int64_t>& tokens, const torch::Tensor& probs) {
          for (size_t b = 0; b < tokens.size(); ++b) EXPECT_GT(probs[b][tokens[b]].item<float>(), 0.0f);
          return true;
        },
        /*with_probs=*/true);
  };
  auto a = run(7), b = run(7), c = run(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a[0], a[1]);
}

namespace {

// Rotates x (B, T, H, hs) at positions start.. as heads [0, n_first) and the rest: a fused RoPE.
using RopeSplit = std::function<std::pair<torch::Tensor, torch::Tensor>(model::Rope& rope, const torch::Tensor& x,
                                                                        int64_t start, int64_t n_first)>;

// `fused` against the lesson's three kernels (Rope::apply_reference) on `device` in `dtype`, the
// rotated queries and keys and the gradient of a loss through them: with as many keys as queries
// and with grouped-query keys, at positions within the tables (block_size 16) and past them (they
// grow), x a slice of a wider QKV product (its rows packed, the tensor not contiguous), and with the
// keys' gradient missing (their rows of dx zero). fp32 agrees within 1e-6 (and 1e-6 of |y|); bf16
// and fp16 within their tolerance of the three kernels in that dtype (tables and products rounded to
// it), and within half a unit in the last place of the fp32 reference: the kernel rounds once.
void expect_rope_matches_reference(torch::Device device, torch::ScalarType dtype, const RopeSplit& fused) {
  struct Case {
    int64_t n_head, n_kv_head, hs, start, T;
  };
  const double tolerance = dtype == torch::kFloat ? 1e-6 : dtype == torch::kBFloat16 ? 3e-2 : 5e-3;
  const double half_ulp = dtype == torch::kBFloat16 ? 1.0 / 256 : dtype == torch::kHalf ? 1.0 / 2048 : 0.0;
  for (const Case c : {Case{4, 4, 8, 0, 12}, Case{4, 2, 8, 3, 13}, Case{4, 2, 8, 14, 9}, Case{12, 4, 64, 5, 20}}) {
    const int64_t B = 2, H = c.n_head + c.n_kv_head;
    torch::manual_seed(7);
    const auto opts = torch::TensorOptions().device(device).dtype(dtype);
    const auto qkv = torch::randn({B, c.T, (H + c.n_kv_head) * c.hs}, opts);  // q, k, v side by side
    const auto dq = torch::randn({B, c.n_head, c.T, c.hs}, opts), dk = torch::randn({B, c.n_kv_head, c.T, c.hs}, opts);
    for (bool key_gradient : {true, false}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " on " + device.str() + ": heads " + std::to_string(c.n_head) +
                   "+" + std::to_string(c.n_kv_head) + ", hs " + std::to_string(c.hs) + ", positions " +
                   std::to_string(c.start) + ".." + std::to_string(c.start + c.T - 1) +
                   (key_gradient ? "" : ", no gradient for the keys"));
      // q (B, nh, T, hs), k (B, nkv, T, hs), and the gradient of qkv, with `split` in dtype `as`.
      auto run = [&](const RopeSplit& split, model::Rope& rope, torch::ScalarType as) {
        auto leaf = qkv.to(as).detach().requires_grad_(true);  // (B, T, (H + nkv) hs)
        auto x = leaf.narrow(2, 0, H * c.hs).view({B, c.T, H, c.hs});  // (B, T, H, hs)
        auto [q, k] = split(rope, x, c.start, c.n_head);
        auto grads = key_gradient ? torch::autograd::grad({q, k}, {leaf}, {dq.to(as), dk.to(as)})
                                  : torch::autograd::grad({q}, {leaf}, {dq.to(as)});
        return std::vector<torch::Tensor>{q.detach().to(torch::kFloat), k.detach().to(torch::kFloat),
                                          grads[0].to(torch::kFloat)};
      };
      const RopeSplit reference = [](model::Rope& rope, const torch::Tensor& x, int64_t start, int64_t n_first) {
        auto parts = rope.apply_reference(x, start).split_with_sizes({n_first, x.size(2) - n_first}, 2);
        return std::make_pair(parts[0].transpose(1, 2), parts[1].transpose(1, 2));
      };
      model::Rope rope(16, c.hs, 10000.0), lesson(16, c.hs, 10000.0);
      const auto got = run(fused, rope, dtype), want = run(reference, lesson, dtype);
      const char* names[] = {"q", "k", "gradient"};
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(got[i].sizes(), want[i].sizes()) << names[i];
        EXPECT_TRUE(torch::allclose(got[i], want[i], tolerance, tolerance))
            << names[i] << ": max |fused - three kernels| " << (got[i] - want[i]).abs().max().item<double>();
      }
      if (dtype == torch::kFloat) continue;
      const auto exact = run(reference, lesson, torch::kFloat);  // the same values, in fp32
      for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(((got[i] - exact[i]).abs() <= exact[i].abs() * (half_ulp + 1e-6) + 1e-6).all().item<bool>())
            << names[i] << " is not the fp32 result rounded once: max |fused - fp32| "
            << (got[i] - exact[i]).abs().max().item<double>();
    }
  }
}

// The CUDA plugin, loaded for the CPU form of its RoPE entry; null, with the reason, where this
// build has none.
const runtime::CudaPlugin* load_plugin(std::string* why) {
  try {
    runtime::load_cuda("cuda");
  } catch (const std::exception& e) {
    *why = e.what();
  }
  if (!runtime::cuda_plugin() && why->empty())
    *why = "no CUDA plugin in this build (LibTorch without CUDA, or no nvcc when configured)";
  return runtime::cuda_plugin();
}

}  // namespace

// The plugin's RoPE entry on CPU tensors runs the kernel's own lines (rope_kernel_math.h) in a host
// loop, and the same autograd wrapper: all but the launch, checked without a GPU.
TEST(CudaRope, TheKernelsArithmeticMatchesTheLessonOnTheCpu) {
  std::string why;
  const runtime::CudaPlugin* plugin = load_plugin(&why);
  if (!plugin) GTEST_SKIP() << why;
  const RopeSplit kernel = [&](model::Rope& rope, const torch::Tensor& x, int64_t start, int64_t n_first) {
    auto [cos2, sin2] = rope.tables(start + x.size(1), x.device());
    return plugin->rope_rotate_split(x, cos2, sin2, start, n_first);
  };
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) expect_rope_matches_reference(torch::kCPU, dtype, kernel);

  model::Rope rope(16, 8, 10000.0);
  auto [cos2, sin2] = rope.tables(16, torch::kCPU);
  auto x = torch::randn({1, 4, 2, 8});
  EXPECT_FALSE(plugin->rope_rotate_split(x.to(torch::kDouble), cos2, sin2, 0, 1).first.defined()) << "fp64: not taken";
  try {
    plugin->rope_rotate_split(x, cos2, sin2, 13, 1);  // positions 13..16 of 16
    FAIL() << "tables too short were taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[model] RoPE kernel: the tables must"), std::string::npos) << e.what();
  }
}

// On a GPU, Rope runs the plugin's kernel (its outputs contiguous, where the three kernels' are
// transposed views) and agrees with the three kernels there.
TEST(CudaRope, OneKernelMatchesTheThreeKernelsOnTheGpu) {
  REQUIRE_GPU();
  runtime::resolve_device("cuda");  // loads the plugin
  ASSERT_NE(runtime::cuda_plugin(), nullptr);
  const RopeSplit through_rope = [](model::Rope& rope, const torch::Tensor& x, int64_t start, int64_t n_first) {
    auto parts = rope.apply_split(x, start, n_first);
    EXPECT_TRUE(parts.first.is_contiguous() && parts.second.is_contiguous()) << "not the plugin's kernel";
    return parts;
  };
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf})
    expect_rope_matches_reference(torch::kCUDA, dtype, through_rope);
  // apply: every head in the first part.
  model::Rope rope(16, 8, 10000.0);
  auto x = torch::randn({2, 20, 6, 8}, torch::TensorOptions().device(torch::kCUDA));
  EXPECT_TRUE(torch::allclose(rope.apply(x, 7), rope.apply_reference(x, 7), 1e-6, 1e-6));
}

namespace {

// The residual add + dropout + norm's CPU form, the GPU's kernel, or either through the plugin.
using ResidualNorm = std::function<std::pair<torch::Tensor, torch::Tensor>(
    const torch::Tensor& x, const torch::Tensor& y, double p, const torch::Tensor& rng, const torch::Tensor& weight,
    const torch::Tensor& bias, double eps, bool rms)>;

// {seed, offset} as the plugin's entry takes them.
torch::Tensor rng_of(uint64_t seed, uint64_t offset) {
  return torch::tensor({static_cast<int64_t>(seed), static_cast<int64_t>(offset)}, torch::kLong);
}

// The keep mask (1 kept, 0 dropped) that `fused` draws for (seed, offset) over a tensor of `sizes`:
// h = 0 + dropout(1) is 1 / (1 - p) where kept.
torch::Tensor dropout_mask(const ResidualNorm& fused, torch::IntArrayRef sizes, double p, const torch::Tensor& rng,
                           torch::Device device) {
  const auto opts = torch::TensorOptions().device(device);
  auto h = fused(torch::zeros(sizes, opts), torch::ones(sizes, opts), p, rng, {}, {}, 0.0, false).first;
  return h.ne(0).to(torch::kFloat);
}

// `fused` against the unfused ops it replaces on `device` (h = x + y * mask / (1 - p), then LibTorch's
// layer_norm or the lesson's RMSNorm, differentiated by autograd), with the mask `fused` draws: h, n
// and the gradients of x, y, weight and bias, for y in fp32, bf16 and fp16, with and without dropout,
// LayerNorm with and without bias, RMSNorm and no norm, widths from one warp's 4 columns a lane to
// 1,024, and with the gradient of h or of n missing. h and n within 1e-6 (and 1e-6 of the value), the
// gradients, which hold sums, within 1e-5; the gradient of a bf16 / fp16 y within one unit in its
// last place besides: both sides round nearly equal fp32 values once.
void expect_residual_norm_matches_unfused(torch::Device device, const ResidualNorm& fused) {
  struct Case {
    const char* norm;  // layernorm | layernorm_nobias | rmsnorm | none
    int64_t C;
    double p;
  };
  const std::vector<Case> cases = {{"layernorm", 64, 0.0},    {"layernorm", 384, 0.2},   {"layernorm_nobias", 128, 0.1},
                                   {"rmsnorm", 256, 0.0},     {"rmsnorm", 512, 0.3},     {"none", 384, 0.2},
                                   {"layernorm", 1024, 0.2},  {"layernorm", 132, 0.0}};
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (const Case& c : cases) {
      for (int missing = 0; missing < 3; ++missing) {  // 0: both gradients, 1: no gradient of h, 2: none of n
        const bool norm = std::string(c.norm) != "none", rms = std::string(c.norm) == "rmsnorm",
                   bias = std::string(c.norm) == "layernorm";
        if (!norm && missing > 0) continue;
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " on " + device.str() + ": " + c.norm + ", C " +
                     std::to_string(c.C) + ", p " + std::to_string(c.p) +
                     (missing == 1 ? ", no gradient of h" : missing == 2 ? ", no gradient of n" : ""));
        torch::manual_seed(11);
        const auto f32 = torch::TensorOptions().device(device);
        const int64_t B = 3, T = 5, C = c.C;
        const auto x0 = torch::randn({B, T, C}, f32), y0 = torch::randn({B, T, C}, f32).to(dtype);
        const auto w0 = 1 + 0.1 * torch::randn({C}, f32), b0 = 0.1 * torch::randn({C}, f32);
        const auto gh = torch::randn({B, T, C}, f32), gn = torch::randn({B, T, C}, f32);
        const double eps = 1e-5;
        const auto rng = rng_of(0x1234567890ABCDEFULL, 8);
        const auto mask = dropout_mask(fused, {B, T, C}, c.p, rng, device);
        if (c.p == 0) {
          EXPECT_TRUE(mask.eq(1).all().item<bool>()) << "dropped without dropout";
        }

        // h, n and the gradients of x, y, weight, bias (undefined where none), by `run`.
        using Run = std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor&, const torch::Tensor&,
                                                                          const torch::Tensor&, const torch::Tensor&)>;
        auto outputs = [&](const Run& run) {
          auto x = x0.clone().requires_grad_(true), y = y0.clone().requires_grad_(true);
          auto w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
          auto [h, n] = run(x, y, norm ? w : torch::Tensor(), bias ? b : torch::Tensor());
          std::vector<torch::Tensor> outs{h}, grads{gh};
          if (norm) outs.push_back(n), grads.push_back(gn);
          if (missing == 1) outs.erase(outs.begin()), grads.erase(grads.begin());
          if (missing == 2) outs.pop_back(), grads.pop_back();
          torch::autograd::backward(outs, grads);
          std::vector<torch::Tensor> got{h.detach(), norm ? n.detach() : torch::Tensor(), x.grad(), y.grad().to(torch::kFloat)};
          if (norm) got.push_back(w.grad());
          if (bias) got.push_back(b.grad());
          return got;
        };
        const Run kernel = [&](const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& w,
                               const torch::Tensor& b) { return fused(x, y, c.p, rng, w, b, eps, rms); };
        const Run unfused = [&](const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& w,
                                const torch::Tensor& b) {
          const float scale = static_cast<float>(1.0 / (1.0 - c.p));
          auto h = c.p > 0 ? x + y.to(torch::kFloat) * mask * scale : x + y;  // (B, T, C) fp32
          torch::Tensor n;
          if (rms) n = h * torch::rsqrt(h.pow(2).mean(-1, true) + eps) * w;
          else if (norm) n = torch::layer_norm(h, {C}, w, b, eps);
          return std::make_pair(h, n);
        };
        const auto got = outputs(kernel), want = outputs(unfused);
        const char* names[] = {"h", "n", "dx", "dy", "dw", "db"};
        for (size_t i = 0; i < want.size(); ++i) {
          if (!want[i].defined()) continue;
          ASSERT_TRUE(got[i].defined()) << names[i];
          const double rounding = i == 3 && dtype == torch::kBFloat16 ? 1.0 / 128 : i == 3 && dtype == torch::kHalf ? 1.0 / 1024 : 0.0;
          // The gradients hold sums over C columns (dx, dy) or B * T rows (dw, db) taken in another order
          // than LibTorch's: a few fp32 roundings of terms ~1.
          const double fp32 = i >= 2 ? 1e-5 : 1e-6;
          const auto diff = (got[i] - want[i]).abs();
          EXPECT_TRUE((diff <= want[i].abs() * (rounding + fp32) + fp32).all().item<bool>())
              << names[i] << ": max |kernel - unfused| " << diff.max().item<double>();
        }
      }
    }
  }
}

ResidualNorm through(const runtime::CudaPlugin* plugin) {
  return [plugin](const torch::Tensor& x, const torch::Tensor& y, double p, const torch::Tensor& rng,
                  const torch::Tensor& weight, const torch::Tensor& bias, double eps, bool rms) {
    return plugin->residual_dropout_norm(x, y, p, rng, weight, bias, eps, rms);
  };
}

}  // namespace

// The plugin's residual add + dropout + norm on CPU tensors runs the kernels' own lines
// (residual_norm_kernel_math.h) in a host loop, and the same autograd wrapper: all but the launch.
TEST(CudaResidualNorm, TheKernelsArithmeticMatchesTheUnfusedOpsOnTheCpu) {
  std::string why;
  const runtime::CudaPlugin* plugin = load_plugin(&why);
  if (!plugin) GTEST_SKIP() << why;
  expect_residual_norm_matches_unfused(torch::kCPU, through(plugin));
}

// The mask is Philox4x32-10 (Random123's known answer: counter 0, key 0 gives 6627e8d5 e169c58d
// bc57ac4c 9b00dbd8, i.e. 0.399, 0.881, 0.736, 0.605 of 2³²) compared with p 2³²; it drops a p share
// of elements, is the same for the same (seed, offset), and another for another offset or seed.
TEST(CudaResidualNorm, TheDropoutMaskIsPhiloxAtSeedOffsetAndIndex) {
  std::string why;
  const runtime::CudaPlugin* plugin = load_plugin(&why);
  if (!plugin) GTEST_SKIP() << why;
  const auto fused = through(plugin);
  const auto zero_key = rng_of(0xFFFFFFFF00000000ULL, 0);  // key (seed_lo, seed_hi ^ ~0) = (0, 0)
  const std::vector<std::pair<double, std::vector<float>>> expected = {
      {0.3, {1, 1, 1, 1}}, {0.5, {0, 1, 1, 1}}, {0.7, {0, 1, 1, 0}}, {0.85, {0, 1, 0, 0}}, {0.9, {0, 0, 0, 0}}};
  for (const auto& [p, kept] : expected)
    EXPECT_TRUE(torch::equal(dropout_mask(fused, {1, 4}, p, zero_key, torch::kCPU), torch::tensor(kept).view({1, 4})))
        << "p " << p << ": " << dropout_mask(fused, {1, 4}, p, zero_key, torch::kCPU);

  const auto a = dropout_mask(fused, {64, 1024}, 0.2, rng_of(42, 0), torch::kCPU);
  EXPECT_NEAR(1.0 - a.mean().item<double>(), 0.2, 0.01);
  EXPECT_TRUE(torch::equal(a, dropout_mask(fused, {64, 1024}, 0.2, rng_of(42, 0), torch::kCPU)));
  EXPECT_FALSE(torch::equal(a, dropout_mask(fused, {64, 1024}, 0.2, rng_of(42, 4), torch::kCPU)));
  EXPECT_FALSE(torch::equal(a, dropout_mask(fused, {64, 1024}, 0.2, rng_of(43, 0), torch::kCPU)));
  EXPECT_LT(a.view({64, 1024}).ne(a.view({64, 1024}).roll(1, 0)).to(torch::kFloat).mean().item<double>(), 0.4)
      << "rows' masks too alike to be independent";  // two independent masks at p 0.2 differ in 32 %
}

TEST(CudaResidualNorm, InputsItDoesNotTakeAreLeftToTheCaller) {
  std::string why;
  const runtime::CudaPlugin* plugin = load_plugin(&why);
  if (!plugin) GTEST_SKIP() << why;
  const auto x = torch::randn({2, 3, 8}), w = torch::ones({8});
  EXPECT_FALSE(plugin->residual_dropout_norm(x.to(torch::kDouble), x, 0, {}, w, {}, 1e-5, false).first.defined()) << "fp64 x";
  EXPECT_FALSE(plugin->residual_dropout_norm(x.to(torch::kBFloat16), x, 0, {}, w, {}, 1e-5, false).first.defined()) << "bf16 x";
  const auto odd = torch::randn({2, 3, 6});
  EXPECT_FALSE(plugin->residual_dropout_norm(odd, odd, 0, {}, torch::ones({6}), {}, 1e-5, false).first.defined()) << "C 6";
  const auto wide = torch::randn({1, 2, 1028});
  EXPECT_FALSE(plugin->residual_dropout_norm(wide, wide, 0, {}, torch::ones({1028}), {}, 1e-5, false).first.defined()) << "C 1028";
  try {
    plugin->residual_dropout_norm(x, x, 0.2, {}, w, {}, 1e-5, false);
    FAIL() << "dropout on the host without a seed was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[model] residual norm kernel"), std::string::npos) << e.what();
  }
}

// On a GPU: the kernels against the unfused ops, the GPU's mask equal to the CPU form's for the same
// (seed, offset), and the generator's masks: fresh each call, the same after the same manual_seed, and
// the same in backward as in forward (dy is zero exactly where h dropped y).
TEST(CudaResidualNorm, OneKernelMatchesTheUnfusedOpsOnTheGpu) {
  REQUIRE_GPU();
  runtime::resolve_device("cuda");  // loads the plugin
  const runtime::CudaPlugin* plugin = runtime::cuda_plugin();
  ASSERT_NE(plugin, nullptr);
  const auto fused = through(plugin);
  expect_residual_norm_matches_unfused(torch::kCUDA, fused);
  const auto rng = rng_of(977, 12);
  EXPECT_TRUE(torch::equal(dropout_mask(fused, {48, 384}, 0.2, rng, torch::kCUDA).cpu(),
                           dropout_mask(fused, {48, 384}, 0.2, rng, torch::kCPU)));

  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(5);
  const auto first = dropout_mask(fused, {48, 384}, 0.2, {}, torch::kCUDA),
             second = dropout_mask(fused, {48, 384}, 0.2, {}, torch::kCUDA);
  EXPECT_FALSE(torch::equal(first, second)) << "the generator's offset did not move";
  torch::manual_seed(5);
  EXPECT_TRUE(torch::equal(first, dropout_mask(fused, {48, 384}, 0.2, {}, torch::kCUDA)));
  auto y = torch::randn({48, 384}, opts).requires_grad_(true);
  auto h = plugin->residual_dropout_norm(torch::zeros({48, 384}, opts), y, 0.2, {}, {}, {}, 0.0, false).first;
  h.sum().backward();
  EXPECT_TRUE(torch::equal(h.detach().ne(0), y.grad().ne(0))) << "backward dropped other elements than forward";
}

// A block on the GPU (its residual adds fused) computes what the same block computes on the CPU
// (the lesson's ops), forward and backward, without dropout.
TEST(CudaResidualNorm, ABlockOnTheGpuMatchesItsCpuForm) {
  REQUIRE_GPU();
  runtime::resolve_device("cuda");
  for (const char* norm : {"layernorm", "rmsnorm"}) {
    SCOPED_TRACE(norm);
    model::ModelConfig config;
    config.n_layer = 1;
    config.n_head = 4;
    config.n_embd = 64;
    config.block_size = 16;
    config.vocab_size = 32;
    config.dropout = 0.0;
    config.norm = norm;
    config.pos_encoding = "learned";  // no rotary tables to pass
    at::globalContext().setAllowTF32CuBLAS(false);  // fp32 products on both sides
    torch::manual_seed(3);
    model::Block cpu(config);
    model::Block gpu(config);
    {
      torch::NoGradGuard no_grad;
      for (auto& item : gpu->named_parameters()) item.value().copy_(cpu->named_parameters()[item.key()]);
    }
    gpu->to(torch::kCUDA);
    model::AttentionContext ctx;
    auto x = torch::randn({2, 16, 64}), g = torch::randn({2, 16, 64});
    auto xc = x.clone().requires_grad_(true), xg = x.cuda().requires_grad_(true);
    auto yc = cpu->forward(xc, ctx), yg = gpu->forward(xg, ctx);
    (yc * g).sum().backward();
    (yg * g.cuda()).sum().backward();
    EXPECT_TRUE(torch::allclose(yg.cpu(), yc, 1e-4, 1e-4)) << (yg.cpu() - yc).abs().max();
    EXPECT_TRUE(torch::allclose(xg.grad().cpu(), xc.grad(), 1e-4, 1e-4)) << (xg.grad().cpu() - xc.grad()).abs().max();
    for (auto& item : gpu->named_parameters())
      EXPECT_TRUE(torch::allclose(item.value().grad().cpu(), cpu->named_parameters()[item.key()].grad(), 1e-3, 1e-4))
          << item.key();
  }
}

namespace {

using CrossEntropy = std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& targets)>;

// `fused` against LibTorch's cross_entropy on the logits in fp32 on `device`: the loss and the
// gradient of 2.5 x loss, for fp32, bf16 and fp16 logits, small and GPT-2-sized vocabularies, rows
// ignored (-100), and logits far from 0 (the running maximum). The loss within 1e-6 relative (bf16 and
// fp16: 1e-5, their values summed in fp32 all the same); the gradient within 1e-6, or within one unit
// in the last place of the logits' dtype: both sides round nearly equal fp32 gradients once.
void expect_cross_entropy_matches_libtorch(torch::Device device, const CrossEntropy& fused) {
  struct Case {
    int64_t N, V;
    double shift;
  };
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (const Case c : {Case{37, 65, 0.0}, Case{16, 1000, 30.0}, Case{6, 50304, -10.0}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " on " + device.str() + ": N " + std::to_string(c.N) + ", V " +
                   std::to_string(c.V) + ", logits shifted by " + std::to_string(c.shift));
      torch::manual_seed(13);
      const auto opts = torch::TensorOptions().device(device);
      const auto logits0 = (3 * torch::randn({c.N, c.V}, opts) + c.shift).to(dtype);
      auto targets = torch::randint(0, c.V, {c.N}, opts.dtype(torch::kLong));
      targets.index_put_({torch::arange(0, c.N, 5, opts.dtype(torch::kLong))}, -100);  // every 5th row ignored
      auto run = [&](const CrossEntropy& loss_of) {
        auto logits = logits0.clone().requires_grad_(true);
        auto loss = loss_of(logits, targets);
        (2.5 * loss).backward();
        return std::make_pair(loss.detach(), logits.grad().to(torch::kFloat));
      };
      const auto [loss, grad] = run(fused);
      const auto [want_loss, want_grad] = run([](const torch::Tensor& logits, const torch::Tensor& targets) {
        return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), targets);
      });
      EXPECT_EQ(loss.scalar_type(), torch::kFloat);
      EXPECT_EQ(loss.dim(), 0);
      const double loss_tolerance = dtype == torch::kFloat ? 1e-6 : 1e-5;
      EXPECT_NEAR(loss.item<double>(), want_loss.item<double>(), loss_tolerance * std::abs(want_loss.item<double>()));
      const double rounding = dtype == torch::kBFloat16 ? 1.0 / 128 : dtype == torch::kHalf ? 1.0 / 1024 : 0.0;
      const auto diff = (grad - want_grad).abs();
      EXPECT_TRUE((diff <= want_grad.abs() * (rounding + 1e-6) + 1e-6).all().item<bool>())
          << "max |kernel - LibTorch| " << diff.max().item<double>();
    }
  }
  // Every row ignored: NaN, as LibTorch.
  const auto opts = torch::TensorOptions().device(device);
  EXPECT_TRUE(std::isnan(fused(torch::randn({3, 10}, opts), torch::full({3}, -100, opts.dtype(torch::kLong))).item<double>()));
}

}  // namespace

// The plugin's cross-entropy on CPU tensors runs the kernels' own lines (cross_entropy_kernel_math.h)
// in a host loop, and the same autograd wrapper: all but the launch.
TEST(CudaCrossEntropy, TheKernelsArithmeticMatchesLibTorchOnTheCpu) {
  std::string why;
  const runtime::CudaPlugin* plugin = load_plugin(&why);
  if (!plugin) GTEST_SKIP() << why;
  expect_cross_entropy_matches_libtorch(torch::kCPU, plugin->cross_entropy);
  EXPECT_FALSE(plugin->cross_entropy(torch::randn({2, 5}, torch::kDouble), torch::zeros({2}, torch::kLong)).defined())
      << "fp64: not taken";
  try {
    plugin->cross_entropy(torch::randn({2, 5}), torch::zeros({3}, torch::kLong));
    FAIL() << "3 targets for 2 rows were taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[model] cross-entropy kernel"), std::string::npos) << e.what();
  }
}

// On a GPU: the same comparison, and no fp32 copy of the logits:
// at V 50,304 the memory a forward and backward take beyond the bf16 logits stays under what one fp32
// copy of them would take.
TEST(CudaCrossEntropy, TheKernelMatchesLibTorchOnTheGpuWithoutAnFp32Copy) {
  REQUIRE_GPU();
  runtime::resolve_device("cuda");
  const runtime::CudaPlugin* plugin = runtime::cuda_plugin();
  ASSERT_NE(plugin, nullptr);
  expect_cross_entropy_matches_libtorch(torch::kCUDA, plugin->cross_entropy);

  const int64_t N = 4096, V = 50304;
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  auto logits = torch::randn({N, V}, opts.dtype(torch::kBFloat16)).requires_grad_(true);
  const auto targets = torch::randint(0, V, {N}, opts.dtype(torch::kLong));
  torch::cuda::synchronize();
  int64_t before = 0, reserved = 0, peak = 0;
  plugin->reset_peak_memory(0);
  plugin->peak_memory(0, &before, &reserved);
  plugin->cross_entropy(logits, targets).backward();
  torch::cuda::synchronize();
  plugin->peak_memory(0, &peak, &reserved);
  const int64_t fp32_copy = N * V * 4;
  EXPECT_LT(peak - before, fp32_copy) << "the loss took " << (peak - before) << " bytes beyond the logits";
}
