// Device and dtype mix-ups that would stop a GPU run in its first step, caught on the CPU: every
// buffer the optimizer, its clipping and the loss scaler work with must be made with the parameters'
// options (a CPU float32 buffer beside CUDA parameters fails there, and beside float64 or bf16
// parameters it shows as a dtype mismatch here); a GPU named without an index gets one before it is
// made current; the dropout mask that chunked attention applies on a GPU is the CPU kernel's mask.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "model/fast/dropout.h"
#include "runtime/device.h"
#include "runtime/peak_flops.h"
#include "train/adamw.h"
#include "train/grad_scaler.h"

using namespace nanogpt;

namespace {

// Two block matrices (Muon's group when it is on), an embedding-like matrix and a bias, in `dtype`.
std::vector<std::pair<std::string, torch::Tensor>> params_of(torch::ScalarType dtype) {
  torch::manual_seed(5);
  auto make = [&](std::vector<int64_t> shape) { return torch::randn(shape).to(dtype).requires_grad_(true); };
  return {{"wte.weight", make({7, 4})}, {"h.0.attn.c_q.weight", make({4, 4})}, {"h.0.mlp.c_fc.weight", make({8, 4})},
          {"ln_f.bias", make({4})}};
}

// A loss with known gradients: sum over parameters of (p * c) with c = 1, 2, 3, ... by position.
void backward_known(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  torch::Tensor loss;
  for (const auto& [name, p] : params) {
    auto c = torch::arange(1, p.numel() + 1, p.options().requires_grad(false)).view(p.sizes());
    auto term = (p * c).sum();
    loss = loss.defined() ? loss + term : term;
  }
  loss.backward();
}

}  // namespace

TEST(DeviceMixups, EveryOptimizerBufferHasTheParametersDeviceAndDtype) {
  for (auto dtype : {torch::kDouble, torch::kBFloat16}) {
    for (bool muon : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (muon ? " muon" : " adamw"));
      auto params = params_of(dtype);
      train::FlatAdamW::Options o;
      o.muon = muon;
      o.muon_dtype = torch::kFloat;
      train::FlatAdamW opt(params, o);
      for (const auto& t : opt.buffers()) {
        EXPECT_EQ(t.scalar_type(), dtype);
        EXPECT_EQ(t.device(), params.front().second.device());
      }
      EXPECT_EQ(opt.flat_grads().size(), 3u);  // the empty group's buffer is there too
    }
  }
}

TEST(DeviceMixups, ClippingAndTheStepRunInTheParametersDtype) {
  auto params = params_of(torch::kDouble);
  train::FlatAdamW opt(params, {});
  backward_known(params);
  double expected_sq = 0;  // the gradients are 1, 2, ..., numel per parameter
  for (const auto& [name, p] : params) {
    const double n = static_cast<double>(p.numel());
    expected_sq += n * (n + 1) * (2 * n + 1) / 6;
  }
  auto norm = opt.clip_grad_norm(1.0);
  EXPECT_EQ(norm.scalar_type(), torch::kDouble);
  EXPECT_NEAR(norm.item<double>(), std::sqrt(expected_sq), 1e-9);
  double clipped_sq = 0;
  for (const auto& g : opt.flat_grads()) clipped_sq += g.pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(clipped_sq), 1.0, 1e-6);
  const auto before = params.front().second.detach().clone();
  opt.step(1e-2);
  EXPECT_FALSE(torch::equal(before, params.front().second.detach()));
  for (const auto& t : opt.buffers()) EXPECT_EQ(t.scalar_type(), torch::kDouble);
}

TEST(DeviceMixups, TheLossScalerUnscalesTheOptimizersFloat64Gradients) {
  auto params = params_of(torch::kDouble);
  train::FlatAdamW opt(params, {});
  backward_known(params);
  std::vector<torch::Tensor> expected;
  for (const auto& g : opt.flat_grads()) expected.push_back(g.clone());
  for (auto& g : opt.flat_grads()) g.mul_(1024.0);
  train::GradScaler::Options so;
  so.init_scale = 1024.0;
  train::GradScaler scaler(torch::kCPU, true, so);
  scaler.unscale(opt.flat_grads());
  EXPECT_TRUE(scaler.step_ok());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(torch::equal(opt.flat_grads()[i], expected[i])) << i;
}

