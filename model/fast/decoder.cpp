// One-token whole-model decoding on the CPU (see decoder.h): the step, which embeds each row's
// token and runs every block and the head in one parallel region (each thread takes its measured
// share of every product's rows and of attention's heads, and waits only where the next stage reads
// what all of them wrote), and the KV caches it reads and appends to (fp32, bf16 under autocast, or
// int8 when quantized; taken over from the general path's layout where it filled them). The packed
// weights are laid out in decoder_weights.cpp; the products are matvec.cpp's, panels.cpp's,
// int8_rows.cpp's and int4_tiles.cpp's.
#include "model/fast/decoder.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "model/attention.h"
#include "model/fast/decode_attention.h"
#include "model/fast/dot.h"
#include "model/fast/simd.h"
#include "model/norm.h"

namespace nanogpt::model {

namespace {

// This thread's index in the parallel region and the region's size (0 and 1 outside one).
int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
int team_size() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

// y[b * y_stride + r] += bias[r] for rows r0 <= r < r1 and every b < B; nothing when bias is nullptr.
void add_bias(const float* bias, int64_t B, int64_t r0, int64_t r1, float* y, int64_t y_stride) {
  if (!bias) return;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = r0; r < r1; ++r) y[b * y_stride + r] += bias[r];
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }

// h[r] = GELU(h[r]) (exact, like torch::gelu) for r0 <= r < r1, vectorised (simd.h's gelu_erf).
NANOGPT_KERNEL(NANOGPT_FMA_CLONES, void, gelu_rows, (float* __restrict h, int64_t r0, int64_t r1), (h, r0, r1), {
_Pragma("omp simd")
  for (int64_t r = r0; r < r1; ++r) h[r] = gelu_erf(h[r]);
})

// h[r] = GELU's tanh approximation (GPT-2's, torch::gelu(h, "tanh")) for r0 <= r < r1.
void gelu_tanh_rows(float* __restrict h, int64_t r0, int64_t r1) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t r = r0; r < r1; ++r) {
    const float v = h[r];
    h[r] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
}

}  // namespace

void Decoder::Matrix::row(int64_t r, int64_t cols, float* out) const {
  std::fill(out, out + cols, 0.0f);
  add_row(r, cols, out);
}

void Decoder::Matrix::add_row(int64_t r, int64_t cols, float* out) const {
  if (f32) for (int64_t i = 0; i < cols; ++i) out[i] += f32[r * cols + i];
  else if (bf16) for (int64_t i = 0; i < cols; ++i) out[i] += load_float(bf16[r * cols + i]);
  else if (int4.data) for (int64_t i = 0; i < cols; ++i) out[i] += int4_weight(int4, r, i);
  else
    for (int64_t i = 0; i < cols; ++i)
      out[i] += int8.scale[r] * static_cast<float>(int32_t{int8.q[r * cols + i]} - 128);
}

void Decoder::Matrix::rows(const float* x, int64_t x_stride, int64_t B, int64_t cols, int64_t r0, int64_t r1,
                           float* y, int64_t y_stride, bool accumulate) const {
  if (panels.data) matvec_rows(panels, x, x_stride, B, r0, r1, y, y_stride, accumulate);
  else if (bf16_panels.data) matvec_rows(bf16_panels, x, x_stride, B, r0, r1, y, y_stride, accumulate);
  else if (int4.data) matvec_rows(int4, x, x_stride, B, r0, r1, y, y_stride, accumulate);
  else if (int8.q) matvec_rows(int8, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate);
  else if (bf16) matvec_rows(bf16, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate);
  else matvec_rows(f32, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate);
}

namespace {

// One row's LayerNorm (or RMSNorm: `rms`) in fp32 lane sums, vectorised in each instruction-set
// clone. (In scalar double sums, as before, the 13 norms of a full-preset token took ~6% of it.)
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, norm_row, (const float* __restrict x, const float* __restrict w,
               const float* __restrict b, int64_t C, bool rms, float eps, float* __restrict out), (x, w, b, C, rms, eps,
               out), {
  float mean = 0.0f;
  if (!rms) {
_Pragma("omp simd reduction(+ : mean)")
    for (int64_t i = 0; i < C; ++i) mean += x[i];
    mean /= static_cast<float>(C);
  }
  float var = 0.0f;  // layernorm: the biased variance; rmsnorm: the mean square
_Pragma("omp simd reduction(+ : var)")
  for (int64_t i = 0; i < C; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
  if (b) {
_Pragma("omp simd")
    for (int64_t i = 0; i < C; ++i) out[i] = (x[i] - mean) * inv * w[i] + b[i];
  } else {
_Pragma("omp simd")
    for (int64_t i = 0; i < C; ++i) out[i] = (x[i] - mean) * inv * w[i];
  }
})

}  // namespace

