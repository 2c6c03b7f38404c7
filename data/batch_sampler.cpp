// Random training windows. Starts are drawn from a std::mt19937_64 with our own unbiased
// reduction (not std::uniform_int_distribution, whose algorithm differs between standard
// libraries), so a seed gives the same batches with libstdc++ and libc++.
#include "data/batch_sampler.h"

#include "data/token_file.h"

#include <fmt/format.h>

#include <sstream>
#include <stdexcept>

namespace nanogpt::data {
namespace {

// Uniform integer in [0, n) by rejection: drop the top 2^64 mod n values so every residue is equally likely.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t reject_from = -(-n % n);  // largest multiple of n representable, as 2^64 - (2^64 mod n)
  for (;;) {
    const uint64_t r = rng();
    if (reject_from == 0 || r < reject_from) return r % n;
  }
}

}  // namespace

BatchSampler::BatchSampler(torch::Tensor tokens, int64_t batch_size, int64_t block_size, uint64_t seed,
                           int64_t vocab_size)
    : batch_size_(batch_size), block_size_(block_size), rng_(seed), vocab_size_(vocab_size) {
  if (!tokens.defined() || tokens.dim() != 1) {
    throw std::runtime_error("[data] BatchSampler needs a 1-D token tensor (see read_token_file)");
  }
  if (batch_size < 1 || block_size < 1) {
    throw std::runtime_error(
        fmt::format("[data] batch_size ({}) and block_size ({}) must be at least 1", batch_size, block_size));
  }
  const bool in_place = tokens.device().is_cpu() && tokens.is_contiguous() &&
                        (tokens.scalar_type() == torch::kUInt16 || tokens.scalar_type() == torch::kInt32);
  tokens_ = in_place ? tokens : tokens.to(torch::kCPU, torch::kInt32).contiguous();
  if (tokens_.size(0) < block_size + 1) {
    throw std::runtime_error(fmt::format(
        "[data] split has {} tokens, fewer than block_size + 1 = {} (use a smaller block_size or a longer corpus)",
        tokens_.size(0), block_size + 1));
  }
}

std::pair<torch::Tensor, torch::Tensor> BatchSampler::next(torch::Device device) {
  std::vector<int64_t> starts(static_cast<size_t>(batch_size_));
  for (auto& start : starts) start = draw_start();
  return gather(starts, device);
}

void BatchSampler::next_into(torch::Tensor& x, torch::Tensor& y) {
  for (const auto* t : {&x, &y})
    if (!t->defined() || !t->device().is_cpu() || t->scalar_type() != torch::kInt64 || !t->is_contiguous() ||
        t->sizes() != torch::IntArrayRef{batch_size_, block_size_})
      throw std::runtime_error(fmt::format("[data] next_into needs int64 ({}, {}) contiguous CPU tensors", batch_size_,
                                           block_size_));
  std::vector<int64_t> starts(static_cast<size_t>(batch_size_));
  for (auto& start : starts) start = draw_start();
  gather_into(starts, x, y);
}

void BatchSampler::skip(int64_t batches) {
  for (int64_t i = 0; i < batches * batch_size_; ++i) draw_start();
}

int64_t BatchSampler::draw_start() {
  // Valid starts are 0 .. N - T - 1: the window [start, start + T] must end at or before N - 1.
  return static_cast<int64_t>(uniform_below(rng_, static_cast<uint64_t>(num_tokens() - block_size_)));
}

std::pair<torch::Tensor, torch::Tensor> BatchSampler::sequential(int64_t index, torch::Device device) const {
  if (index < 0) throw std::runtime_error(fmt::format("[data] sequential batch index {} is negative", index));
  const auto num_starts = static_cast<unsigned __int128>(num_tokens() - block_size_);
  std::vector<int64_t> starts(static_cast<size_t>(batch_size_));
  for (int64_t b = 0; b < batch_size_; ++b) {
    // 128-bit so (index * B + b) * T cannot overflow before wrapping.
    const auto window = static_cast<unsigned __int128>(index) * batch_size_ + b;
    starts[static_cast<size_t>(b)] = static_cast<int64_t>((window * block_size_) % num_starts);
  }
  return gather(starts, device);
}

std::pair<torch::Tensor, torch::Tensor> BatchSampler::gather(const std::vector<int64_t>& starts,
                                                              torch::Device device) const {
  const int64_t B = static_cast<int64_t>(starts.size()), T = block_size_;
  auto x = torch::empty({B, T}, torch::kInt64);  // (B, T)
  auto y = torch::empty({B, T}, torch::kInt64);  // (B, T)
  gather_into(starts, x, y);
  if (device.is_cpu()) return {x, y};
  return {x.to(device), y.to(device)};
}

void BatchSampler::gather_into(const std::vector<int64_t>& starts, torch::Tensor& x, torch::Tensor& y) const {
  const int64_t B = static_cast<int64_t>(starts.size()), T = block_size_;
  int64_t* xp = x.data_ptr<int64_t>();
  int64_t* yp = y.data_ptr<int64_t>();
  const auto copy = [&](const auto* src) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t start = starts[static_cast<size_t>(b)];
      const auto* window = src + start;
      for (int64_t t = 0; t < T; ++t) {
        xp[b * T + t] = window[t];
        yp[b * T + t] = window[t + 1];
      }
      if (vocab_size_ > 0) {
        for (int64_t t = 0; t <= T; ++t) {
          const int64_t id = window[t];
          if (id < 0 || id >= vocab_size_) {
            throw std::runtime_error(fmt::format(
                "[data] token {} at index {} is outside the vocabulary (vocab_size {}): the token file is damaged "
                "(check it with --verify_data, or re-run `nanogpt prepare`)",
                id, start + t, vocab_size_));
          }
        }
      }
    }
  };
  if (tokens_.scalar_type() == torch::kUInt16) {
    copy(static_cast<const uint16_t*>(tokens_.data_ptr()));
  } else {
    copy(tokens_.data_ptr<int32_t>());
  }
  release_resident(tokens_);  // a mapped file's pages go back to the page cache (nanoGPT re-maps per batch)
}

std::string BatchSampler::state() const {
  std::ostringstream out;
  out << rng_;
  return out.str();
}

void BatchSampler::restore_state(const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 restored;
  in >> restored;
  if (in.fail()) {
    throw std::runtime_error("[data] malformed sampler state (expected the text written by BatchSampler::state(); "
                             "the checkpoint may be corrupt)");
  }
  in >> std::ws;
  if (!in.eof()) {
    throw std::runtime_error("[data] malformed sampler state: unexpected text after the generator state "
                             "(the checkpoint may be corrupt)");
  }
  rng_ = restored;
}

}  // namespace nanogpt::data
