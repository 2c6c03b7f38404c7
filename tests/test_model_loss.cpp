// The fused CPU cross-entropy (model/fast/cross_entropy.h) against LibTorch's plain path (logits cast
// to fp32, cross_entropy, autograd): the loss and the gradients w.r.t. the logits and a small GPT's
// parameters, in fp32 and bf16, for small and large vocabularies and row counts that do not divide
// into the kernel's tasks; then where the fused path is taken and what it rejects. Last, the
// branch-free exp and GELU of the hand-written loops (model/fast/simd.h) against fp64.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include "model/fast/cross_entropy.h"
#include "model/fast/simd.h"
#include "model/gpt.h"
#include "runtime/device.h"

using namespace nanogpt::model;

namespace {

// The plain path GPT::forward took before the fused kernel.
torch::Tensor reference_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), targets);
}

// Loss and d(loss * upstream)/d(logits) of `loss_fn` at these logits (a fresh leaf each time).
std::pair<double, torch::Tensor> loss_and_grad(
    const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>& loss_fn,
    const torch::Tensor& logits, const torch::Tensor& targets, double upstream = 1.0) {
  auto leaf = logits.detach().clone().requires_grad_(true);
  auto loss = loss_fn(leaf, targets);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  (loss * upstream).backward();
  return {loss.item<double>(), leaf.grad()};
}

// Element-wise |actual - expected| <= rtol * (|expected| + max |expected|): relative to each element
// and, for elements near zero, to the tensor's scale.
void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol, const std::string& what) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const auto a = actual.to(torch::kDouble), e = expected.to(torch::kDouble);
  const double scale = e.abs().max().item<double>();
  const auto excess = ((a - e).abs() - rtol * (e.abs() + scale)).max().item<double>();
  EXPECT_LE(excess, 0.0) << what << ": max |a - e| = " << (a - e).abs().max().item<double>() << ", scale " << scale;
}

// Logits spread like a trained model's (a few large, many small) and targets in [0, V).
std::pair<torch::Tensor, torch::Tensor> random_batch(int64_t N, int64_t V, torch::ScalarType dtype) {
  auto logits = (torch::randn({N, V}) * 3.0).to(dtype);
  auto targets = torch::randint(V, {N}, torch::kLong);
  return {logits, targets};
}

void check_against_reference(torch::ScalarType dtype, double rtol) {
  torch::manual_seed(1);
  for (int64_t V : {5, 300, 7443}) {
    for (int64_t N : {1, 37, 1000}) {  // 37 and 1000: not multiples of the kernel's rows per task
      const auto [logits, targets] = random_batch(N, V, dtype);
      const std::string what = "V " + std::to_string(V) + ", N " + std::to_string(N);
      const auto [loss, grad] = loss_and_grad(cross_entropy, logits, targets);
      const auto [ref_loss, ref_grad] = loss_and_grad(reference_loss, logits, targets);
      // The loss is fp32 arithmetic on the same inputs either way: fp32 agreement for bf16 logits too.
      EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss)) << what;
      expect_close(grad, ref_grad, rtol, what);
    }
  }
}

}  // namespace

TEST(CrossEntropy, MatchesLibTorchInFloat32) { check_against_reference(torch::kFloat, 1e-5); }

TEST(CrossEntropy, MatchesLibTorchInBfloat16) { check_against_reference(torch::kBFloat16, 2e-2); }