void Decoder::norm(const float* x, const float* w, const float* b, float* out) const {
  norm_row(x, w, b, C_, rms_, static_cast<float>(config_.norm_eps), out);
}

namespace {

[[noreturn]] void throw_other_batch(int64_t start, int64_t B) {
  throw std::invalid_argument(fmt::format(
      "[model] the KV cache holds {} positions but not for a batch of {} (clear it, or keep the batch size)", start, B));
}

}  // namespace

void Decoder::ensure_cache(torch::Tensor& t, int64_t B, int64_t start) const {
  const int64_t block = config_.block_size;
  const auto dtype = bf16_ ? torch::kBFloat16 : torch::kFloat;
  if (t.defined() && t.dim() == 4 && t.size(0) == B && t.size(1) == nkv_ && t.size(2) == block && t.size(3) == hs_ &&
      t.scalar_type() == dtype && t.device().is_cpu() && t.is_contiguous())
    return;
  const int64_t filled = std::min(start, block);  // slots holding earlier positions
  if (filled > 0 && !(t.defined() && t.dim() == 4 && t.size(0) == B))
    throw_other_batch(start, B);
  auto buffer = torch::empty({B, nkv_, block, hs_}, dtype);  // (B, nkv, block, hs)
  if (filled > 0) buffer.narrow(2, 0, filled).copy_(t.narrow(2, 0, filled));
  t = buffer;
}

void Decoder::ensure_int8_cache(torch::Tensor& k, torch::Tensor& v, int64_t B, int64_t start) const {
  const int64_t block = config_.block_size, key_bytes = int8_keys_bytes(block, hs_),
                value_bytes = int8_values_bytes(block, hs_);
  const auto ours = [&](const torch::Tensor& t, int64_t bytes) {
    return t.defined() && t.dim() == 3 && t.size(0) == B && t.size(1) == nkv_ && t.size(2) == bytes &&
           t.scalar_type() == torch::kByte && t.device().is_cpu() && t.is_contiguous();
  };
  if (ours(k, key_bytes) && ours(v, value_bytes)) return;
  const int64_t filled = std::min(start, block);  // slots holding earlier positions
  const auto general = [&](const torch::Tensor& t) {
    return t.defined() && t.dim() == 4 && t.size(0) == B && t.size(1) == nkv_ && t.size(2) == block &&
           t.size(3) == hs_;
  };
  if (filled > 0 && !(general(k) && general(v)))
    throw_other_batch(start, B);
  auto keys = torch::zeros({B, nkv_, key_bytes}, torch::kByte);
  auto values = torch::zeros({B, nkv_, value_bytes}, torch::kByte);
  if (filled > 0) {  // the general path's cache: quantize its filled slots
    const auto k32 = k.narrow(2, 0, filled).to(torch::kFloat).contiguous();
    const auto v32 = v.narrow(2, 0, filled).to(torch::kFloat).contiguous();
    std::vector<int8_t> row(hs_);
    for (int64_t item = 0; item < B * nkv_; ++item)
      for (int64_t slot = 0; slot < filled; ++slot) {
        const int64_t at = (item * filled + slot) * hs_;
        int8_kv_write(keys.data_ptr<uint8_t>() + item * key_bytes, values.data_ptr<uint8_t>() + item * value_bytes,
                      block, hs_, slot, k32.data_ptr<float>() + at, v32.data_ptr<float>() + at, row.data());
      }
  }
  k = keys;
  v = values;
}

torch::Tensor Decoder::step(const torch::Tensor& tokens, KVCache& cache) { return run(tokens, &cache, nullptr); }

