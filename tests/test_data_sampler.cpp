// BatchSampler: shapes, y = x shifted, windows always inside the corpus, and reproducibility
// (same seed, restored state, sequential mode). Tokens are 0..N-1, so a token's value is its position.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "data/batch_sampler.h"

using nanogpt::data::BatchSampler;

namespace {

torch::Tensor positions(int64_t n) { return torch::arange(n, torch::kInt32); }

// Checks every row is tokens[s .. s+T) for a valid start s, y = x shifted by one; returns the starts.
std::vector<int64_t> check_windows(const torch::Tensor& x, const torch::Tensor& y, int64_t num_tokens) {
  std::vector<int64_t> starts;
  const int64_t B = x.size(0), T = x.size(1);
  auto xa = x.accessor<int64_t, 2>();
  auto ya = y.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = xa[b][0];
    EXPECT_GE(start, 0);
    EXPECT_LE(start, num_tokens - T - 1);  // the target of the last position must exist
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(xa[b][t], start + t);
      EXPECT_EQ(ya[b][t], start + t + 1);
    }
    starts.push_back(start);
  }
  return starts;
}

}  // namespace

TEST(BatchSampler, ShapesAndTypes) {
  BatchSampler sampler(positions(1000), 4, 8, 1337);
  auto [x, y] = sampler.next();
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(x.scalar_type(), torch::kInt64);
  EXPECT_EQ(y.scalar_type(), torch::kInt64);
  EXPECT_TRUE(x.device().is_cpu());
  EXPECT_EQ(sampler.num_tokens(), 1000);
}

TEST(BatchSampler, TargetsAreInputsShiftedByOne) {
  // Random token values this time, checked against the slicing definition directly.
  torch::manual_seed(0);
  const auto tokens = torch::randint(0, 65, {500}, torch::kInt32);
  BatchSampler sampler(tokens, 6, 16, 7);
  for (int i = 0; i < 5; ++i) {
    auto [x, y] = sampler.next();
    EXPECT_TRUE(torch::equal(x.narrow(1, 1, 15), y.narrow(1, 0, 15)));
  }
  auto [x, y] = BatchSampler(positions(500), 6, 16, 7).next();
  check_windows(x, y, 500);
}

TEST(BatchSampler, CorpusOfExactlyOneWindow) {
  const int64_t T = 10;
  BatchSampler sampler(positions(T + 1), 3, T, 42);
  for (int i = 0; i < 20; ++i) {
    auto [x, y] = sampler.next();
    for (int64_t start : check_windows(x, y, T + 1)) EXPECT_EQ(start, 0);
  }
}

TEST(BatchSampler, EveryValidStartIsDrawnAndNoneBeyond) {
  // N - T = 5 valid starts (0..4): all must appear, including the last, and nothing past it.
  const int64_t N = 13, T = 8;
  BatchSampler sampler(positions(N), 16, T, 3);
  std::set<int64_t> seen;
  for (int i = 0; i < 50; ++i) {
    auto [x, y] = sampler.next();
    for (int64_t start : check_windows(x, y, N)) seen.insert(start);
    EXPECT_LE(y.max().item<int64_t>(), N - 1);
  }
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2, 3, 4}));
}

TEST(BatchSampler, SameSeedSameBatches) {
  BatchSampler a(positions(10000), 4, 32, 99), b(positions(10000), 4, 32, 99), c(positions(10000), 4, 32, 100);
  bool differs = false;
  for (int i = 0; i < 5; ++i) {
    auto [xa, ya] = a.next();
    auto [xb, yb] = b.next();
    auto [xc, yc] = c.next();
    EXPECT_TRUE(torch::equal(xa, xb));
    EXPECT_TRUE(torch::equal(ya, yb));
    differs = differs || !torch::equal(xa, xc);
  }
  EXPECT_TRUE(differs);
}

TEST(BatchSampler, RestoredStateContinuesIdentically) {
  BatchSampler original(positions(10000), 4, 32, 1);
  for (int i = 0; i < 3; ++i) original.next();
  const std::string saved = original.state();
  std::vector<torch::Tensor> expected;
  for (int i = 0; i < 4; ++i) expected.push_back(original.next().first);

  BatchSampler resumed(positions(10000), 4, 32, 12345);  // a different seed, then the saved state
  resumed.restore_state(saved);
  for (const auto& x : expected) EXPECT_TRUE(torch::equal(resumed.next().first, x));
}

TEST(BatchSampler, MalformedStateIsRejected) {
  BatchSampler sampler(positions(100), 2, 4, 1);
  const std::string before = sampler.state();
  EXPECT_THROW(sampler.restore_state(""), std::runtime_error);
  EXPECT_THROW(sampler.restore_state("1 2 3"), std::runtime_error);
  EXPECT_THROW(sampler.restore_state("not a state"), std::runtime_error);
  EXPECT_THROW(sampler.restore_state(before + " trailing"), std::runtime_error);
  EXPECT_EQ(sampler.state(), before);  // unchanged after failures
}

TEST(BatchSampler, SequentialIsDeterministicAndLeavesTheGeneratorAlone) {
  const int64_t N = 100, B = 3, T = 7;
  BatchSampler sampler(positions(N), B, T, 5), fresh(positions(N), B, T, 5);
  for (int64_t index : {0, 1, 4, 1000}) {
    auto [x, y] = sampler.sequential(index);
    auto [x2, y2] = sampler.sequential(index);
    EXPECT_TRUE(torch::equal(x, x2));
    const auto starts = check_windows(x, y, N);
    for (int64_t b = 0; b < B; ++b) EXPECT_EQ(starts[b], ((index * B + b) * T) % (N - T));
  }
  EXPECT_TRUE(torch::equal(sampler.next().first, fresh.next().first));
  EXPECT_THROW(sampler.sequential(-1), std::runtime_error);
}

TEST(BatchSampler, TooShortSplitIsAClearError) {
  try {
    BatchSampler sampler(positions(8), 2, 8, 1);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("split has 8 tokens, fewer than block_size + 1 = 9"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(BatchSampler(positions(100), 0, 8, 1), std::runtime_error);
  EXPECT_THROW(BatchSampler(torch::zeros({2, 50}, torch::kInt32), 1, 8, 1), std::runtime_error);
}

TEST(BatchSampler, MovesBatchesToTheRequestedDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  BatchSampler sampler(positions(1000), 4, 8, 1337), cpu(positions(1000), 4, 8, 1337);
  auto [x, y] = sampler.next(torch::kCUDA);
  EXPECT_TRUE(x.is_cuda());
  EXPECT_TRUE(torch::equal(x.cpu(), cpu.next().first));
}
