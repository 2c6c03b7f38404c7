// The one-pass RMSNorm and relu² (model/fast/rms_norm.h, relu_squared.h) against the operations they
// replace: RMSNorm's output and gradients against the same formula in float64 autograd (and bf16
// against LibTorch's rms_norm), relu² bit for bit against relu(h).square() and its autograd
// gradient. Run under every kernel cap (CMakeLists.txt), so the AVX2 and portable builds are checked.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "model/fast/relu_squared.h"
#include "model/fast/rms_norm.h"

using namespace nanogpt;

namespace {

// The lesson's RMSNorm in float64: x / sqrt(mean(x²) + eps) (* w).
torch::Tensor reference_rms(const torch::Tensor& x, const std::optional<torch::Tensor>& w, double eps) {
  auto y = x / torch::sqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return w ? y * *w : y;
}

// The largest error against the largest value (dx cancels: g - x̂ mean(g x̂) can be ~0).
double max_relative(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kDouble), r = want.to(torch::kDouble);
  return (g - r).abs().max().item<double>() / r.abs().max().item<double>();
}

}  // namespace

// fp32 with and without a weight, widths that are and are not a multiple of a vector, row counts
// across the backward's 64-row blocks: y within 2e-6 of float64 (against its largest value), dx and
// dw as close as the operations' fp32 (twice their error at most).
TEST(FusedRmsNorm, Fp32MatchesTheFormulaInFloat64ForwardAndBackward) {
  torch::manual_seed(3);
  for (const int64_t C : {3, 7, 32, 48, 128, 192}) {  // (at C = 1, dx ~ eps / x² is all rounding in fp32)
    for (const int64_t rows : {1, 5, 64, 130}) {
      for (const bool weighted : {false, true}) {
        SCOPED_TRACE("C " + std::to_string(C) + " rows " + std::to_string(rows) + (weighted ? " weight" : ""));
        auto x = (torch::randn({rows, C}) * 3 + 0.5).requires_grad_(true);
        auto w = (torch::rand({C}) + 0.5).requires_grad_(true);
        auto dy = torch::randn({rows, C});
        const auto wopt = weighted ? std::optional<torch::Tensor>(w) : std::nullopt;
        auto y = model::fast_rms_norm(x, wopt, 1e-5);
        ASSERT_EQ(y.scalar_type(), torch::kFloat);
        y.backward(dy);

        auto x64 = x.detach().to(torch::kDouble).requires_grad_(true);
        auto w64 = w.detach().to(torch::kDouble).requires_grad_(true);
        auto y64 = reference_rms(x64, weighted ? std::optional<torch::Tensor>(w64) : std::nullopt, 1e-5);
        y64.backward(dy.to(torch::kDouble));
        // The operations this replaces, in fp32: dx cancels (g - x̂ mean(g x̂)), so the bound is
        // theirs where theirs is larger.
        auto x32 = x.detach().clone().requires_grad_(true), w32 = w.detach().clone().requires_grad_(true);
        auto y32 = (x32 * torch::rsqrt(x32.pow(2).mean(-1, true) + 1e-5));
        if (weighted) y32 = y32 * w32;
        y32.backward(dy);
        const double ops_dx = max_relative(x32.grad(), x64.grad());
        EXPECT_LT(max_relative(y, y64), 2e-6);
        EXPECT_LT(max_relative(x.grad(), x64.grad()), std::max(2e-6, 2 * ops_dx)) << "the operations: " << ops_dx;
        if (weighted) {
          EXPECT_LT(max_relative(w.grad(), w64.grad()), std::max(2e-6, 2 * max_relative(w32.grad(), w64.grad())));
        } else {
          EXPECT_FALSE(w.grad().defined());
        }
      }
    }
  }
}

// QK-norm's case: bf16 queries and keys, no weight, over a head's width in a (B, T, heads, hs) view:
// y as LibTorch's rms_norm rounds it (at most one bf16 step apart), dx within bf16's precision of
// float64.
TEST(FusedRmsNorm, Bf16WithoutWeightMatchesLibTorchAndTheGradient) {
  torch::manual_seed(4);
  auto x = (torch::randn({2, 9, 6, 48}) * 2).to(torch::kBFloat16).requires_grad_(true);
  auto dy = torch::randn({2, 9, 6, 48}).to(torch::kBFloat16);
  auto y = model::fast_rms_norm(x, std::nullopt, 1e-6);
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  auto lib = torch::rms_norm(x.detach(), {48}, std::nullopt, 1e-6);
  const double step = (y.to(torch::kFloat) - lib.to(torch::kFloat)).abs().max().item<double>();
  EXPECT_LE(step, 2.0 * std::pow(2.0, -7));  // |y| <= ~3.5: a bf16 step there is <= 2^-6
  y.backward(dy);
  auto x64 = x.detach().to(torch::kDouble).requires_grad_(true);
  reference_rms(x64, std::nullopt, 1e-6).backward(dy.to(torch::kDouble));
  EXPECT_LT(max_relative(y, reference_rms(x64.detach(), std::nullopt, 1e-6)), 1e-2);
  EXPECT_LT(max_relative(x.grad(), x64.grad()), 2e-2);
}

