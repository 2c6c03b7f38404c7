// Sampling (see generate.h).
#include "model/generate.h"

#include <limits>
#include <stdexcept>

namespace nanogpt::model {

torch::Tensor filtered_probs(const torch::Tensor& logits, const SamplingOptions& options) {
  auto x = logits.to(torch::kFloat);  // (..., V)
  const int64_t V = x.size(-1);
  if (options.temperature <= 0.0)  // greedy: all mass on the argmax
    return torch::zeros_like(x).scatter_(-1, x.argmax(-1, /*keepdim=*/true), 1.0);
  x = x / options.temperature;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (options.top_k > 0 && options.top_k < V) {
    auto kth = std::get<0>(x.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);  // (..., 1)
    x = x.masked_fill(x < kth, neg_inf);
  }
  auto probs = torch::softmax(x, -1);  // (..., V)
  if (options.top_p < 1.0) {
    auto sorted = probs.sort(-1, /*descending=*/true);
    auto sorted_probs = std::get<0>(sorted), order = std::get<1>(sorted);  // (..., V)
    // Keep a token while the mass *before* it is below top_p: the smallest set reaching top_p
    // (the most likely token is always kept).
    auto before = sorted_probs.cumsum(-1) - sorted_probs;
    auto drop_sorted = before >= options.top_p;
    auto drop = torch::zeros_like(drop_sorted).scatter_(-1, order, drop_sorted);
    probs = probs.masked_fill(drop, 0.0);
    probs = probs / probs.sum(-1, /*keepdim=*/true);
  }
  return probs;
}

int64_t draw_token(const torch::Tensor& probs, std::mt19937_64& rng) {
  auto p = probs.to(torch::kCPU, torch::kDouble).contiguous();
  const double* data = p.data_ptr<double>();
  const int64_t V = p.numel();
  double total = 0.0;
  for (int64_t i = 0; i < V; ++i) total += data[i];
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * total;
  double cumulative = 0.0;
  int64_t last_nonzero = -1;
  for (int64_t i = 0; i < V; ++i) {
    if (data[i] <= 0.0) continue;
    cumulative += data[i];
    last_nonzero = i;
    if (u < cumulative) return i;
  }
  if (last_nonzero < 0) throw std::runtime_error("[sample] all probabilities are zero (non-finite logits?)");
  return last_nonzero;  // u landed on the rounding slack at the very end
}

int64_t window_start(int64_t total, int64_t block_size) {
  if (total <= block_size) return 0;
  const int64_t keep = std::max<int64_t>(1, block_size / 2);  // tokens kept when the window restarts
  const int64_t period = block_size + 1 - keep;             // the window restarts every `period` tokens
  return (total - keep) / period * period;
}

std::vector<std::vector<int64_t>> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t batch,
                                           int64_t max_new_tokens, const SamplingOptions& options,
                                           std::mt19937_64& rng, const TokenCallback& on_token) {
  if (prompt.empty()) throw std::invalid_argument("[sample] the prompt must hold at least one token");
  if (batch < 1) throw std::invalid_argument("[sample] batch must be >= 1");
  c10::InferenceMode inference;
  model->eval();
  struct Frozen {  // Q/K/V weights concatenated once for the whole call, released on every exit
    GPT& model;
    explicit Frozen(GPT& m) : model(m) { model->freeze_qkv_weights(true); }
    ~Frozen() { model->freeze_qkv_weights(false); }
  } frozen(model);
  const auto device = model->parameters().front().device();
  const int64_t block = model->config().block_size;
  const int64_t P = static_cast<int64_t>(prompt.size());
  auto seq = torch::empty({batch, P + max_new_tokens}, torch::kLong);  // (B, P + N) on the CPU
  for (int64_t b = 0; b < batch; ++b)
    std::copy(prompt.begin(), prompt.end(), seq[b].data_ptr<int64_t>());
  auto on_device = seq.to(device);  // mirrors `seq`; new tokens are written into both

  KVCache cache = model->make_cache();
  int64_t cache_start = -1;  // window start the cache holds, -1 = empty
  std::vector<int64_t> new_tokens(batch);
  int64_t total = P;
  for (int64_t step = 0; step < max_new_tokens; ++step, ++total) {
    const int64_t start = window_start(total, block);
    torch::Tensor logits;  // (B, V)
    if (!options.use_cache) {
      logits = model->forward(on_device.narrow(1, start, total - start)).first.select(1, 0);
    } else if (start != cache_start) {  // (re)fill the cache with the whole window
      cache.clear();
      cache_start = start;
      logits = model->forward_cached(on_device.narrow(1, start, total - start), cache);
    } else {  // the window only grew by the last token
      logits = model->forward_cached(on_device.narrow(1, total - 1, 1), cache);
    }
    auto probs = filtered_probs(logits, options).to(torch::kCPU);  // (B, V)
    int64_t* rows = seq.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      new_tokens[b] = draw_token(probs[b], rng);
      rows[b * seq.size(1) + total] = new_tokens[b];
    }
    on_device.narrow(1, total, 1).copy_(seq.narrow(1, total, 1));
    if (on_token && !on_token(new_tokens)) {
      ++total;
      break;
    }
  }
  std::vector<std::vector<int64_t>> out(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = seq[b].data_ptr<int64_t>();
    out[b].assign(row, row + total);
  }
  return out;
}

}  // namespace nanogpt::model
