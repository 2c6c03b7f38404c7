// Causal self-attention (see attention.h).
#include "model/attention.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <tuple>

#include "model/fast/chunked_attention.h"
#include "model/fast/decode_attention.h"
#include "model/fast/flash_attention.h"
#include "model/fast/linear.h"
#include "model/fast/rms_norm.h"

namespace nanogpt::model {
namespace {

// softmax(q kᵀ / √hs + mask) v through LibTorch's scaled_dot_product_attention, which picks a fused
// (flash / memory-efficient) kernel on the CPU and on CUDA where the inputs allow. q (B, nh, Tq, hs),
// k and v (B, nkv, Tk, hs): grouped-query heads are shared inside the kernel, not copied. `mask` is
// undefined (every key visible) or bool (Tq, Tk), true = masked out; `is_causal` uses the kernel's
// own mask (only when Tq == Tk).
torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& mask, bool is_causal, double dropout_p) {
  std::optional<at::Tensor> attend;
  if (mask.defined()) attend = mask.logical_not();  // SDPA's bool mask: true = attend
  const bool grouped = q.size(1) != k.size(1);
  return at::scaled_dot_product_attention(q, k, v, attend, dropout_p, is_causal, /*scale=*/std::nullopt,
                                          /*enable_gqa=*/grouped);
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& config, Fill fill)
    : n_head_(config.n_head),
      n_kv_head_(config.kv_heads()),
      head_size_(config.head_size()),
      block_size_(config.block_size),
      qk_norm_(config.qk_norm),
      dropout_(config.dropout),
      attention_(config.attention) {
  const int64_t C = config.n_embd, kv_width = n_kv_head_ * head_size_;
  q_proj = register_module("q_proj", Linear(C, C, config.bias, fill));
  k_proj = register_module("k_proj", Linear(C, kv_width, config.bias, fill));
  v_proj = register_module("v_proj", Linear(C, kv_width, config.bias, fill));
  c_proj = register_module("c_proj", Linear(C, C, config.bias, fill));
  attn_dropout = register_module("attn_dropout", Dropout(config.dropout));
  resid_dropout = register_module("resid_dropout", Dropout(config.dropout));
}

torch::Tensor CausalSelfAttentionImpl::causal_mask(int64_t start_pos, int64_t T, int64_t Tk, torch::Device device) {
  if (!mask_.defined() || mask_.device() != device)
    mask_ = torch::ones({block_size_, block_size_}, torch::TensorOptions().dtype(torch::kBool).device(device))
                .triu(1);  // (block, block): key j hidden from query i when j > i
  // Queries are absolute positions start_pos .. start_pos+T-1; keys are 0 .. Tk-1.
  return mask_.narrow(0, start_pos, T).narrow(1, 0, Tk);  // (T, Tk)
}

torch::Tensor CausalSelfAttentionImpl::causal_bias(int64_t start_pos, int64_t T, int64_t Tk, torch::Device device) {
  if (!bias_.defined() || bias_.device() != device)
    bias_ = torch::zeros({block_size_, block_size_}, torch::TensorOptions().device(device))
                .masked_fill(causal_mask(0, block_size_, block_size_, device), -std::numeric_limits<float>::infinity());
  return bias_.narrow(0, start_pos, T).narrow(1, 0, Tk);  // (T, Tk): 0 where visible, -inf where hidden
}

torch::Tensor CausalSelfAttentionImpl::math_attention(const torch::Tensor& q, const torch::Tensor& k,
                                                      const torch::Tensor& v, int64_t start_pos,
                                                      torch::Tensor* weights_out) {
  const int64_t B = q.size(0), nh = q.size(1), T = q.size(2), Tk = k.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_size_));
  auto q3 = q.reshape({B * nh, T, head_size_});                   // (B*nh, T, hs)
  auto kt = k.reshape({B * nh, Tk, head_size_}).transpose(1, 2);  // (B*nh, hs, Tk)
  torch::Tensor att;
  if (T > 1) {
    // Score and mask in one kernel: scale * Q Kᵀ plus the causal mask as an additive 0 / -inf bias,
    // so hidden keys get exactly zero weight after the softmax.
    auto bias = causal_bias(start_pos, T, Tk, q.device()).to(q.scalar_type());  // bf16 when the model runs in bf16
    att = torch::baddbmm(bias, q3, kt, /*beta=*/1.0, /*alpha=*/scale);       // (B*nh, T, Tk)
  } else {  // one new query sees every cached key: nothing to mask
    att = torch::bmm(q3, kt) * scale;
  }
  // Softmax in fp32 whatever the scores' dtype (bf16 under autocast), as PyTorch's autocast does:
  // a bf16 exp and sum over a long row loses the small weights.
  att = torch::softmax(att.view({B, nh, T, Tk}), -1, torch::kFloat);  // (B, nh, T, Tk), rows sum to 1
  if (weights_out) *weights_out = att;
  att = attn_dropout(att);
  return att.to(v.scalar_type()).matmul(v);  // (B, nh, T, hs): each query's weighted mix of values
}