// The soft-cap folded into the loss's pass against LibTorch's tanh then the plain loss: the loss, the
// gradient w.r.t. the raw logits (through tanh's backward) and the capped logits, fp32 and bf16, with
// ignored rows, at logits that reach the cap's bend (x 3 spread, up to ~15).
TEST(CrossEntropy, SoftcappedMatchesTanhThenLibTorch) {
  torch::manual_seed(2);
  constexpr double cap = 15.0;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (int64_t V : {5, 300, 7443}) {
      for (int64_t N : {1, 37, 1000}) {
        auto [logits, targets] = random_batch(N, V, dtype);
        if (N > 1) targets.index_put_({torch::indexing::Slice(0, N, 7)}, -100);  // every 7th row ignored
        const std::string what = std::string(dtype == torch::kFloat ? "fp32" : "bf16") + ", V " + std::to_string(V) +
                                 ", N " + std::to_string(N);
        torch::Tensor capped;
        const auto [loss, grad] = loss_and_grad(
            [&](const torch::Tensor& l, const torch::Tensor& t) {
              auto out = softcapped_cross_entropy(l, t, cap);
              capped = out.second;
              return out.first;
            },
            logits, targets);
        torch::Tensor ref_capped;
        const auto [ref_loss, ref_grad] = loss_and_grad(
            [&](const torch::Tensor& l, const torch::Tensor& t) {
              ref_capped = (torch::tanh(l.to(torch::kFloat) / cap) * cap);
              return reference_loss(ref_capped, t);
            },
            logits, targets);
        EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss)) << what;
        expect_close(grad, ref_grad.to(dtype), dtype == torch::kFloat ? 1e-5 : 2e-2, what + ": gradient");
        ASSERT_EQ(capped.scalar_type(), dtype) << what;
        EXPECT_FALSE(capped.requires_grad()) << what;
        const double capped_tol = dtype == torch::kFloat ? 2e-6 * cap : 1.0 / 128 * cap;  // bf16: one rounding
        EXPECT_LE((capped.to(torch::kDouble) - ref_capped.to(torch::kDouble)).abs().max().item<double>(), capped_tol)
            << what << ": capped logits";
        // Without a gradient: the same loss and capped logits.
        torch::NoGradGuard no_grad;
        const auto [eval_loss, eval_capped] = softcapped_cross_entropy(logits, targets, cap);
        EXPECT_EQ(eval_loss.item<double>(), loss) << what;
        EXPECT_TRUE(torch::equal(eval_capped, capped)) << what;
      }
    }
  }
  EXPECT_THROW(softcapped_cross_entropy(torch::zeros({2, 3}), torch::zeros({2}, torch::kLong), 0.0),
               std::invalid_argument);
}

TEST(CrossEntropy, ScalesItsGradientByTheIncomingOne) {
  torch::manual_seed(2);
  const auto [logits, targets] = random_batch(19, 50, torch::kFloat);
  const auto [loss, grad] = loss_and_grad(cross_entropy, logits, targets, 0.25);
  const auto [ref_loss, ref_grad] = loss_and_grad(reference_loss, logits, targets, 0.25);
  expect_close(grad, ref_grad, 1e-5, "upstream 0.25");
}

TEST(CrossEntropy, IgnoresTargetsOfMinus100AsLibTorchDoes) {
  torch::manual_seed(3);
  auto [logits, targets] = random_batch(23, 40, torch::kFloat);
  targets.index_put_({torch::arange(0, 23, 4)}, -100);
  const auto [loss, grad] = loss_and_grad(cross_entropy, logits, targets);
  const auto [ref_loss, ref_grad] = loss_and_grad(reference_loss, logits, targets);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss));
  expect_close(grad, ref_grad, 1e-5, "ignored rows");
  EXPECT_EQ(grad[0].abs().max().item<float>(), 0.0f);
  // Every row ignored: NaN, as LibTorch's mean over no rows.
  EXPECT_TRUE(std::isnan(cross_entropy(logits, torch::full({23}, -100, torch::kLong)).item<double>()));
}

TEST(CrossEntropy, EvaluationMatchesTrainingLoss) {
  torch::manual_seed(4);
  const auto [logits, targets] = random_batch(64, 7443, torch::kBFloat16);
  torch::Tensor eval_loss;
  {
    torch::NoGradGuard no_grad;
    eval_loss = cross_entropy(logits.clone().requires_grad_(true), targets);
  }
  EXPECT_FALSE(eval_loss.requires_grad());
  EXPECT_EQ(eval_loss.item<float>(), loss_and_grad(cross_entropy, logits, targets).first);
}

TEST(CrossEntropy, RejectsBadShapesTypesAndTargets) {
  const auto logits = torch::zeros({4, 6});
  EXPECT_THROW(cross_entropy(logits, torch::tensor({0, 1, 2, 6}, torch::kLong)), std::invalid_argument);
  EXPECT_THROW(cross_entropy(logits, torch::tensor({0, -1, 2, 3}, torch::kLong)), std::invalid_argument);
  EXPECT_THROW(cross_entropy(logits, torch::tensor({0, 1, 2}, torch::kLong)), std::invalid_argument);
  EXPECT_THROW(cross_entropy(logits, torch::tensor({0, 1, 2, 3}, torch::kInt)), std::invalid_argument);
  EXPECT_THROW(cross_entropy(torch::zeros({2, 2, 6}), torch::zeros({4}, torch::kLong)), std::invalid_argument);
  try {
    cross_entropy(logits, torch::tensor({0, 1, 9, 3}, torch::kLong));
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[model]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("target 9 at row 2"), std::string::npos) << e.what();
  }
}

