// GPT (see gpt.h): embeddings -> blocks -> ln_f -> head (tied or not) -> optional soft-cap.
#include "model/gpt.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "model/fast/cross_entropy.h"
#include "model/fast/linear.h"
#include "runtime/cuda_plugin.h"

namespace nanogpt::model {
namespace {

// The mean cross-entropy in fp32 from bf16 / fp16 logits, without an fp32 copy of them: on a GPU the
// CUDA plugin's kernel (model/cuda/cross_entropy_kernel.h), on the CPU one fused pass per row
// (model/fast/cross_entropy.h), elsewhere LibTorch's.
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const runtime::CudaPlugin* plugin = logits.is_cuda() ? runtime::cuda_plugin() : nullptr;
  if (plugin && plugin->cross_entropy) {
    auto loss = plugin->cross_entropy(logits, targets);
    if (loss.defined()) return loss;  // else a dtype it has no kernel for
  }
  return cross_entropy(logits, targets);
}

}  // namespace

GPTImpl::GPTImpl(const ModelConfig& config, bool initialise) : config_(config) {
  config_.validate();
  const Fill fill = initialise ? Fill::random : Fill::none;  // LibTorch's fill, then GPT-2's over it
  wte = register_module("wte", Embedding(config.vocab_size, config.n_embd, fill));
  if (config.pos_encoding == "learned")
    wpe = register_module("wpe", Embedding(config.block_size, config.n_embd, fill));
  else if (config.pos_encoding == "sinusoidal")
    sinusoid_ = sinusoidal_table(config.block_size, config.n_embd);
  else
    rope_ = std::make_shared<Rope>(config.block_size, config.head_size(), config.rope_base);
  drop = register_module("drop", Dropout(config.dropout));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) h->push_back(Block(config, fill));
  ln_f = register_module("ln_f", Norm(config.norm, config.n_embd, config.bias, config.norm_eps));
  if (!config.tie_embeddings)
    lm_head = register_module("lm_head", Linear(config.n_embd, config.vocab_size, /*bias=*/false, fill));
  if (initialise) init_weights();
}

void GPTImpl::init_weights() {
  // GPT-2: every weight N(0, 0.02), biases zero, norms one; the output projections of each
  // residual branch get 0.02 / sqrt(2 n_layer) so the residual stream's variance does not grow
  // with depth.
  torch::NoGradGuard no_grad;
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    const bool is_norm = name.find("ln_") != std::string::npos;
    if (is_norm) continue;  // ones / zeros from Norm's constructor
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();
    } else if (name.find("c_proj.weight") != std::string::npos) {
      p.normal_(0.0, proj_std);
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

torch::Tensor GPTImpl::embed(const torch::Tensor& idx, int64_t start_pos) {
  const int64_t T = idx.size(1);
  // RoPE has no position table: a cached decode may count past block_size (a sliding window, see
  // forward_cached); the tables of learned and sinusoidal positions end at block_size.
  const int64_t last = rope_ ? T : start_pos + T;
  if (last > config_.block_size)
    throw std::invalid_argument(fmt::format("[model] sequence of {} positions exceeds block_size {}",
                                            start_pos + T, config_.block_size));
  auto x = wte(idx);  // (B, T, C)
  if (wpe) {
    auto pos = torch::arange(start_pos, start_pos + T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
    x = x + wpe(pos);  // (B, T, C) + (T, C)
  } else if (sinusoid_.defined()) {
    if (sinusoid_.device() != idx.device()) sinusoid_ = sinusoid_.to(idx.device());
    x = x + sinusoid_.narrow(0, start_pos, T).to(x.scalar_type());  // (B, T, C) + (T, C)
  }
  return drop(x);
}

torch::Tensor GPTImpl::run_blocks(torch::Tensor x, int64_t start_pos, KVCache* cache,
                                  std::vector<torch::Tensor>* weights) {
  for (size_t i = 0; i < h->size(); ++i) {
    AttentionContext ctx;
    ctx.start_pos = start_pos;
    ctx.rope = rope_.get();
    if (cache) {
      ctx.k_cache = &cache->k[i];
      ctx.v_cache = &cache->v[i];
    }
    if (weights) ctx.weights = &(*weights)[i];
    x = h[i]->as<Block>()->forward(x, ctx);  // (B, T, C)
  }
  return ln_f(x);
}

torch::Tensor GPTImpl::head(const torch::Tensor& x, bool capped) {
  auto logits = dense(x, lm_head ? lm_head->weight : wte->weight);  // (B, T, V); tied: wte's weights
  const double cap = config_.logit_softcap;
  if (cap > 0 && capped) logits = torch::tanh(logits / cap) * cap;  // smooth, bounded by ±cap, ≈ identity for small logits
  return logits;
}

std::pair<torch::Tensor, torch::Tensor> GPTImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto x = run_blocks(embed(idx, 0), 0, nullptr, nullptr);  // (B, T, C)
  if (!targets.defined()) {
    auto last = x.narrow(1, x.size(1) - 1, 1);  // (B, 1, C): only the next token matters
    return {head(last), torch::Tensor()};
  }
  return head_and_loss(x, targets);
}

std::pair<torch::Tensor, torch::Tensor> GPTImpl::head_and_loss(const torch::Tensor& x, const torch::Tensor& targets) {
  const double cap = config_.logit_softcap;
  if (cap > 0 && x.device().is_cpu()) {  // the cap folded into the loss's pass (model/fast/cross_entropy.h)
    auto raw = head(x, /*capped=*/false);  // (B, T, V)
    const int64_t V = raw.size(-1);
    auto [loss, capped] = softcapped_cross_entropy(raw.reshape({-1, V}), targets.reshape({-1}), cap);
    return {capped.view(raw.sizes()), loss};
  }
  auto logits = head(x);  // (B, T, V)
  const int64_t V = logits.size(-1);
  auto loss = next_token_loss(logits.reshape({-1, V}), targets.reshape({-1}));  // (B*T, V), (B*T,) -> scalar
  return {logits, loss};
}

torch::Tensor GPTImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto x = run_blocks(embed(idx, 0), 0, nullptr, nullptr);  // (B, T, C)
  const auto rows = x.reshape({-1, x.size(-1)});             // (B*T, C)
  const auto& w = lm_head ? lm_head->weight : wte->weight;  // (V, C)
  // By chunks: training in fp32 on the CPU (head_cross_entropy_applies); under CPU autocast the head
  // stays forward's bf16 product.
  if (torch::GradMode::is_enabled() && !at::autocast::is_autocast_enabled(at::kCPU) &&
      head_cross_entropy_applies(rows, w))
    return head_cross_entropy(rows, w, targets.reshape({-1}), config_.logit_softcap);
  return head_and_loss(x, targets).second;  // forward's
}