void CausalSelfAttentionImpl::ensure_cache(torch::Tensor& cache, int64_t B, const torch::TensorOptions& options,
                                           int64_t start_pos) {
  if (cache.defined() && cache.size(0) == B && cache.scalar_type() == options.dtype().toScalarType() &&
      cache.device() == options.device())
    return;
  auto buffer = torch::empty({B, n_kv_head_, block_size_, head_size_}, options);  // (B, nkv, block, hs)
  const int64_t filled = std::min(start_pos, block_size_);                        // slots holding earlier positions
  if (filled > 0 && cache.defined() && cache.dim() != 4)  // the quantized decoder's int8 keys and values
    throw std::invalid_argument(
        "[model] the KV cache holds the quantized decoder's int8 keys and values, which only it reads: clear the "
        "cache and recompute the window");
  if (filled > 0) buffer.narrow(2, 0, filled).copy_(cache.narrow(2, 0, filled));
  cache = buffer;
}

void CausalSelfAttentionImpl::freeze_qkv_weights(bool frozen) {
  frozen_w_ = frozen_b_ = torch::Tensor();
  if (!frozen) return;
  auto [w, b] = qkv_weights();
  frozen_w_ = w;
  frozen_b_ = b;
}

std::pair<torch::Tensor, torch::Tensor> CausalSelfAttentionImpl::qkv_weights() {
  if (frozen_w_.defined()) return {frozen_w_, frozen_b_};
  // Concatenated at every call: a cached copy would go stale when the optimizer updates the
  // weights in place through its flat buffer (which does not bump the parameters' versions).
  // Only sampling, which changes no weight, freezes a copy (freeze_qkv_weights).
  auto w = torch::cat({q_proj->weight, k_proj->weight, v_proj->weight});  // (C + 2 kv, C)
  auto b = q_proj->bias.defined() ? torch::cat({q_proj->bias, k_proj->bias, v_proj->bias}) : torch::Tensor();
  return {w, b};
}

bool CausalSelfAttentionImpl::decodes_on_cpu(const torch::Tensor& x, const AttentionContext& ctx) const {
  return x.size(1) == 1 && ctx.k_cache && !ctx.weights && !is_training() && x.device().is_cpu() &&
         !torch::GradMode::is_enabled() && !at::autocast::is_autocast_enabled(at::kCPU) &&
         x.scalar_type() == torch::kFloat;
}