torch::Tensor Decoder::step(const torch::Tensor& tokens, const std::vector<KVCache*>& caches) {
  if (tokens.dim() == 1 && static_cast<int64_t>(caches.size()) != tokens.size(0))
    throw std::invalid_argument(fmt::format("[model] {} tokens for {} caches: the decoder takes one token per cache",
                                            tokens.size(0), caches.size()));
  for (auto* cache : caches)
    if (cache == nullptr) throw std::invalid_argument("[model] a null KV cache among the decoder's sequences");
  return run(tokens, nullptr, &caches);
}

torch::Tensor Decoder::run(const torch::Tensor& tokens, KVCache* shared, const std::vector<KVCache*>* own) {
  if (tokens.dim() != 1 || tokens.size(0) < 1 || tokens.scalar_type() != torch::kLong || !tokens.device().is_cpu())
    throw std::invalid_argument("[model] the decoder takes one int64 token per sequence on the CPU, (B,)");
  const int64_t B = tokens.size(0), block = config_.block_size, V = config_.vocab_size;
  const int64_t rows = own ? B : 1;  // caches: one of batch B, or B of batch 1
  const auto cache_of = [&](int64_t r) -> KVCache& { return own ? *(*own)[r] : *shared; };
  std::vector<int64_t> positions(B);  // each row's new position
  for (int64_t b = 0; b < B; ++b) positions[b] = cache_of(own ? b : 0).length();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = cache_of(r).length();
    if (pos >= block && !rope_)
      throw std::invalid_argument(fmt::format(
          "[model] the KV cache holds {} positions and block_size is {}: learned and sinusoidal positions end at "
          "block_size (clear the cache and recompute the window)",
          pos, block));
  }
  auto ids = tokens.contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    if (id[b] < 0 || id[b] >= V)
      throw std::invalid_argument(fmt::format("[model] token id {} is outside the vocabulary (0 .. {})", id[b], V - 1));
  for (int64_t r = 0; r < rows; ++r) {
    KVCache& cache = cache_of(r);
    if (static_cast<int64_t>(cache.k.size()) != config_.n_layer) {
      if (cache.length() > 0) throw std::invalid_argument("[model] the KV cache was made for another model");
      cache.k.assign(config_.n_layer, torch::Tensor());
      cache.v.assign(config_.n_layer, torch::Tensor());
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  // Four rows and more always take the threads: a step is then several times a token's work for
  // the same barriers, so a thread that loses its core costs proportionally less, and the thread
  // choice's short trials misjudged it: serving 16 and 64 streaming clients (full preset, 2 cores,
  // the clients and HTTP threads on the same cores) its trials chose one thread, 2,020-3,093 and
  // 2,346-2,440 tok/s, against 3,062-3,749 and 3,347-3,444 with the threads kept.
  ThreadChoice* choice = B < kThreadChoiceRows ? &threads_[B] : nullptr;
  const bool parallel = at::get_num_threads() > 1 && (!choice || choice->use_threads());
#ifdef _OPENMP
  const int threads = parallel ? at::get_num_threads() : 1;
#else
  const int threads = 1;  // built without OpenMP: no parallel region
#endif
  if (threads > 1 && split_.team() != threads) {  // the first token on these threads
    split_.reset(threads);
    busy_.assign(threads, 0.0);
  }
  const int64_t C = C_, H = hidden_;
  const int64_t scratch_size = (decode_attention_scratch(block, hs_) + 15) / 16 * 16;  // each thread's on a cache line
  x_.resize(B * C);
  xn_.resize(threads * B * C);  // each thread normalises into its own copy: no barrier for it
  qkv_.resize(B * qkv_width_);
  att_.resize(B * C);
  hidden_buf_.resize(B * fc_out_);
  attention_scratch_.resize(threads * scratch_size);
  float *x = x_.data(), *qkv = qkv_.data(), *att = att_.data(), *hid = hidden_buf_.data();

  // Embed: the token's row of wte plus the position's row of wpe or the sinusoidal table.
  for (int64_t b = 0; b < B; ++b) {
    wte_.row(id[b], C, x + b * C);
    if (wpe_) wpe_.add_row(positions[b], C, x + b * C);
    else if (sinusoid_.defined()) Matrix{sinusoid_.data_ptr<float>(), nullptr, {}, {}, {}, {}}.add_row(positions[b], C, x + b * C);
  }
  std::vector<const float*> cos2(rows, nullptr), sin2(rows, nullptr);  // each cache's RoPE rows
  for (int64_t r = 0; r < rows && rope_; ++r) {
    cos2[r] = rope_->cos2_row(positions[r]);
    sin2[r] = rope_->sin2_row(positions[r]);
  }
  const double qk_eps = config_.qk_norm ? CausalSelfAttentionImpl::qk_norm_eps : 0.0;
  // Layer i's caches at [i * rows + r]: fp32, bf16 with bf16_, int8 with kv_int8_.
  std::vector<void*> k_cache(config_.n_layer * rows), v_cache(config_.n_layer * rows);
  for (int64_t i = 0; i < config_.n_layer; ++i) {  // everything that may throw, before the parallel region
    for (int64_t r = 0; r < rows; ++r) {
      KVCache& cache = cache_of(r);
      const int64_t batch = own ? 1 : B, pos = positions[r];
      if (kv_int8_) {
        ensure_int8_cache(cache.k[i], cache.v[i], batch, pos);
      } else {
        ensure_cache(cache.k[i], batch, pos);
        ensure_cache(cache.v[i], batch, pos);
      }
      k_cache[i * rows + r] = cache.k[i].data_ptr();
      v_cache[i * rows + r] = cache.v[i].data_ptr();
    }
  }
  // The attention's items (each row's kv heads) cost about their cached positions each: the threads
  // split them by that. Serving, rows sit at any position, and the older sequences come first, so an
  // even count of items gave the first thread the longer caches, and the other waited for it.
  attention_ends_.resize(B * nkv_);
  for (int64_t g = 0; g < B * nkv_; ++g)
    attention_ends_[g] = (g > 0 ? attention_ends_[g - 1] : 0.0) +
                         static_cast<double>(std::min(positions[own ? g / nkv_ : 0] + 1, block) + 16);
  auto logits = torch::empty({B, V}, torch::kFloat);  // (B, V)
  float* out = logits.data_ptr<float>();
  const float cap = static_cast<float>(config_.logit_softcap);
  const bool gated = activation_ == Activation::swiglu;

  // One parallel region for the whole token: each thread takes its share of every product (whole
  // row blocks, in the fractions split_ keeps by the threads' measured speeds) and of the kv heads,
  // and waits at a barrier only where the next step reads what all of them wrote: five times a
  // layer. (A region per product, ~20 a token, cost more in waking the other thread than it saved
  // on the CPU-preset model.)
  bool split_measured = false;  // whether the region ran on split_'s team and timed every thread
  barrier_.reset(threads);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const auto start = std::chrono::steady_clock::now();
    const int tid = thread_index(), team = team_size();
    const bool measured = team > 1 && team == split_.team();  // (OpenMP may give fewer threads than asked)
    if (tid == 0) split_measured = measured;
    const auto share = [&](int64_t n, int64_t unit) {
      return measured ? split_.share(n, unit, tid) : WorkSplit::equal_share(n, unit, tid, team);
    };
    double waited = 0.0;  // seconds at the barriers
    const bool whole_team = team == barrier_.team();  // (else libgomp's barrier)
    const auto barrier = [&waited, whole_team, tid, this] {
      const auto arrived = std::chrono::steady_clock::now();
      if (whole_team) {
        barrier_.wait(tid);
      } else {
#pragma omp barrier
      }
      waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - arrived).count();
    };
    float* xn = xn_.data() + tid * B * C;
    float* scratch = attention_scratch_.data() + tid * scratch_size;
    const auto [q0, q1] = share(qkv_width_, unit_);
    const auto [c0, c1] = share(C, unit_);
    const auto [h0, h1] = share(H, unit_);
    const auto [v0, v1] = share(V, kRowBlock);
    const auto [g0, g1] = measured ? split_.share_costs(attention_ends_, tid)
                                   : WorkSplit::equal_share_costs(attention_ends_, tid, team);
    for (int64_t i = 0; i < config_.n_layer; ++i) {
      const Layer& l = layers_[i];
      // x + attn(ln_1(x))
      for (int64_t b = 0; b < B; ++b) norm(x + b * C, l.ln_1_w, l.ln_1_b, xn + b * C);
      l.qkv_w.rows(xn, C, B, C, q0, q1, qkv, qkv_width_, false);
      add_bias(l.qkv_b, B, q0, q1, qkv, qkv_width_);
      barrier();
      // The caches as their dtype's bits. g0 and g1 are copied in: C++17 lets a lambda capture a
      // structured binding only this way (g++ accepts a plain capture, clang rejects it).
      // Items g0 .. g1 of the batch's B * nkv kv heads: in one shared cache, or item b * nkv + j as
      // kv head j of row b's own cache (its item j, at its own position).
      const auto attend_items = [&](int64_t r, const float* in, float* y, int64_t begin, int64_t end) {
        void *kc = k_cache[i * rows + r], *vc = v_cache[i * rows + r];
        if (kv_int8_)
          decode_attention_groups_int8(in, static_cast<uint8_t*>(kc), static_cast<uint8_t*>(vc), y, block, hs_,
                                       positions[r], config_.n_head, nkv_, cos2[r], sin2[r], qk_eps, begin, end, scratch);
        else if (bf16_)
          decode_attention_groups(in, static_cast<uint16_t*>(kc), static_cast<uint16_t*>(vc), y, block, hs_,
                                  positions[r], config_.n_head, nkv_, cos2[r], sin2[r], qk_eps, begin, end, scratch);
        else
          decode_attention_groups(in, static_cast<float*>(kc), static_cast<float*>(vc), y, block, hs_, positions[r],
                                  config_.n_head, nkv_, cos2[r], sin2[r], qk_eps, begin, end, scratch);
      };
      if (!own) {
        attend_items(0, qkv, att, g0, g1);
      } else {
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t b = g / nkv_, j = g % nkv_;
          attend_items(b, qkv + b * qkv_width_, att + b * C, j, j + 1);
        }
      }
      barrier();
      l.o_w.rows(att, C, B, C, c0, c1, x, C, /*accumulate=*/true);  // the residual add, in place
      add_bias(l.o_b, B, c0, c1, x, C);
      barrier();
      // x + mlp(ln_2(x)); the activation on each thread's own rows, right after it computed them.
      for (int64_t b = 0; b < B; ++b) norm(x + b * C, l.ln_2_w, l.ln_2_b, xn + b * C);
      l.fc_w.rows(xn, C, B, C, h0, h1, hid, fc_out_, false);
      if (gated) l.fc_up_w.rows(xn, C, B, C, h0, h1, hid + H, fc_out_, false);
      add_bias(l.fc_b, B, h0, h1, hid, fc_out_);
      if (gated) add_bias(l.fc_b ? l.fc_b + H : nullptr, B, h0, h1, hid + H, fc_out_);
      for (int64_t b = 0; b < B; ++b) {
        float* hb = hid + b * fc_out_;
        if (activation_ == Activation::gelu) gelu_rows(hb, h0, h1);
        else if (activation_ == Activation::gelu_tanh) gelu_tanh_rows(hb, h0, h1);
        else if (activation_ == Activation::relu2)
          for (int64_t r = h0; r < h1; ++r) hb[r] = hb[r] > 0.0f ? hb[r] * hb[r] : 0.0f;
        else
          for (int64_t r = h0; r < h1; ++r) hb[r] = silu(hb[r]) * hb[H + r];  // silu(gate) * up, into the gate's place
      }
      barrier();
      l.proj_w.rows(hid, fc_out_, B, H, c0, c1, x, C, /*accumulate=*/true);
      add_bias(l.proj_b, B, c0, c1, x, C);
      barrier();
    }
    for (int64_t b = 0; b < B; ++b) norm(x + b * C, ln_f_w_, ln_f_b_, xn + b * C);
    head_.rows(xn, C, B, C, v0, v1, out, V, false);
    if (cap > 0)  // as GPT::head: cap * tanh(logits / cap)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t r = v0; r < v1; ++r) out[b * V + r] = std::tanh(out[b * V + r] / cap) * cap;
    if (measured) busy_[tid] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - waited;
  }
  if (split_measured) split_.update(busy_.data());  // every thread of the team wrote its busy time
  for (int64_t r = 0; r < rows; ++r) cache_of(r).len = positions[r] + 1;
  if (choice) choice->record(parallel, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return logits;
}

}  // namespace nanogpt::model