// The fused kernel serves CPU logits in fp32 / bf16 / fp16; the rest (fp64, other devices: here the
// meta device stands in for CUDA) keeps LibTorch's cross_entropy.
TEST(CrossEntropy, FusedOnlyForCpuFloatLogits) {
  EXPECT_TRUE(fused_cross_entropy_applies(torch::zeros({2, 3})));
  EXPECT_TRUE(fused_cross_entropy_applies(torch::zeros({2, 3}, torch::kBFloat16)));
  EXPECT_FALSE(fused_cross_entropy_applies(torch::zeros({2, 3}, torch::kDouble)));
  EXPECT_FALSE(fused_cross_entropy_applies(torch::zeros({2, 3}, torch::device(torch::kMeta))));
  const auto meta = cross_entropy(torch::zeros({2, 3}, torch::device(torch::kMeta)),
                                  torch::zeros({2}, torch::TensorOptions().dtype(torch::kLong).device(torch::kMeta)));
  EXPECT_TRUE(meta.device().is_meta());
  auto logits = torch::randn({4, 6}).requires_grad_(true);
  const auto targets = torch::tensor({0, 1, 2, 3}, torch::kLong);
  EXPECT_NE(cross_entropy(logits, targets).grad_fn()->name().find("FusedCrossEntropy"), std::string::npos);
  auto fp64 = torch::randn({4, 6}, torch::kDouble).requires_grad_(true);
  EXPECT_EQ(cross_entropy(fp64, targets).grad_fn()->name().find("FusedCrossEntropy"), std::string::npos);
}

// A small GPT's loss and every parameter's gradient through the fused loss equal those through the
// plain one, in fp32 and under bf16 autocast (where the CPU multiplies bf16 at all), with the head
// tied to wte and with its own lm_head and soft-capped logits.
TEST(CrossEntropy, GptGradientsMatchThePlainLoss) {
  ModelConfig c;
  c.vocab_size = 301;  // the head and the loss weigh more than at the other tests' 11 tokens
  c.block_size = 16;
  c.n_layer = c.n_head = 2;
  c.n_embd = 32;
  torch::manual_seed(6);
  const auto idx = torch::randint(c.vocab_size, {3, 13}), targets = torch::randint(c.vocab_size, {3, 13});
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    if (dtype == torch::kBFloat16) {
      try {
        torch::ones({2, 2}, torch::kBFloat16).matmul(torch::ones({2, 2}, torch::kBFloat16));
      } catch (const std::exception&) {
        continue;  // this LibTorch has no CPU bf16 GEMM
      }
    }
    for (const bool tied : {true, false}) {
      c.tie_embeddings = tied;
      c.logit_softcap = tied ? 0.0 : 15.0;
      torch::manual_seed(5);
      GPT model(c);
      const auto grads = [&](int how) {  // 0: the plain loss, 1: forward's fused one, 2: loss() (chunked in fp32)
        model->zero_grad();
        torch::Tensor loss;
        {
          nanogpt::runtime::AutocastGuard autocast(torch::kCPU, dtype, dtype != torch::kFloat);
          if (how == 1) {
            loss = model->forward(idx, targets).second;
          } else if (how == 2) {
            loss = model->loss(idx, targets);
          } else {
            auto logits = model->logits(idx);  // (B, T, V)
            loss = reference_loss(logits.reshape({-1, c.vocab_size}), targets.reshape({-1}));
          }
        }
        loss.backward();
        std::vector<torch::Tensor> out{loss.detach()};
        for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
        return out;
      };
      const auto plain = grads(0);
      for (const int how : {1, 2}) {
        SCOPED_TRACE(how == 1 ? "forward" : "loss");
        const auto fused = grads(how);
        const double rtol = dtype == torch::kFloat ? 1e-5 : 2e-2;
        EXPECT_NEAR(fused[0].item<double>(), plain[0].item<double>(), 1e-5 * plain[0].item<double>());
        const auto names = model->named_parameters().keys();
        ASSERT_EQ(names.size() + 1, fused.size());
        for (size_t i = 1; i < fused.size(); ++i) expect_close(fused[i], plain[i], rtol, names[i - 1]);
      }
    }
  }
}

