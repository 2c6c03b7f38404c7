// The static KV cache and the one-token step over it (see static_cache.h).
#include "model/static_cache.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "model/attention.h"
#include "model/mlp.h"
#include "model/norm.h"
#include "model/positions.h"

namespace nanogpt::model {

StaticKVCache::StaticKVCache(const ModelConfig& config, int64_t slots, const torch::TensorOptions& options,
                             int64_t length) {
  if (slots < 1) throw std::invalid_argument(fmt::format("[model] a static KV cache needs >= 1 slot, got {}", slots));
  if (length < 0 || length > config.block_size)
    throw std::invalid_argument(fmt::format(
        "[model] a static KV cache holds 1 to block_size ({}) positions a slot (0 = block_size), got {}",
        config.block_size, length));
  const int64_t L = length == 0 ? config.block_size : length;
  for (int64_t i = 0; i < config.n_layer; ++i) {
    // Zeros, not empty: a masked position's weight is exactly 0, and 0 x (a NaN left in memory) is NaN.
    k.push_back(torch::zeros({slots, config.kv_heads(), L, config.head_size()}, options));
    v.push_back(torch::zeros_like(k.back()));
  }
  pos = torch::zeros({slots}, torch::TensorOptions().dtype(torch::kLong).device(options.device()));
}

void StaticKVCache::load(int64_t slot, const KVCache& from, int64_t row, int64_t n) {
  if (n <= 0) return;
  for (size_t i = 0; i < k.size(); ++i) {
    k[i][slot].narrow(1, 0, n).copy_(from.k[i][row].narrow(1, 0, n));  // (nkv, n, hs)
    v[i][slot].narrow(1, 0, n).copy_(from.v[i][row].narrow(1, 0, n));
  }
}

void StaticKVCache::move(int64_t from, int64_t to) {
  if (from == to) return;
  for (size_t i = 0; i < k.size(); ++i) {
    k[i][to].copy_(k[i][from]);
    v[i][to].copy_(v[i][from]);
  }
  pos.narrow(0, to, 1).copy_(pos.narrow(0, from, 1));
}

DecodeWeights DecodeWeights::from(GPT& model, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  DecodeWeights w;
  w.config = model->config();
  w.dtype = dtype;
  const auto& c = w.config;
  auto params = model->named_parameters();
  auto get = [&](const std::string& name) { return params.contains(name) ? params[name].detach() : torch::Tensor(); };
  auto low = [&](const torch::Tensor& t) { return t.defined() ? t.to(dtype) : t; };
  const auto device = get("wte.weight").device();
  w.wte = get("wte.weight");
  w.head = low(c.tie_embeddings ? w.wte : get("lm_head.weight"));
  if (c.pos_encoding == "learned") w.wpe = get("wpe.weight");
  if (c.pos_encoding == "sinusoidal") w.wpe = sinusoidal_table(c.block_size, c.n_embd).to(device);
  w.ln_f_w = get("ln_f.weight");
  w.ln_f_b = get("ln_f.bias");
  auto i = torch::arange(c.head_size() / 2, torch::TensorOptions().dtype(torch::kDouble).device(device));
  w.inv_freq = torch::pow(c.rope_base, -2.0 * i / static_cast<double>(c.head_size()));  // as Rope's tables
  w.key_index = torch::arange(c.block_size, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto cat = [&](const std::string& p, const char* what) {
    auto q = get(p + "q_proj." + what);
    return q.defined() ? low(torch::cat({q, get(p + "k_proj." + what), get(p + "v_proj." + what)})) : q;
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("h.{}.", l);
    Layer layer;
    layer.ln_1_w = get(p + "ln_1.weight");
    layer.ln_1_b = get(p + "ln_1.bias");
    layer.ln_2_w = get(p + "ln_2.weight");
    layer.ln_2_b = get(p + "ln_2.bias");
    layer.w_qkv = cat(p + "attn.", "weight");
    layer.b_qkv = cat(p + "attn.", "bias");
    layer.w_o = low(get(p + "attn.c_proj.weight"));
    layer.b_o = low(get(p + "attn.c_proj.bias"));
    layer.w_fc = low(get(p + "mlp.c_fc.weight"));
    layer.b_fc = low(get(p + "mlp.c_fc.bias"));
    layer.w_proj = low(get(p + "mlp.c_proj.weight"));
    layer.b_proj = low(get(p + "mlp.c_proj.bias"));
    w.layers.push_back(std::move(layer));
  }
  return w;
}

namespace {

torch::Tensor norm(const ModelConfig& c, const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (c.norm != "rmsnorm") return torch::layer_norm(x, {c.n_embd}, weight, bias, NormImpl::eps);
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + NormImpl::eps) * weight;  // as NormImpl, x fp32
}

// x (..., hs) turned by RoPE: x cos2 + [x2, x1] sin2, with cos2 = [cos, cos], sin2 = [-sin, sin] (B, 1, hs).
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos2, const torch::Tensor& sin2) {
  auto halves = x.chunk(2, -1);
  return x * cos2 + torch::cat({halves[1], halves[0]}, -1) * sin2;
}

}  // namespace