torch::Tensor CausalSelfAttentionImpl::decode_one_token(const torch::Tensor& x, const AttentionContext& ctx) {
  const int64_t B = x.size(0);
  auto [w, b] = qkv_weights();
  auto qkv = dense(x, w, b).contiguous();  // (B, 1, (nh + 2 nkv) hs)
  ensure_cache(*ctx.k_cache, B, qkv.options(), ctx.start_pos);
  ensure_cache(*ctx.v_cache, B, qkv.options(), ctx.start_pos);
  const float* cos2 = ctx.rope ? ctx.rope->cos2_row(ctx.start_pos) : nullptr;
  const float* sin2 = ctx.rope ? ctx.rope->sin2_row(ctx.start_pos) : nullptr;
  auto y = decode_attention(qkv, *ctx.k_cache, *ctx.v_cache, ctx.start_pos, n_head_, n_kv_head_, cos2, sin2,
                            qk_norm_ ? qk_norm_eps : 0.0);  // (B, 1, C)
  return resid_dropout(dense(y, c_proj->weight, c_proj->bias));
}

std::pair<torch::Tensor, torch::Tensor> CausalSelfAttentionImpl::append_to_cache(const torch::Tensor& k,
                                                                                 const torch::Tensor& v,
                                                                                 const AttentionContext& ctx) {
  const int64_t B = k.size(0), T = k.size(2), slot = ctx.start_pos % block_size_;
  TORCH_CHECK(slot + T <= block_size_, "append_to_cache: ", T, " positions from ", ctx.start_pos,
              " would wrap around the cache's ", block_size_, " slots (only one token at a time may)");
  ensure_cache(*ctx.k_cache, B, k.options(), ctx.start_pos);
  ensure_cache(*ctx.v_cache, B, v.options(), ctx.start_pos);
  ctx.k_cache->narrow(2, slot, T).copy_(k);
  ctx.v_cache->narrow(2, slot, T).copy_(v);
  const int64_t Tk = std::min(ctx.start_pos + T, block_size_);  // every filled slot
  return {ctx.k_cache->narrow(2, 0, Tk), ctx.v_cache->narrow(2, 0, Tk)};  // (B, nkv, Tk, hs) each
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x, const AttentionContext& ctx) {
  if (decodes_on_cpu(x, ctx)) return decode_one_token(x, ctx);
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), kv_width = n_kv_head_ * head_size_;

  // 1. Project: Q, K and V are three projections, computed as one GEMM over the concatenated
  //    weights (the same arithmetic, one kernel); split, not narrow, so that the backward is one
  //    concatenation.
  auto [w, b] = qkv_weights();                                          // (C + 2 kv, C), (C + 2 kv)
  auto qkv = dense(x, w, b).split_with_sizes({C + kv_width, kv_width}, -1);  // [q k], v: (B, T, ·)
  auto qk = qkv[0].view({B, T, n_head_ + n_kv_head_, head_size_});      // (B, T, nh + nkv, hs)
  auto v = qkv[1].view({B, T, n_kv_head_, head_size_}).transpose(1, 2);  // (B, nkv, T, hs)

  // QK-norm (optional): every head's query and key scaled to RMS 1, so no score can grow without
  // bound however large the projections get.
  if (qk_norm_) qk = fast_rms_norm(qk, std::nullopt, qk_norm_eps);

  // 2. Rotate: RoPE turns q and k by their positions (both at once), so scores depend on offsets.
  torch::Tensor q, k;  // (B, nh, T, hs), (B, nkv, T, hs)
  if (ctx.rope) {
    std::tie(q, k) = ctx.rope->apply_split(qk, ctx.start_pos, n_head_);
  } else {
    auto q_k = qk.split_with_sizes({n_head_, n_kv_head_}, 2);
    q = q_k[0].transpose(1, 2);
    k = q_k[1].transpose(1, 2);
  }

  // Decoding: keys and values of earlier positions come from the cache.
  if (ctx.k_cache) std::tie(k, v) = append_to_cache(k, v, ctx);  // (B, nkv, Tk, hs)

  // 3-6. Score, mask, softmax, weigh. The math path spells them out; LibTorch's fused kernels
  //      (scaled_dot_product_attention) compute the same without materialising the (T, Tk) scores.
  //      `auto` trains on the CPU with the math path's arithmetic, not LibTorch's fused CPU kernel:
  //      that one is slow backwards (35% of a CPU-preset step in bf16) and has no dropout (with
  //      attention dropout it falls back to its own math kernel and a Bernoulli mask, ~0.4 s per 25M
  //      values). Measured per step, math vs SDPA: CPU preset bf16 11.5 vs 26.5 ms, fp32 25.5 vs
  //      26.6 ms; Tang CPU bf16 44.3 vs 55.1 ms; full preset bf16 without dropout 1.81 vs 2.30 s (at
  //      3.8 vs 2.7 GB), with dropout 10.1 vs 12.7 s (fp32). Evaluation, prefill and CUDA keep the
  //      fused kernels. That arithmetic runs as one autograd node (model/fast/chunked_attention.h):
  //      the two batched products around a fused causal softmax, in chunks that recompute the
  //      weights in backward where a layer's (B, nh, T, T) weights outgrow the cache (the full
  //      preset: 150 MB per layer), in one chunk whose weights are kept below that.
  //      `flash` (model/fast/flash_attention.h) is FlashAttention's blocked online softmax on the CPU
  //      (no (T, T) tensor at all, causal blocks skipped, dropout inside); on other devices, or with
  //      a KV cache, it is sdpa. `auto` trains with it where it beats chunked: in fp32, and in bf16
  //      from T = 128 on (flash_attention_trains).
  const int64_t Tk = k.size(2);
  const bool cpu_training = x.device().is_cpu() && is_training() && torch::GradMode::is_enabled();
  const bool flash_fits = !ctx.weights && T == Tk && x.device().is_cpu() &&
                          (v.scalar_type() == torch::kFloat || v.scalar_type() == torch::kBFloat16);
  const bool flash = flash_fits && (attention_ == "flash" ||
                                    (attention_ == "auto" && cpu_training && flash_attention_trains(T, v.scalar_type())));
  const bool fused = !flash && !ctx.weights &&
                     (attention_ == "sdpa" || attention_ == "flash" || (attention_ == "auto" && !cpu_training));
  const int64_t chunk_pairs = attention_chunk_pairs(T, Tk);
  const bool chunked = !ctx.weights && T == Tk &&
                       (attention_ == "chunked" || (attention_ == "auto" && cpu_training));
  torch::Tensor y;
  if (flash) {
    const auto dtype = v.scalar_type();  // under autocast the projections' bf16
    y = flash_attention(q.to(dtype), k.to(dtype), v, is_training() ? dropout_ : 0.0);  // (B, nh, T, hs)
  } else if (fused) {
    const bool plain_causal = T == Tk;  // no cached prefix: the kernel's own causal mask fits
    auto mask = (plain_causal || T == 1) ? torch::Tensor() : causal_mask(ctx.start_pos, T, Tk, x.device());
    y = fused_attention(q, k, v, mask, plain_causal && T > 1, is_training() ? dropout_ : 0.0);  // (B, nh, T, hs)
  } else {
    if (n_kv_head_ != n_head_) {  // each kv head serves n_head / n_kv_head consecutive query heads
      k = k.repeat_interleave(n_head_ / n_kv_head_, 1);  // (B, nh, Tk, hs)
      v = v.repeat_interleave(n_head_ / n_kv_head_, 1);
    }
    if (chunked) {
      const auto dtype = v.scalar_type();  // under autocast the projections' bf16
      y = chunked_attention(q.to(dtype), k.to(dtype), v, is_training() ? dropout_ : 0.0, chunk_pairs);  // (B, nh, T, hs)
    } else {
      y = math_attention(q, k, v, ctx.start_pos, ctx.weights);  // (B, nh, T, hs)
    }
  }

  // 7. Project: heads side by side, then the output projection.
  y = y.transpose(1, 2).contiguous().view({B, T, C});  // (B, T, C)
  return resid_dropout(dense(y, c_proj->weight, c_proj->bias, Result::kWide));  // joins the fp32 residual
}

}  // namespace nanogpt::model