TEST(DeviceMixups, TheLossScalerRefusesAGradientOnAnotherDevice) {
  // The meta device stands in for the GPU: ATen's CPU kernel would take it without a word.
  train::GradScaler scaler(torch::kCPU, true);
  std::vector<torch::Tensor> grads = {torch::ones({3}), torch::empty({3}, torch::TensorOptions().device(torch::kMeta))};
  try {
    scaler.unscale(grads);
    FAIL() << "a gradient on another device than the scale was unscaled";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("[train] loss scaling: gradient 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("meta"), std::string::npos) << e.what();
  }
}

TEST(DeviceMixups, AGpuWithoutAnIndexBecomesTheProcesssOwn) {
  // resolve_device("cuda") and "auto" on a GPU machine give "cuda" with no index (-1), which
  // LibTorch refuses to make current: a process alone takes cuda:0, one under torchrun its LOCAL_RANK.
  const torch::Device alone = runtime::process_device(torch::Device("cuda"), 0);
  EXPECT_TRUE(alone.has_index());
  EXPECT_EQ(alone, torch::Device("cuda:0"));
  EXPECT_EQ(runtime::process_device(torch::Device("cuda"), 3), torch::Device("cuda:3"));
  EXPECT_EQ(runtime::process_device(torch::Device("cuda:1"), 3), torch::Device("cuda:1"));  // asked for by name
  EXPECT_EQ(runtime::process_device(torch::kCPU, 2), torch::Device(torch::kCPU));
  EXPECT_FALSE(runtime::process_device(torch::kCPU, 2).has_index());
  EXPECT_THROW(runtime::set_current_device(torch::Device("cuda")), std::runtime_error);
  EXPECT_NO_THROW(runtime::set_current_device(torch::kCPU));
}

TEST(DeviceMixups, TheDropoutMaskInTensorOpsIsTheCpuKernelsMask) {
  // What chunked attention applies to a GPU tensor, computed here on the CPU: the same mask and the
  // same values as the CPU kernel, element for element, from any offset into the stream.
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble}) {
    for (double p : {0.1, 0.5, 0.9}) {
      for (int64_t offset : {int64_t{0}, int64_t{3}, int64_t{1001}, int64_t{1} << 33}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " p " + std::to_string(p) + " offset " + std::to_string(offset));
        auto x = torch::randn({3, 5, 37}).to(dtype);
        const uint64_t seed = 0x1234567890abcdefULL + static_cast<uint64_t>(offset);
        auto kernel = model::apply_dropout_mask(x, p, seed, offset, dtype);
        auto ops = model::apply_dropout_mask_by_ops(x, p, seed, offset, dtype);
        EXPECT_TRUE(torch::equal(kernel, ops));
        const double kept = ops.ne(0).to(torch::kDouble).mean().item<double>();
        EXPECT_NEAR(kept, 1.0 - p, 0.08);  // 555 draws: a mask, not all or nothing
      }
    }
  }
  // Into another dtype (bf16 weights out of fp32 scores), as attention's backward asks.
  auto x = torch::randn({1000});
  EXPECT_TRUE(torch::equal(model::apply_dropout_mask(x, 0.2, 7, 12, torch::kBFloat16),
                           model::apply_dropout_mask_by_ops(x, 0.2, 7, 12, torch::kBFloat16)));
}

TEST(DeviceMixups, MfuOnAGpuIsAgainstTheMostSpecificDatasheetEntry) {
  EXPECT_EQ(runtime::datasheet_bf16_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(runtime::datasheet_bf16_flops("NVIDIA H100 PCIe"), 756e12);  // not the SXM part's 989
  EXPECT_GT(runtime::datasheet_bf16_flops("NVIDIA H100 80GB HBM3"), runtime::datasheet_bf16_flops("NVIDIA H100 PCIe"));
  EXPECT_LT(runtime::datasheet_bf16_flops("NVIDIA H200 NVL"), runtime::datasheet_bf16_flops("NVIDIA H200"));
  EXPECT_LT(runtime::datasheet_bf16_flops("NVIDIA L40"), runtime::datasheet_bf16_flops("NVIDIA L40S"));
  EXPECT_EQ(runtime::datasheet_bf16_flops("Some Future GPU"), 0.0);  // then the measured GEMM peak stands in
  EXPECT_EQ(runtime::datasheet_bf16_flops(""), 0.0);                 // the CPU
}
