// Random training windows from a token file, with a generator whose state can be saved and
// restored so that a resumed run draws exactly the batches the uninterrupted run would have drawn.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace nanogpt::data {

class BatchSampler {
 public:
  /// `tokens`: 1-D CPU tensor of ids; uint16 and int32 ones (map_token_file, read_token_file) are
  /// used in place, others are copied to int32. Needs at least block_size + 1 tokens; throws
  /// "[data] split has N tokens, fewer than block_size + 1 = M (...)" otherwise. With vocab_size > 0,
  /// every id drawn is checked against it (a damaged file that was not read whole at start-up).
  BatchSampler(torch::Tensor tokens, int64_t batch_size, int64_t block_size, uint64_t seed, int64_t vocab_size = 0);

  /// Draws batch_size random windows of block_size + 1 tokens.
  /// x: (B, T) int64, y: (B, T) int64 = x shifted left by one. Placed on `device`.
  std::pair<torch::Tensor, torch::Tensor> next(torch::Device device = torch::kCPU);

  /// As next(), into `x` and `y`: int64 (B, T) contiguous CPU tensors, e.g. the pinned staging
  /// buffer a training step reuses (no tensor is allocated). Throws "[data] ..." for other shapes.
  void next_into(torch::Tensor& x, torch::Tensor& y);

  /// Draws `batches` batches' windows and drops them (the generator moves exactly as next() would
  /// move it): data-parallel ranks share one stream of micro-batches and each skips the others'.
  void skip(int64_t batches);

  /// Deterministic sequential batch number `index`: windows start at
  /// (index * B + b) * T wrapped into range; no generator state is touched.
  std::pair<torch::Tensor, torch::Tensor> sequential(int64_t index, torch::Device device = torch::kCPU) const;

  /// Generator state as text, and its inverse. restore_state throws on a malformed string.
  std::string state() const;
  void restore_state(const std::string& state);

  int64_t num_tokens() const { return tokens_.size(0); }
  int64_t batch_size() const { return batch_size_; }
  int64_t block_size() const { return block_size_; }

 private:
  int64_t draw_start();  // one window start from the generator
  std::pair<torch::Tensor, torch::Tensor> gather(const std::vector<int64_t>& starts, torch::Device device) const;
  void gather_into(const std::vector<int64_t>& starts, torch::Tensor& x, torch::Tensor& y) const;

  torch::Tensor tokens_;  // (N,) uint16 or int32, contiguous, CPU; often a mapped token file
  int64_t batch_size_;
  int64_t block_size_;
  std::mt19937_64 rng_;
  int64_t vocab_size_;  // 0: ids not checked
};

}  // namespace nanogpt::data