torch::Tensor decode_step(const DecodeWeights& w, StaticKVCache& cache, const torch::Tensor& tokens) {
  const auto& c = w.config;
  const int64_t B = tokens.size(0), C = c.n_embd, nh = c.n_head, nkv = c.kv_heads(), hs = c.head_size();
  const int64_t L = cache.length(), g = nh / nkv;
  const auto dt = w.dtype;
  auto pos = cache.pos.narrow(0, 0, B);  // (B,)
  auto x = w.wte.index_select(0, tokens);  // (B, C) fp32
  if (w.wpe.defined()) x = x + w.wpe.index_select(0, pos.clamp_max(c.block_size - 1));
  torch::Tensor cos2, sin2;  // (B, 1, hs): this token's rotation in each row
  if (c.pos_encoding == "rope") {
    auto angle = pos.to(torch::kDouble).unsqueeze(1) * w.inv_freq;  // (B, hs/2) in double, as Rope's tables
    auto cos = angle.cos(), sin = angle.sin();
    cos2 = torch::cat({cos, cos}, -1).to(torch::kFloat).unsqueeze(1);
    sin2 = torch::cat({-sin, sin}, -1).to(torch::kFloat).unsqueeze(1);
  }
  auto slot = (pos % L).view({B, 1, 1, 1}).expand({B, nkv, 1, hs});                   // where each row's key goes
  auto hidden = (w.key_index.narrow(0, 0, L).view({1, 1, 1, L}) > pos.view({B, 1, 1, 1}));  // (B, 1, 1, L): not written yet
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const auto& p = w.layers[l];
    auto qkv = torch::linear(norm(c, x, p.ln_1_w, p.ln_1_b).to(dt), p.w_qkv, p.b_qkv);  // (B, (nh + 2 nkv) hs)
    auto parts = qkv.view({B, nh + 2 * nkv, hs}).split_with_sizes({nh + nkv, nkv}, 1);
    auto qk = parts[0];                                          // (B, nh + nkv, hs)
    auto v = parts[1];                                           // (B, nkv, hs)
    if (c.qk_norm) qk = torch::rms_norm(qk, {hs}, std::nullopt, CausalSelfAttentionImpl::qk_norm_eps);
    if (cos2.defined()) qk = rotate(qk.to(torch::kFloat), cos2, sin2).to(dt);
    auto q = qk.narrow(1, 0, nh), k = qk.narrow(1, nh, nkv);  // (B, nh, hs), (B, nkv, hs)
    auto keys = cache.k[l].narrow(0, 0, B), values = cache.v[l].narrow(0, 0, B);  // (B, nkv, L, hs)
    keys.scatter_(2, slot, k.unsqueeze(2));
    values.scatter_(2, slot, v.unsqueeze(2));
    auto att = torch::matmul(q.reshape({B, nkv, g, hs}), keys.transpose(-2, -1)) * scale;  // (B, nkv, g, L)
    att = torch::softmax(att.masked_fill(hidden, -std::numeric_limits<double>::infinity()), -1, torch::kFloat);
    auto y = torch::matmul(att.to(dt), values).reshape({B, C});  // (B, nkv, g, hs) -> (B, C)
    x = x + torch::linear(y, p.w_o, p.b_o).to(torch::kFloat);
    auto h = torch::linear(norm(c, x, p.ln_2_w, p.ln_2_b).to(dt), p.w_fc, p.b_fc);  // (B, H)
    x = x + torch::linear(mlp_activation(c.mlp, h), p.w_proj, p.b_proj).to(torch::kFloat);
  }
  auto logits = torch::linear(norm(c, x, w.ln_f_w, w.ln_f_b).to(dt), w.head).to(torch::kFloat);  // (B, V)
  if (c.logit_softcap > 0) logits = torch::tanh(logits / c.logit_softcap) * c.logit_softcap;
  return logits;
}

}  // namespace nanogpt::model
