// Sequences in the slots of a static KV cache, one graph-safe step a token (see static_decoder.h).
#include "model/static_decoder.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace nanogpt::model {

int64_t StaticDecoder::bucket(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}

StaticDecoder::StaticDecoder(GPT& model, int64_t slots, torch::ScalarType dtype, bool exact_window, int64_t max_context,
                             std::optional<torch::Generator> generator)
    : model_(model),
      mode_(model),
      device_(model->parameters().front().device()),
      sliding_(!exact_window && model->config().pos_encoding == "rope"),
      generator_(std::move(generator)) {
  if (slots < 1) throw std::invalid_argument(fmt::format("[sample] the static decoder needs >= 1 slot, got {}", slots));
  if (max_context < 0 || max_context > model->config().block_size)
    throw std::invalid_argument(fmt::format(
        "[sample] max_context ({}) must be in [1, block_size] = [1, {}] (0 = block_size): the model has seen no "
        "longer window",
        max_context, model->config().block_size));
  if (dtype != torch::kFloat && dtype != torch::kBFloat16 && dtype != torch::kHalf)
    throw std::invalid_argument("[sample] the static decoder computes in float32, bfloat16 or float16");
  c10::InferenceMode inference;
  const int64_t S = bucket(slots), V = model->config().vocab_size;
  weights_ = DecodeWeights::from(model, dtype);
  cache_ = StaticKVCache(model->config(), S, torch::TensorOptions().dtype(dtype).device(device_), max_context);
  options_ = RowOptions(S, device_);
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(device_);
  tokens_ = torch::zeros({S}, longs);
  drawn_ = torch::zeros({S}, longs);
  logits_ = torch::zeros({S, V}, torch::TensorOptions().device(device_));
  probs_ = torch::zeros_like(logits_);
  position_.assign(S, 0);
}

StaticDecoder::~StaticDecoder() = default;

void StaticDecoder::run_step(int64_t n) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // the dtypes are the weights'
  auto tokens = tokens_.narrow(0, 0, n);
  auto logits = decode_step(weights_, cache_, tokens);  // (n, V) fp32
  auto probs = filtered_probs_rows(logits, options_);   // (n, V)
  auto drawn = draw_rows(probs, generator_);            // (n,)
  auto finite = torch::isfinite(logits).all(-1);        // (n,)
  logits_.narrow(0, 0, n).copy_(logits);
  probs_.narrow(0, 0, n).copy_(probs);
  drawn_.narrow(0, 0, n).copy_(torch::where(finite, drawn, -1));
  tokens.copy_(drawn);  // the next step's input
  cache_.pos.narrow(0, 0, n).add_(1);
}

std::string StaticDecoder::capture(std::unique_ptr<StepGraphs> graphs) {
  if (!graphs) return "no graphs on this device";
  c10::InferenceMode inference;
  try {
    for (int64_t b = 1; b <= slots(); b *= 2) {
      run_step(b);  // once eagerly: cuBLAS's handles and workspaces exist before the capture
      graphs->capture(b, [this, b] { run_step(b); });
    }
  } catch (const std::exception& e) {
    cache_.pos.zero_();
    tokens_.zero_();
    return e.what();
  }
  cache_.pos.zero_();  // the warm-up steps' positions; their keys and values are masked until overwritten
  tokens_.zero_();
  graphs_ = std::move(graphs);
  return "";
}

