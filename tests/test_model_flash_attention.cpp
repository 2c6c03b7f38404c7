// Flash attention (model/fast/flash_attention.h) against the lesson's attention: the kernel against
// softmax(q kᵀ / √hs + causal mask) → dropout → · v written out with autograd (outputs and the
// gradients of q, k and v), in fp32 and bf16, with and without dropout (the same seed gives the
// same mask as the model's dropout), with grouped-query heads, for T not a multiple of the block and
// T = 1; a model with `attention: flash` against one with `attention: math`; and the property that
// it never allocates a (T, T) block of scores, which the math path does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "model/fast/dropout.h"
#include "model/fast/flash_attention.h"
#include "model/gpt.h"
#include "runtime/device.h"
#include "tensor_compare.h"

using namespace nanogpt::model;
using nanogpt::testing::relative_error;

namespace {

// The lesson's arithmetic on whole tensors: scores, causal mask, fp32 softmax, dropout (the model's
// Dropout: its mask of (seed, element) over the (B, nh, T, T) weights), weigh the values. k and v
// (B, nkv, T, hs) are repeated for each query head that shares them.
torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double p) {
  const int64_t T = q.size(2), group = q.size(1) / k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  auto kr = k.repeat_interleave(group, 1), vr = v.repeat_interleave(group, 1);  // (B, nh, T, hs)
  auto hidden = torch::ones({T, T}, torch::kBool).triu(1);                      // (T, T): key j > query i
  auto scores = (q.matmul(kr.transpose(-2, -1)) * scale).masked_fill(hidden, -INFINITY);  // (B, nh, T, T)
  auto weights = torch::softmax(scores, -1, torch::kFloat);
  return fast_dropout(weights, p, p > 0).to(v.scalar_type()).matmul(vr);  // (B, nh, T, hs)
}

struct Case {
  int64_t B, nh, nkv, T, hs, block;
  const char* what;
};

// Largest single CPU allocation and the peak of live bytes while it is in scope, on the thread that
// made it (the tests run single-threaded, so that is every allocation).
class AllocationProbe : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t bytes, size_t, size_t, c10::Device device) override {
    if (!device.is_cpu()) return;
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    if (bytes > largest_) largest_ = bytes;
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t largest() const { return largest_; }
  int64_t peak() const { return peak_; }

 private:
  int64_t live_ = 0, peak_ = 0, largest_ = 0;
};

// Runs forward and backward of `attend` on fresh (B, nh, T, hs) inputs, one thread, and reports what
// it allocated.
template <typename F>
std::shared_ptr<AllocationProbe> probe_allocations(F attend, int64_t B, int64_t nh, int64_t T, int64_t hs) {
  torch::manual_seed(3);
  auto q = torch::randn({B, nh, T, hs}).requires_grad_(), k = torch::randn({B, nh, T, hs}).requires_grad_(),
       v = torch::randn({B, nh, T, hs}).requires_grad_();
  auto dy = torch::randn({B, nh, T, hs});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto probe = std::make_shared<AllocationProbe>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, probe);
    auto y = attend(q, k, v);
    torch::autograd::backward({y}, {dy});
  }
  at::set_num_threads(threads);
  return probe;
}

}  // namespace

TEST(FlashAttention, MatchesTheMathForwardAndBackward) {
  const Case cases[] = {
      {2, 4, 4, 13, 8, 4, "T not a multiple of the block, 4 blocks"},
      {2, 4, 2, 70, 16, 64, "grouped-query heads, a second block of 6"},
      {1, 6, 2, 37, 8, 16, "three query heads per kv head"},
      {2, 2, 1, 1, 8, 64, "T = 1"},
      {1, 2, 2, 64, 32, 64, "one whole block (the CPU preset's T)"},
  };
  for (const auto& c : cases) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      for (const double p : {0.0, 0.25}) {
        SCOPED_TRACE(std::string(c.what) + (dtype == torch::kFloat ? " fp32" : " bf16") + " p=" + std::to_string(p));
        torch::manual_seed(1);
        auto q = torch::randn({c.B, c.nh, c.T, c.hs}).to(dtype).requires_grad_();
        auto k = torch::randn({c.B, c.nkv, c.T, c.hs}).to(dtype).requires_grad_();
        auto v = torch::randn({c.B, c.nkv, c.T, c.hs}).to(dtype).requires_grad_();
        auto dy = torch::randn({c.B, c.nh, c.T, c.hs}).to(dtype);
        torch::manual_seed(7);  // the same dropout seed for both
        auto y_ref = reference(q, k, v, p);
        auto grads_ref = torch::autograd::grad({y_ref}, {q, k, v}, {dy});
        torch::manual_seed(7);
        auto y = flash_attention(q, k, v, p, c.block);
        auto grads = torch::autograd::grad({y}, {q, k, v}, {dy});
        const double tol = dtype == torch::kFloat ? 2e-5 : 2e-2;
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_EQ(y.sizes(), q.sizes());
        EXPECT_LE(relative_error(y, y_ref), tol);
        for (int i = 0; i < 3; ++i) {
          ASSERT_EQ(grads[i].sizes(), grads_ref[i].sizes());
          if (grads_ref[i].abs().max().item<double>() == 0) {  // T = 1: q and k do not matter, up to rounding
            EXPECT_LE(grads[i].abs().max().item<double>(), tol) << "q k v"[2 * i];
          } else {
            EXPECT_LE(relative_error(grads[i], grads_ref[i]), tol) << "q k v"[2 * i];
          }
        }
        if (p > 0 && c.T > 1) {  // the mask mattered: without it the output differs
          torch::manual_seed(7);
          EXPECT_GT(relative_error(flash_attention(q, k, v, 0.0, c.block), y), 10 * tol);
        }
      }
    }
  }
}