torch::Tensor GPTImpl::logits(const torch::Tensor& idx) { return head(run_blocks(embed(idx, 0), 0, nullptr, nullptr)); }

std::vector<torch::Tensor> GPTImpl::attention_maps(const torch::Tensor& idx) {
  torch::NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  std::vector<torch::Tensor> weights(h->size());
  run_blocks(embed(idx, 0), 0, nullptr, &weights);
  train(was_training);
  return weights;
}

KVCache GPTImpl::make_cache() const {
  KVCache cache;
  cache.k.resize(config_.n_layer);
  cache.v.resize(config_.n_layer);
  return cache;
}

void GPTImpl::freeze_qkv_weights(bool frozen) {
  for (size_t i = 0; i < h->size(); ++i) h[i]->as<Block>()->attn->freeze_qkv_weights(frozen);
}

torch::Tensor GPTImpl::forward_cached(const torch::Tensor& idx_new, KVCache& cache) {
  if (cache.k.size() != h->size()) cache = make_cache();
  const int64_t start = cache.length(), T = idx_new.size(1);
  if (start + T > config_.block_size && (!rope_ || T > 1))
    throw std::invalid_argument(fmt::format(
        "[model] the KV cache holds {} positions and block_size is {}: {}", start, config_.block_size,
        rope_ ? "past block_size, add one token at a time (a sliding window)"
              : "learned and sinusoidal positions end at block_size (clear the cache and recompute the window)"));
  auto x = run_blocks(embed(idx_new, start), start, &cache, nullptr);  // (B, T_new, C)
  cache.len = start + T;
  auto last = x.select(1, x.size(1) - 1);                               // (B, C)
  return head(last);                                                     // (B, V)
}

int64_t GPTImpl::num_params(bool non_embedding) const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  if (non_embedding && wpe) n -= wpe->weight.numel();
  return n;
}

double GPTImpl::flops_per_token() const {
  const double N = static_cast<double>(num_params());
  const double L = config_.n_layer, H = config_.n_head, Q = config_.head_size(), T = config_.block_size;
  return 6.0 * N + 12.0 * L * H * Q * T;
}

}  // namespace nanogpt::model
