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