TEST(FastMath, ExpNonpositiveMatchesFp64Within2e7Relative) {
  double worst = 0.0;
  for (double x = -87.0; x <= 0.34; x += 1e-3) {
    const float f = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(f));
    worst = std::max(worst, std::abs(exp_nonpositive(f) - want) / want);
  }
  EXPECT_LE(worst, 2e-7);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_GT(exp_nonpositive(-1000.0f), 0.0f);  // clamped: tiny, never 0 or NaN
  EXPECT_LT(exp_nonpositive(-1000.0f), 1e-37f);
  // NaN in (a non-finite logit minus the row's max) gives NaN out, so the loss shows it.
  EXPECT_TRUE(std::isnan(exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastMath, TanhMatchesFp64Within1e6Relative) {
  double worst = 0.0;
  for (double y = -30.0; y <= 30.0; y += 1e-3) {
    const float f = static_cast<float>(y);
    const double want = std::tanh(static_cast<double>(f));
    if (want != 0.0) worst = std::max(worst, std::abs(tanh_float(f) - want) / std::abs(want));
  }
  for (double y = 1e-30; y < 1.0; y *= 1.1) {  // tiny arguments: the series' side of the switch
    const float f = static_cast<float>(y);
    worst = std::max(worst, std::abs(tanh_float(-f) + std::tanh(static_cast<double>(f))) / std::tanh(static_cast<double>(f)));
  }
  EXPECT_LE(worst, 1e-6);
  EXPECT_EQ(tanh_float(0.0f), 0.0f);
  EXPECT_EQ(tanh_float(100.0f), 1.0f);
  EXPECT_EQ(tanh_float(-100.0f), -1.0f);
}

TEST(FastMath, GeluErfMatchesTheExactGelu) {
  // Against v Phi(v) in fp64 (through erfc, which keeps the negative tail exact): 4e-7 absolute
  // everywhere, 2.5e-6 relative where v >= -5; and against torch::gelu's fp32 (erf) kernel.
  double worst_abs = 0.0, worst_rel = 0.0;
  for (double v = -12.0; v <= 12.0; v += 1e-3) {
    const float f = static_cast<float>(v);
    const double want = 0.5 * f * std::erfc(-static_cast<double>(f) / std::sqrt(2.0));
    const double err = std::abs(gelu_erf(f) - want);
    worst_abs = std::max(worst_abs, err);
    if (v >= -5.0 && want != 0.0) worst_rel = std::max(worst_rel, err / std::abs(want));
  }
  EXPECT_LE(worst_abs, 4e-7);
  EXPECT_LE(worst_rel, 2.5e-6);
  EXPECT_EQ(gelu_erf(0.0f), 0.0f);
  auto x = torch::linspace(-6, 6, 10001);
  auto ours = torch::empty_like(x);
  for (int64_t i = 0; i < x.numel(); ++i) ours[i] = gelu_erf(x[i].item<float>());
  EXPECT_LE((ours - torch::gelu(x)).abs().max().item<double>(), 1e-6);
}

// The head and the loss by chunks of rows (head_cross_entropy) against the logits made whole and
// the plain loss: 1,000 rows of a 5,000-token vocabulary go in three chunks (the last one short),
// with ignored rows, with and without a cap; the loss, dx and dw in fp32 agree, and an incoming
// gradient of 0.5 halves dx and dw.
TEST(CrossEntropy, HeadByChunksMatchesTheWholeLogits) {
  torch::manual_seed(8);
  const int64_t N = 1000, C = 48, V = 5000;
  auto targets = torch::randint(V, {N});
  targets.index_put_({torch::arange(0, N, 7)}, -100);
  for (const double cap : {0.0, 15.0}) {
    SCOPED_TRACE("cap " + std::to_string(cap));
    auto x = (torch::randn({N, C}) * 2).requires_grad_(true);
    auto w = (torch::randn({V, C}) * 0.3).requires_grad_(true);
    auto chunked = nanogpt::model::head_cross_entropy(x, w, targets, cap);
    (chunked * 0.5).backward();
    auto x2 = x.detach().clone().requires_grad_(true), w2 = w.detach().clone().requires_grad_(true);
    auto logits = x2.mm(w2.t());
    if (cap > 0) logits = torch::tanh(logits / cap) * cap;
    auto plain = reference_loss(logits, targets);
    (plain * 0.5).backward();
    EXPECT_NEAR(chunked.item<double>(), plain.item<double>(), 1e-5 * plain.item<double>());
    expect_close(x.grad(), x2.grad(), 1e-4, "dx");
    expect_close(w.grad(), w2.grad(), 1e-4, "dw");
  }
  EXPECT_THROW(nanogpt::model::head_cross_entropy(torch::randn({4, 8}), torch::randn({9, 8}), torch::full({4}, 9, torch::kLong), 0.0),
               std::invalid_argument);  // a target outside the vocabulary
  EXPECT_THROW(nanogpt::model::head_cross_entropy(torch::randn({4, 8}), torch::randn({9, 7}), torch::zeros({4}, torch::kLong), 0.0),
               std::invalid_argument);  // widths that differ
}
