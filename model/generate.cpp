// Sampling (see generate.h).
#include "model/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include "model/fast/decoder.h"
#include "model/sampling_mode.h"

namespace nanogpt::model {
namespace {

// The logits of the next token of each row of `seq` (B, total) from the last block_size tokens,
// through the KV cache: one new position on top of the cache while that is what a recompute
// would see (within block_size; past it with RoPE's sliding window unless `exact_window`), else a
// prefill of the window. One new position on the CPU in fp32 goes through the hand-written decoder
// (model/fast/decoder.h) unless `fast_decoder` is off, and so does a one-token prompt (one new
// position on an empty cache); longer prefills take the general path. A `max_context` shorter than
// block_size is the window instead, recomputed once full (this cache is a ring of block_size: it
// cannot slide at a shorter length).
class ContextRunner {
 public:
  ContextRunner(GPT& model, bool exact_window, bool fast_decoder, Quantize quantize, int64_t max_context = 0)
      : model_(model),
        cache_(model->make_cache()),
        block_(max_context > 0 ? std::min(max_context, model->config().block_size) : model->config().block_size),
        sliding_(!exact_window && model->config().pos_encoding == "rope" && block_ == model->config().block_size),
        fast_decoder_(fast_decoder),
        quantize_(quantize) {
    if (quantize_ != Quantize::none && !(fast_decoder_ && decoder_supports(*model_)))
      throw std::invalid_argument(
          "[sample] quantized weights run in the CPU decoder: it needs the model on the CPU in float32 or bfloat16, "
          "the KV cache and the decoder on");
  }

  torch::Tensor next_logits(const torch::Tensor& seq, int64_t step) {
    const int64_t total = seq.size(1);
    torch::Tensor logits;
    if (!primed_ && total == 1) {  // a one-token prompt: one new position on an empty cache
      cache_.clear();
      primed_ = true;
    }
    if (primed_ && (sliding_ || total <= block_)) {
      // Packed at the first one-token step, not before. A one-token prompt's first step is one:
      // through the general path it cost a full-preset model ~15 ms (autocast casting every weight
      // to bf16 for one position), a sample of 2,000 tokens ~3%.
      if (fast_decoder_ && !decoder_ && decoder_supports(*model_))
        decoder_ = std::make_unique<Decoder>(*model_, quantize_);
      fast_decoder_ = decoder_ != nullptr;
      logits = decoder_ ? decoder_->step(seq.select(1, total - 1), cache_)        // (B, V)
                        : model_->forward_cached(seq.narrow(1, total - 1, 1), cache_);
    } else {  // the first step, or a window that moved: (re)fill the cache with the whole window
      cache_.clear();
      logits = model_->forward_cached(window(seq), cache_);
      primed_ = true;
    }
    return checked(logits, step);
  }

  /// Without the cache: the whole window, every time (nanoGPT's sample.py).
  torch::Tensor recompute(const torch::Tensor& seq, int64_t step) {
    return checked(model_->forward(window(seq)).first.select(1, 0), step);
  }

  /// Keeps the cache rows `rows` (a beam search's survivors), in that order.
  void select_rows(const torch::Tensor& rows) {
    for (auto* layer : {&cache_.k, &cache_.v})
      for (auto& t : *layer)
        if (t.defined()) t = t.index_select(0, rows.to(t.device()));
  }

 private:
  torch::Tensor window(const torch::Tensor& seq) const {
    const int64_t start = std::max<int64_t>(0, seq.size(1) - block_);  // the last block_size tokens
    return seq.narrow(1, start, seq.size(1) - start);
  }
  static torch::Tensor checked(const torch::Tensor& logits, int64_t step) {
    if (!all_finite(logits))
      throw std::runtime_error(fmt::format(
          "[sample] the model gave non-finite logits (NaN or inf) for new token {}: its weights are damaged or "
          "training diverged (check the run's val loss; sample an earlier checkpoint)",
          step + 1));
    return logits;
  }