void StaticDecoder::start(int64_t slot, const std::vector<int64_t>& context) {
  if (context.empty()) throw std::invalid_argument("[sample] every sequence needs at least one token (its prompt)");
  if (slot < 0 || slot >= slots())
    throw std::invalid_argument(fmt::format("[sample] slot {} is outside the decoder's {} slots", slot, slots()));
  c10::InferenceMode inference;
  const int64_t total = static_cast<int64_t>(context.size()), begin = std::max<int64_t>(0, total - window());
  const int64_t prefix = total - begin - 1;  // the window but its newest token, at positions 0 .. prefix - 1
  if (prefix > 0) {
    KVCache general = model_->make_cache();
    auto earlier = torch::tensor(std::vector<int64_t>(context.begin() + begin, context.end() - 1), torch::kLong);
    model_->forward_cached(earlier.view({1, prefix}).to(device_), general);
    cache_.load(slot, general, 0, prefix);
  }
  cache_.pos.narrow(0, slot, 1).fill_(prefix);
  tokens_.narrow(0, slot, 1).fill_(context.back());
  position_[slot] = prefix;
}

void StaticDecoder::set_options(int64_t slot, const SamplingOptions& options) {
  options.validate();
  c10::InferenceMode inference;  // the buffers are inference tensors
  options_.set(slot, options.temperature, options.top_k, options.top_p);
}

void StaticDecoder::move(int64_t from, int64_t to) {
  if (from == to) return;
  c10::InferenceMode inference;
  cache_.move(from, to);
  tokens_.narrow(0, to, 1).copy_(tokens_.narrow(0, from, 1));
  for (auto* t : {&options_.temperature, &options_.top_k, &options_.top_p}) t->narrow(0, to, 1).copy_(t->narrow(0, from, 1));
  position_[to] = position_[from];
}

bool StaticDecoder::needs_restart(int64_t slot) const { return !sliding_ && position_[slot] >= window(); }

std::vector<int64_t> StaticDecoder::step(int64_t n) {
  if (n < 1 || n > slots())
    throw std::invalid_argument(fmt::format("[sample] a step of {} sequences in {} slots", n, slots()));
  c10::InferenceMode inference;
  const int64_t b = bucket(n);
  if (graphs_) graphs_->replay(b);
  else run_step(n);
  for (int64_t s = 0; s < n; ++s) ++position_[s];  // (the idle rows' positions do not matter: start() sets them)
  auto drawn = drawn_.narrow(0, 0, n).to(torch::kCPU);  // the one copy back a step
  return std::vector<int64_t>(drawn.data_ptr<int64_t>(), drawn.data_ptr<int64_t>() + n);
}

torch::Tensor StaticDecoder::logits(int64_t n) const { return logits_.narrow(0, 0, n).to(torch::kCPU); }

torch::Tensor StaticDecoder::probs(int64_t n) const { return probs_.narrow(0, 0, n).to(torch::kCPU); }

std::vector<std::vector<int64_t>> generate_static(StaticDecoder& decoder, const std::vector<int64_t>& prompt,
                                                  int64_t batch, int64_t max_new_tokens, const SamplingOptions& options,
                                                  const TokenCallback& on_token, bool with_probs) {
  if (prompt.empty()) throw std::invalid_argument("[sample] the prompt must hold at least one token");
  if (batch < 1 || batch > decoder.slots())
    throw std::invalid_argument(fmt::format("[sample] a batch of {} in a decoder of {} slots", batch, decoder.slots()));
  options.validate();
  std::vector<std::vector<int64_t>> out(batch, prompt);
  for (int64_t b = 0; b < batch; ++b) {
    decoder.set_options(b, options);
    decoder.start(b, prompt);
  }
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    for (int64_t b = 0; b < batch; ++b)
      if (decoder.needs_restart(b)) decoder.start(b, out[b]);
    const auto tokens = decoder.step(batch);
    for (int64_t b = 0; b < batch; ++b) {
      if (tokens[b] < 0)
        throw std::runtime_error(fmt::format(
            "[sample] the model gave non-finite logits (NaN or inf) for new token {}: its weights are damaged or "
            "training diverged (check the run's val loss; sample an earlier checkpoint)",
            step + 1));
      out[b].push_back(tokens[b]);
    }
    if (on_token && !on_token(tokens, with_probs ? decoder.probs(batch) : torch::Tensor())) break;
  }
  return out;
}

}  // namespace nanogpt::model
