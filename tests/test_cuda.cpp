// On a CUDA GPU: device choice, the fused attention against the math path, bf16 and float16
// (loss-scaled) training, exact checkpoints of the scaler, and the out-of-memory message. Every
// test skips with the reason on a machine without a GPU (scripts/gpu_check.sh runs them on one).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "runtime/device.h"
#include "model/gpt.h"
#include "train/checkpoint.h"
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