  // The same as torch::isfinite(logits).all(), as a loop over a CPU fp32 tensor: three kernels fewer per token.
  static bool all_finite(const torch::Tensor& logits) {
    if (!logits.device().is_cpu() || logits.scalar_type() != torch::kFloat || !logits.is_contiguous())
      return torch::isfinite(logits).all().item<bool>();
    const float* p = logits.data_ptr<float>();
    return std::all_of(p, p + logits.numel(), [](float v) { return std::isfinite(v); });
  }

  GPT& model_;
  std::unique_ptr<Decoder> decoder_;  // null: the general path for every step
  KVCache cache_;
  int64_t block_;
  bool sliding_;
  bool fast_decoder_;  // wanted, and not yet found unsupported
  Quantize quantize_;  // the decoder's matrices
  bool primed_ = false;
};

}  // namespace

namespace {

// filtered_probs of fp32 logits on the CPU without top-p, in plain loops over each row: sampling's
// case, one token at a time. The general path's ~10 kernels took 11 us a token of the CPU-preset
// model's 70, and 27 us of the full preset's 660 (its weights, streamed for the token, have pushed
// the kernels' code and tables out of the caches). The same steps: x / temperature; below the k-th
// largest, zero (its ties kept); exp(x - max), over the sum.
void filter_row(const float* x, float* p, int64_t V, const SamplingOptions& options) {
  if (options.temperature <= 0.0) {  // greedy: all mass on the (first) argmax
    const int64_t best = std::max_element(x, x + V) - x;
    std::fill(p, p + V, 0.0f);
    p[best] = 1.0f;
    return;
  }
  thread_local std::vector<float> sorted;  // top-k's copy of a row
  const float temperature = static_cast<float>(options.temperature);
  for (int64_t i = 0; i < V; ++i) p[i] = x[i] / temperature;
  float kth = -std::numeric_limits<float>::infinity();
  if (options.top_k > 0 && options.top_k < V) {
    sorted.assign(p, p + V);
    std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(), std::greater<float>());
    kth = sorted[options.top_k - 1];
  }
  const float top = *std::max_element(p, p + V);
  float sum = 0.0f;
  for (int64_t i = 0; i < V; ++i) {
    p[i] = p[i] < kth ? 0.0f : std::exp(p[i] - top);
    sum += p[i];
  }
  for (int64_t i = 0; i < V; ++i) p[i] /= sum;
}

bool rows_filter(const torch::Tensor& logits, const SamplingOptions& options) {
  return logits.device().is_cpu() && logits.scalar_type() == torch::kFloat && logits.is_contiguous() &&
         logits.dim() >= 1 && options.top_p >= 1.0;
}

}  // namespace

torch::Tensor filtered_probs(const torch::Tensor& logits, const SamplingOptions& options) {
  if (!rows_filter(logits, options)) return filtered_probs_tensors(logits, options);
  const int64_t V = logits.size(-1), rows = V == 0 ? 0 : logits.numel() / V;
  auto probs = torch::empty_like(logits);
  for (int64_t r = 0; r < rows; ++r)
    filter_row(logits.const_data_ptr<float>() + r * V, probs.data_ptr<float>() + r * V, V, options);
  return probs;
}