// Queries, keys and values straight from the projections' layout (B, T, heads, hs), transposed:
// read in place, the same result as contiguous copies, bit for bit.
TEST(FlashAttention, ReadsTransposedInputsInPlace) {
  torch::manual_seed(2);
  const int64_t B = 2, nh = 4, nkv = 2, T = 20, hs = 8;
  auto q = torch::randn({B, T, nh, hs}).transpose(1, 2), k = torch::randn({B, T, nkv, hs}).transpose(1, 2),
       v = torch::randn({B, T, nkv, hs}).transpose(1, 2);
  torch::manual_seed(4);
  auto y = flash_attention(q, k, v, 0.1, 8);
  torch::manual_seed(4);
  auto y_contiguous = flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), 0.1, 8);
  EXPECT_TRUE(torch::equal(y, y_contiguous));
}

namespace {

// A small training model of context T with dropout 0.1 and grouped-query heads, whose attention is `kind`,
// its weights drawn from seed 5.
GPT dropout_model(int64_t T, const char* kind) {
  ModelConfig cfg;
  cfg.vocab_size = 11;
  cfg.block_size = T;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.n_embd = 32;
  cfg.dropout = 0.1;
  cfg.attention = kind;
  torch::manual_seed(5);
  GPT model(cfg);
  model->train();
  return model;
}

// One training forward (dropout seed 9) and, with `backward`, the gradients of mean(logits²).
torch::Tensor train_logits(GPT& model, const torch::Tensor& idx, bool bf16, bool backward) {
  model->zero_grad();
  torch::manual_seed(9);
  torch::Tensor logits;
  {
    nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
    logits = model->logits(idx);
  }
  if (backward) logits.to(torch::kFloat).pow(2).mean().backward();
  return logits.detach();
}

}  // namespace

// A model with `attention: flash` trains as one with `attention: math`: the same logits and every
// parameter's gradient, with dropout (the same masks), grouped-query heads, in fp32 and under bf16
// autocast, for a T within one block and one across three.
TEST(FlashAttention, AModelWithFlashAttentionMatchesMath) {
  for (const int64_t T : {40, 150}) {
    GPT flash = dropout_model(T, "flash"), math = dropout_model(T, "math");
    auto idx = torch::randint(11, {2, T});
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + " T=" + std::to_string(T));
      const auto flash_logits = train_logits(flash, idx, bf16, true), math_logits = train_logits(math, idx, bf16, true);
      const double tol = bf16 ? 3e-2 : 1e-5;
      EXPECT_LE(relative_error(flash_logits, math_logits), tol);
      auto math_params = math->named_parameters();
      for (auto& p : flash->named_parameters())
        EXPECT_LE(relative_error(p.value().grad(), math_params[p.key()].grad()), tol) << p.key();
    }
  }
}

// `attention: auto` trains on the CPU with flash attention in fp32 at every T, and in bf16 from
// kFlashAttentionFromT on with chunked attention below it: its logits equal those of the kind it
// picked, bit for bit, and not the other's.
TEST(FlashAttention, AutoTrainsWithFlashInFp32AndFromItsTInBf16) {
  for (const bool bf16 : {false, true}) {
    for (const int64_t T : {kFlashAttentionFromT, kFlashAttentionFromT / 2}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + " T=" + std::to_string(T));
      auto idx = torch::randint(11, {2, T});
      auto logits = [&](const char* kind) {
        GPT model = dropout_model(T, kind);
        return train_logits(model, idx, bf16, false);
      };
      const auto by_auto = logits("auto"), by_flash = logits("flash"), by_chunked = logits("chunked");
      const bool flash_picked = !bf16 || T >= kFlashAttentionFromT;
      EXPECT_EQ(flash_picked, flash_attention_trains(T, bf16 ? torch::kBFloat16 : torch::kFloat));
      EXPECT_TRUE(torch::equal(by_auto, flash_picked ? by_flash : by_chunked));
      EXPECT_FALSE(torch::equal(by_auto, flash_picked ? by_chunked : by_flash)) << "the kinds must differ in rounding";
    }
  }
}

// Never a (T, T) tensor: through forward and backward no single allocation holds one head's fp32
// scores, and the bytes live at the peak stay under the math path's (B, nh, T, T) weights; the math
// path, probed the same way, allocates both (so the probe sees what it should).
TEST(FlashAttention, NeverAllocatesTheScores) {
  const int64_t B = 2, nh = 4, T = 256, hs = 16;
  const int64_t head_scores = T * T * 4, all_scores = B * nh * head_scores;  // bytes in fp32
  auto flash = probe_allocations([](auto q, auto k, auto v) { return flash_attention(q, k, v, 0.2); }, B, nh, T, hs);
  auto math = probe_allocations([](auto q, auto k, auto v) { return reference(q, k, v, 0.2); }, B, nh, T, hs);
  EXPECT_GE(math->largest(), all_scores);
  EXPECT_GE(math->peak(), 2 * all_scores);
  EXPECT_GT(flash->largest(), 0);
  EXPECT_LT(flash->largest(), head_scores);
  EXPECT_LT(flash->peak(), all_scores);
}
