// Sampling: filters on hand-made logits, greedy decoding, determinism, and the KV cache giving the
// same tokens as full recomputation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>
#include <set>

#include "model/generate.h"

using namespace nanogpt::model;

namespace {
GPT tiny_model(int64_t block = 8) {
  ModelConfig c;
  c.vocab_size = 13;
  c.block_size = block;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.attention = "math";
  torch::manual_seed(0);
  return GPT(c);
}
}  // namespace

TEST(Sampling, TopKKeepsOnlyTheKMostLikelyAndRenormalises) {
  auto logits = torch::tensor({1.0f, 5.0f, 3.0f, 4.0f, 2.0f});
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 2;
  o.top_p = 1.0;
  auto p = filtered_probs(logits, o);
  const double e5 = std::exp(5.0), e4 = std::exp(4.0);
  EXPECT_NEAR(p[1].item<double>(), e5 / (e5 + e4), 1e-6);
  EXPECT_NEAR(p[3].item<double>(), e4 / (e5 + e4), 1e-6);
  EXPECT_EQ(p[0].item<double>() + p[2].item<double>() + p[4].item<double>(), 0.0);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 500; ++i) {
    const int64_t t = draw_token(p, rng);
    EXPECT_TRUE(t == 1 || t == 3);
  }
}

TEST(Sampling, TopPKeepsSmallestSetReachingP) {
  auto probs = torch::tensor({0.5, 0.05, 0.3, 0.15});
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 0;
  o.top_p = 0.75;  // 0.5 + 0.3 = 0.8 >= 0.75: keeps tokens 0 and 2
  auto p = filtered_probs(probs.log(), o);
  EXPECT_NEAR(p[0].item<double>(), 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(p[2].item<double>(), 0.3 / 0.8, 1e-6);
  EXPECT_EQ(p[1].item<double>(), 0.0);
  EXPECT_EQ(p[3].item<double>(), 0.0);
  o.top_p = 0.1;  // the most likely token is always kept
  p = filtered_probs(probs.log(), o);
  EXPECT_NEAR(p[0].item<double>(), 1.0, 1e-6);
  std::mt19937_64 rng(2);
  std::set<int64_t> seen;
  o.top_p = 0.75;
  p = filtered_probs(probs.log(), o);
  for (int i = 0; i < 500; ++i) seen.insert(draw_token(p, rng));
  EXPECT_EQ(seen, (std::set<int64_t>{0, 2}));
}

TEST(Sampling, DrawFollowsTheDistribution) {
  auto p = torch::tensor({0.2, 0.8});
  std::mt19937_64 rng(3);
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += draw_token(p, rng) == 1;
  EXPECT_NEAR(ones / 4000.0, 0.8, 0.03);
}

TEST(Sampling, TopKOneAndTemperatureZeroAreGreedy) {
  auto model = tiny_model();
  const std::vector<int64_t> prompt{1, 2, 3};
  SamplingOptions greedy;
  greedy.top_k = 1;
  std::mt19937_64 rng(4);
  auto out = generate(model, prompt, 1, 12, greedy, rng)[0];
  // Reference: argmax of the full forward, step by step.
  std::vector<int64_t> ref = prompt;
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 12; ++i) {
    const int64_t total = ref.size(), start = window_start(total, 8);
    auto idx = torch::tensor(std::vector<int64_t>(ref.begin() + start, ref.end())).unsqueeze(0);
    ref.push_back(model->forward(idx).first.argmax(-1).item<int64_t>());
  }
  EXPECT_EQ(out, ref);
  SamplingOptions zero_temp;
  zero_temp.temperature = 0.0;
  EXPECT_EQ(generate(model, prompt, 1, 12, zero_temp, rng)[0], ref);
}

TEST(Sampling, SameSeedSameOutputAndCacheEqualsRecompute) {
  auto model = tiny_model();
  const std::vector<int64_t> prompt{4};
  SamplingOptions cached, uncached;
  cached.temperature = uncached.temperature = 1.0;
  uncached.use_cache = false;
  std::mt19937_64 a(5), b(5), c(5);
  auto x = generate(model, prompt, 3, 30, cached, a);  // 30 tokens > 3 x block_size
  auto y = generate(model, prompt, 3, 30, cached, b);
  auto z = generate(model, prompt, 3, 30, uncached, c);
  EXPECT_EQ(x, y);
  EXPECT_EQ(x, z);
  EXPECT_NE(x[0], x[1]);  // rows of a batch are independent samples
}

TEST(Sampling, CallbackCanStopEarly) {
  auto model = tiny_model();
  std::mt19937_64 rng(6);
  int calls = 0;
  auto out = generate(model, {1}, 1, 50, SamplingOptions{}, rng, [&](const std::vector<int64_t>&) { return ++calls < 5; });
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(out[0].size(), 6u);
}

TEST(Sampling, WindowNeverExceedsBlockAndKeepsHalf) {
  for (int64_t block : {1, 2, 7, 8, 64})
    for (int64_t total = 1; total < 5 * block + 3; ++total) {
      const int64_t s = window_start(total, block);
      EXPECT_LE(total - s, block);
      EXPECT_GE(total - s, std::min<int64_t>(total, std::max<int64_t>(1, block / 2)));
      if (total > 1) {
        EXPECT_GE(s, window_start(total - 1, block));
      }
    }
}
