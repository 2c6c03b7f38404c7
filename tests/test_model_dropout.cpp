// Dropout (model/dropout.h): the counter-based mask against its definition and properties.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/dropout.h"

using nanogpt::model::fast_dropout;

TEST(Dropout, DropsAboutPAndScalesTheRest) {
  for (double p : {0.1, 0.2, 0.5}) {
    torch::manual_seed(1);
    auto y = fast_dropout(torch::ones({1 << 20}), p, /*training=*/true);
    const double dropped = (y == 0).to(torch::kDouble).mean().item<double>();
    EXPECT_NEAR(dropped, p, 0.005) << p;  // 1M draws: 5 sigma is < 0.0025
    auto kept = y.masked_select(y != 0);
    EXPECT_TRUE(torch::allclose(kept, torch::full_like(kept, 1.0 / (1.0 - p)))) << p;
  }
}

TEST(Dropout, SeededByTheTorchGeneratorAndIndependentOfThreads) {
  auto x = torch::randn({3, 1000});
  torch::manual_seed(7);
  auto a = fast_dropout(x, 0.3, true);
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  torch::manual_seed(7);
  auto b = fast_dropout(x, 0.3, true);
  torch::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(a, b));
  auto c = fast_dropout(x, 0.3, true);  // the generator moved on: another mask
  EXPECT_FALSE(torch::equal(a, c));
}

TEST(Dropout, IdentityInEvalOrAtZero) {
  auto x = torch::randn({4, 5});
  EXPECT_TRUE(torch::equal(fast_dropout(x, 0.5, /*training=*/false), x));
  EXPECT_TRUE(torch::equal(fast_dropout(x, 0.0, /*training=*/true), x));
}

TEST(Dropout, GradientIsTheSameMaskAndScale) {
  torch::manual_seed(3);
  auto x = torch::randn({64, 33}, torch::requires_grad());
  auto y = fast_dropout(x, 0.25, true);
  auto w = torch::randn({64, 33});
  (y * w).sum().backward();
  auto kept = (y.detach() != 0).to(torch::kFloat);  // x is never exactly 0 here
  EXPECT_TRUE(torch::allclose(y.detach(), x.detach() * kept / 0.75));
  EXPECT_TRUE(torch::allclose(x.grad(), w * kept / 0.75));
}

TEST(Dropout, WorksInBFloat16) {
  torch::manual_seed(4);
  auto x = torch::randn({256, 64}).to(torch::kBFloat16);
  auto y = fast_dropout(x, 0.2, true);
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  auto kept = y != 0;
  EXPECT_TRUE(torch::equal(y.masked_select(kept), (x * 1.25).masked_select(kept)));
  EXPECT_NEAR((~kept).to(torch::kDouble).mean().item<double>(), 0.2, 0.03);
}