torch::Tensor filtered_probs_tensors(const torch::Tensor& logits, const SamplingOptions& options) {
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

namespace {

// Inverse CDF over p[0 .. V) in double precision (fp32 inputs are widened exactly, as by .to(kDouble)).
template <class T>
int64_t draw_from(const T* p, int64_t V, std::mt19937_64& rng) {
  double total = 0.0;
  for (int64_t i = 0; i < V; ++i) total += static_cast<double>(p[i]);
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * total;
  double cumulative = 0.0;
  int64_t last_nonzero = -1;
  for (int64_t i = 0; i < V; ++i) {
    if (p[i] <= 0) continue;
    cumulative += static_cast<double>(p[i]);
    last_nonzero = i;
    if (u < cumulative) return i;
  }
  if (last_nonzero < 0) throw std::runtime_error("[sample] all probabilities are zero (non-finite logits?)");
  return last_nonzero;  // u landed on the rounding slack at the very end
}

}  // namespace

int64_t draw_token(const torch::Tensor& probs, std::mt19937_64& rng) {
  if (probs.device().is_cpu() && probs.scalar_type() == torch::kFloat && probs.is_contiguous())
    return draw_from(probs.data_ptr<float>(), probs.numel(), rng);  // sampling's case: no copy per token
  auto p = probs.to(torch::kCPU, torch::kDouble).contiguous();
  return draw_from(p.data_ptr<double>(), p.numel(), rng);
}

void SamplingOptions::validate() const {
  auto bad = [](const std::string& what) { throw std::invalid_argument("[sample] " + what); };
  if (!(std::isfinite(temperature) && temperature >= 0.0))
    bad(fmt::format("temperature must be a number >= 0 (0 = greedy), got {}", temperature));
  if (top_k < 0) bad(fmt::format("top_k must be >= 0 (0 = off), got {}", top_k));
  if (!(top_p > 0.0 && top_p <= 1.0)) bad(fmt::format("top_p must be in (0, 1] (1 = off), got {}", top_p));
  if (quantize != Quantize::none && !use_cache)
    bad("quantized weights run in the decoder, which needs the KV cache: drop one of the two");
}

std::vector<std::vector<int64_t>> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t batch,
                                           int64_t max_new_tokens, const SamplingOptions& options,
                                           std::mt19937_64& rng, const TokenCallback& on_token) {
  if (prompt.empty()) throw std::invalid_argument("[sample] the prompt must hold at least one token");
  if (batch < 1) throw std::invalid_argument("[sample] batch must be >= 1");
  options.validate();
  c10::InferenceMode inference;
  SamplingMode sampling(model);
  const auto device = model->parameters().front().device();
  const int64_t P = static_cast<int64_t>(prompt.size());
  auto seq = torch::empty({batch, P + max_new_tokens}, torch::kLong);  // (B, P + N) on the CPU
  for (int64_t b = 0; b < batch; ++b)
    std::copy(prompt.begin(), prompt.end(), seq[b].data_ptr<int64_t>());
  auto on_device = seq.to(device);  // mirrors `seq`; new tokens are written into both

  ContextRunner runner(model, options.exact_window, options.fast_decoder, options.quantize);
  std::vector<int64_t> new_tokens(batch);
  int64_t total = P;
  for (int64_t step = 0; step < max_new_tokens; ++step, ++total) {
    auto logits = options.use_cache ? runner.next_logits(on_device.narrow(1, 0, total), step)
                                    : runner.recompute(on_device.narrow(1, 0, total), step);  // (B, V)
    auto probs = filtered_probs(logits, options).to(torch::kCPU);  // (B, V)
    int64_t* rows = seq.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      new_tokens[b] = draw_token(probs[b], rng);
      rows[b * seq.size(1) + total] = new_tokens[b];
    }
    if (!on_device.is_same(seq)) on_device.narrow(1, total, 1).copy_(seq.narrow(1, total, 1));
    if (on_token && !on_token(new_tokens, probs)) {
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

std::vector<Beam> beam_search(GPT& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                              const BeamOptions& options, const std::function<bool(const std::vector<int64_t>&)>& finished) {
  if (prompt.empty()) throw std::invalid_argument("[sample] the prompt must hold at least one token");
  if (options.width < 1) throw std::invalid_argument(fmt::format("[sample] beam width must be >= 1, got {}", options.width));
  if (options.max_context < 0 || options.max_context > model->config().block_size)
    throw std::invalid_argument(fmt::format("[sample] max_context ({}) must be in [1, block_size] = [1, {}] (0 = block_size)",
                                            options.max_context, model->config().block_size));
  c10::InferenceMode inference;
  SamplingMode sampling(model);
  const auto device = model->parameters().front().device();
  ContextRunner runner(model, options.exact_window, options.fast_decoder, options.quantize, options.max_context);
  std::vector<Beam> active{Beam{prompt, 0.0, 0}}, done;
  for (int64_t step = 0; step < max_new_tokens && !active.empty(); ++step) {
    const int64_t K = static_cast<int64_t>(active.size()), total = static_cast<int64_t>(active[0].tokens.size());
    auto seq = torch::empty({K, total}, torch::kLong);  // (K, total): every active beam has the same length
    for (int64_t b = 0; b < K; ++b) std::copy(active[b].tokens.begin(), active[b].tokens.end(), seq[b].data_ptr<int64_t>());
    auto log_probs = torch::log_softmax(runner.next_logits(seq.to(device), step).to(torch::kFloat), -1).to(torch::kCPU);
    std::vector<double> so_far(K);
    for (int64_t b = 0; b < K; ++b) so_far[b] = active[b].log_prob;
    auto totals = log_probs.to(torch::kDouble) + torch::tensor(so_far, torch::kDouble).unsqueeze(1);  // (K, V)
    const int64_t V = totals.size(1);
    // Twice the width, so that beams which finish now still leave `width` to go on.
    auto [best, flat] = totals.view({-1}).topk(std::min<int64_t>(2 * options.width, K * V));
    std::vector<Beam> next;
    std::vector<int64_t> parents;
    for (int64_t i = 0; i < best.size(0) && static_cast<int64_t>(next.size()) < options.width; ++i) {
      const int64_t index = flat[i].item<int64_t>(), parent = index / V;
      Beam beam = active[parent];
      beam.tokens.push_back(index % V);
      beam.log_prob = best[i].item<double>();
      ++beam.generated;
      if (finished && finished(beam.tokens)) {
        done.push_back(std::move(beam));
      } else {
        next.push_back(std::move(beam));
        parents.push_back(parent);
      }
    }
    if (static_cast<int64_t>(done.size()) >= options.width) break;
    if (!next.empty()) runner.select_rows(torch::tensor(parents, torch::kLong));
    active = std::move(next);
  }
  for (auto& beam : active) done.push_back(std::move(beam));
  std::stable_sort(done.begin(), done.end(), [&](const Beam& a, const Beam& b) {
    return a.score(options.length_normalize) > b.score(options.length_normalize);
  });
  if (static_cast<int64_t>(done.size()) > options.width) done.resize(options.width);
  return done;
}

struct SequenceStepper::State {
  State(GPT& m, Quantize q) : model(m), device(m->parameters().front().device()), sampling(m), quantize(q) {}
  GPT& model;
  torch::Device device;  // the model's (asking the module for its parameters costs microseconds a step)
  SamplingMode sampling;
  Quantize quantize;
  std::unique_ptr<Decoder> decoder;  // made at the first one-position step, when the model supports it
  bool decoder_tried = false;
};

SequenceStepper::SequenceStepper(GPT& model, Quantize quantize) : state_(std::make_unique<State>(model, quantize)) {
  if (quantize != Quantize::none && !decoder_supports(*model))
    throw std::invalid_argument(
        "[sample] quantized weights run in the CPU decoder: it needs the model on the CPU in float32 or bfloat16");
}

SequenceStepper::~SequenceStepper() = default;

void SequenceStepper::prepare() {
  if (state_->decoder_tried) return;
  state_->decoder_tried = true;
  c10::InferenceMode inference;
  if (decoder_supports(*state_->model)) state_->decoder = std::make_unique<Decoder>(*state_->model, state_->quantize);
}

SequenceStepper::Step SequenceStepper::step(const std::vector<Sequence*>& batch) {
  if (batch.empty()) throw std::invalid_argument("[sample] a step needs at least one sequence");
  for (auto* s : batch) {
    if (s == nullptr || s->tokens.empty())
      throw std::invalid_argument("[sample] every sequence needs at least one token (its prompt)");
    s->options.validate();
  }
  c10::InferenceMode inference;
  GPT& model = state_->model;
  const auto device = state_->device;
  const int64_t B = static_cast<int64_t>(batch.size()), block = model->config().block_size;
  const bool rope = model->config().pos_encoding == "rope";
  // As ContextRunner: one new position on a primed cache (or a one-token prompt) while that is what
  // a recompute would see, else a prefill of the window.
  std::vector<int64_t> one, prefill;  // rows of each kind
  for (int64_t b = 0; b < B; ++b) {
    Sequence& s = *batch[b];
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    const bool sliding = rope && !s.options.exact_window;
    const bool primed = s.cache.length() == total - 1 && (total > 1 || s.cache.length() == 0);
    if (total == 1) s.cache.clear();
    (primed && (sliding || total <= block) ? one : prefill).push_back(b);
  }
  if (!one.empty()) prepare();
  std::vector<torch::Tensor> rows(B);  // each row's logits (V,)
  torch::Tensor logits;                // (B, V), when the decoder gives every row
  auto last_token = [&](int64_t b) { return batch[b]->tokens.back(); };
  if (!one.empty() && state_->decoder) {
    auto tokens = torch::empty({static_cast<int64_t>(one.size())}, torch::kLong);  // (n,)
    int64_t* token = tokens.data_ptr<int64_t>();
    std::vector<KVCache*> caches;
    for (size_t i = 0; i < one.size(); ++i) {
      token[i] = last_token(one[i]);
      caches.push_back(&batch[one[i]]->cache);
    }
    auto decoded = state_->decoder->step(tokens, caches);  // (n, V)
    if (prefill.empty()) logits = decoded;                 // `one` is then every row, in order
    else for (size_t i = 0; i < one.size(); ++i) rows[one[i]] = decoded[i];
  } else {
    for (int64_t b : one)
      rows[b] = model->forward_cached(torch::tensor({last_token(b)}, torch::kLong).view({1, 1}).to(device),
                                      batch[b]->cache)[0];
  }
  for (int64_t b : prefill) {
    Sequence& s = *batch[b];
    const int64_t total = static_cast<int64_t>(s.tokens.size()), start = std::max<int64_t>(0, total - block);
    auto window = torch::tensor(std::vector<int64_t>(s.tokens.begin() + start, s.tokens.end()), torch::kLong);
    s.cache.clear();
    rows[b] = model->forward_cached(window.view({1, -1}).to(device), s.cache)[0];  // (V,)
  }
  logits = (logits.defined() ? logits : torch::stack(rows)).to(torch::kCPU, torch::kFloat).contiguous();  // (B, V)
  const float* p = logits.const_data_ptr<float>();
  auto probs = torch::empty_like(logits);  // (B, V)
  const int64_t V = logits.size(1);
  std::vector<int64_t> non_finite;
  for (int64_t b = 0; b < B; ++b) {  // sampling's case in plain loops on the rows, as filtered_probs
    Sequence& s = *batch[b];
    float* row = probs.data_ptr<float>() + b * V;
    if (!std::all_of(p + b * V, p + (b + 1) * V, [](float v) { return std::isfinite(v); })) {
      non_finite.push_back(b);  // this row's failure, not the batch's: the others draw as usual
      std::fill(row, row + V, 0.0f);
    } else if (rows_filter(logits, s.options)) {
      filter_row(p + b * V, row, V, s.options);
      s.tokens.push_back(draw_from(row, V, s.rng));
    } else {
      probs[b].copy_(filtered_probs_tensors(logits[b], s.options));
      s.tokens.push_back(draw_token(probs[b], s.rng));
    }
  }
  return {logits, probs, non_finite};
}

}  // namespace nanogpt::model