// The weight's gradient is summed over fixed blocks of rows in a fixed order: the same bits on one
// thread as on several; and without grad the forward gives the same y as with it.
TEST(FusedRmsNorm, SameBitsForAnyThreadCountAndWithoutGrad) {
  torch::manual_seed(5);
  auto x0 = torch::randn({1000, 96});
  auto w0 = torch::rand({96}) + 0.5;
  auto dy = torch::randn({1000, 96});
  std::vector<torch::Tensor> dws, dxs;
  const int threads = at::get_num_threads();
  for (const int n : {1, 2, 3}) {
    at::set_num_threads(n);
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    model::fast_rms_norm(x, w, 1e-5).backward(dy);
    dxs.push_back(x.grad());
    dws.push_back(w.grad());
  }
  at::set_num_threads(threads);
  for (size_t i = 1; i < dws.size(); ++i) {
    EXPECT_TRUE(torch::equal(dws[0], dws[i]));
    EXPECT_TRUE(torch::equal(dxs[0], dxs[i]));
  }
  torch::NoGradGuard no_grad;
  auto with_grad = [&] {
    torch::AutoGradMode on(true);
    return model::fast_rms_norm(x0.clone().requires_grad_(true), w0, 1e-5).detach();
  }();
  EXPECT_TRUE(torch::equal(model::fast_rms_norm(x0, w0, 1e-5), with_grad));
}

// Outside what the pass covers (fp64, a bf16 input with a weight) the operations run as before, in
// fp32 arithmetic and with their dtypes: the result still matches the formula.
TEST(FusedRmsNorm, OtherDtypesRunTheOperations) {
  torch::manual_seed(6);
  auto x = torch::randn({4, 10}, torch::kDouble);
  auto w = torch::rand({10}, torch::kDouble) + 0.5;
  EXPECT_LT(max_relative(model::fast_rms_norm(x, w, 1e-5), reference_rms(x, w, 1e-5)), 1e-6);
  auto xb = torch::randn({4, 10}).to(torch::kBFloat16);
  auto wf = torch::rand({10}) + 0.5;
  auto y = model::fast_rms_norm(xb, wf, 1e-5);
  EXPECT_EQ(y.scalar_type(), torch::kFloat);  // bf16 normalised, times an fp32 weight
  EXPECT_LT(max_relative(y, reference_rms(xb.to(torch::kDouble), wf.to(torch::kDouble), 1e-5)), 1e-2);
}

// relu(h)² and its backward bit for bit as the operations compute them, in fp32 and bf16, with
// zeros, negative zeros, infinities and NaN among the inputs, at a length that is not a multiple of a
// vector.
TEST(FusedReluSquared, BitForBitTheOperationsForwardAndBackward) {
  torch::manual_seed(7);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(dtype == torch::kFloat ? "fp32" : "bf16");
    auto h = torch::randn({3, 37, 41}) * 4;
    auto flat = h.view({-1});
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> specials = {0.0f, -0.0f, inf, -inf, nan, 1e-30f, -1e-30f, 3e19f};
    for (size_t i = 0; i < specials.size(); ++i) flat[static_cast<int64_t>(i * 97)] = specials[i];
    h = h.to(dtype);
    auto g = (torch::randn({3, 37, 41}) * 2).to(dtype);
    g.view({-1})[5 * 97] = nan;  // a NaN gradient where h is 1e-30 > 0
    g.view({-1})[3 * 97] = inf;  // and an infinite one where h is -inf: masked to 0

    auto a = model::fast_relu_squared(h);
    auto expected = torch::relu(h).square();
    EXPECT_TRUE(torch::equal(a.isnan(), expected.isnan()));
    EXPECT_TRUE(torch::equal(torch::nan_to_num(a, 0), torch::nan_to_num(expected, 0)));

    auto h_grad = h.clone().requires_grad_(true);
    torch::relu(h_grad).square().backward(g);
    auto [a2, dh] = model::fast_relu_squared_backward(h, g);
    EXPECT_TRUE(torch::equal(torch::nan_to_num(a2, 0), torch::nan_to_num(expected, 0)));
    EXPECT_TRUE(torch::equal(dh.isnan(), h_grad.grad().isnan()));
    EXPECT_TRUE(torch::equal(torch::nan_to_num(dh, 0), torch::nan_to_num(h_grad.grad(), 0)));
  }
}
