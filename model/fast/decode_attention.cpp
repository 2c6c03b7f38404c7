// One-token attention as plain loops (see decode_attention.h).
#include "model/fast/decode_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "model/fast/avx512.h"
#include "model/fast/dot.h"
#include "model/fast/rope.h"
#include "model/fast/simd.h"

namespace nanogpt::model {
namespace {

// x (hs values) -> out, scaled to RMS 1: out = x / sqrt(mean(x²) + eps). out may be x.
void rms_normalise(const float* x, int64_t hs, double eps, float* out) {
  double sum = 0.0;
  for (int64_t i = 0; i < hs; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(hs) + eps));
  for (int64_t i = 0; i < hs; ++i) out[i] = x[i] * inv;
}

// The new query or key of one head, ready for scoring: QK-normalised when asked, then rotated.
void prepare(const float* x, int64_t hs, double qk_norm_eps, const float* cos2, const float* sin2, float* scratch,
             float* out) {
  if (qk_norm_eps > 0) {
    rms_normalise(x, hs, qk_norm_eps, scratch);
    x = scratch;
  }
  if (cos2) rope_rotate_row<false>(x, out, cos2, sin2, hs / 2);  // out = x cos2 + [x2, x1] sin2
  else std::copy(x, x + hs, out);
}

#if defined(__x86_64__) && defined(__GNUC__)
// o = Σ_t w[t] v_t for hs = 16 NV, the sums held in registers (two sets, even and odd t: two
// independent chains of adds). The plain loop below kept them in memory: every o[d] stored and
// loaded again for each key.
template <int NV, typename T>
__attribute__((target("avx512f"))) void weighted_values(const T* __restrict values, int64_t Tk, const float* w,
                                                        float* __restrict o) {
  constexpr int64_t hs = 16 * NV;
  __m512 even[NV], odd[NV];
  for (int k = 0; k < NV; ++k) even[k] = odd[k] = _mm512_setzero_ps();
  int64_t t = 0;
  for (; t + 2 <= Tk; t += 2) {
    const T* v = values + t * hs;
    const __m512 w0 = _mm512_set1_ps(w[t]), w1 = _mm512_set1_ps(w[t + 1]);
    for (int k = 0; k < NV; ++k) {
      even[k] = _mm512_fmadd_ps(w0, load16(v + 16 * k), even[k]);
      odd[k] = _mm512_fmadd_ps(w1, load16(v + hs + 16 * k), odd[k]);
    }
  }
  if (t < Tk) {
    const __m512 w0 = _mm512_set1_ps(w[t]);
    for (int k = 0; k < NV; ++k) even[k] = _mm512_fmadd_ps(w0, load16(values + t * hs + 16 * k), even[k]);
  }
  for (int k = 0; k < NV; ++k) _mm512_storeu_ps(o + 16 * k, _mm512_add_ps(even[k], odd[k]));
}

// Whether o = Σ_t w[t] v_t was computed here: AVX-512 kernels (dot.h) and a head size of 16, 32, 64
// or 128.
template <typename T>
bool weighted_values_avx512(const T* values, int64_t Tk, int64_t hs, const float* w, float* o) {
  if (!avx512_kernels()) return false;
  switch (hs) {
    case 16: weighted_values<1>(values, Tk, w, o); return true;
    case 32: weighted_values<2>(values, Tk, w, o); return true;
    case 64: weighted_values<4>(values, Tk, w, o); return true;
    case 128: weighted_values<8>(values, Tk, w, o); return true;
    default: return false;
  }
}
#else
template <typename T>
bool weighted_values_avx512(const T*, int64_t, int64_t, const float*, float*) { return false; }
#endif

// p[t] = softmax(p · scale)[t] and o = Σ_t p[t] v_t over Tk values (Tk, hs), fp32 or bf16 (raw
// bits), in fp32.
template <typename T>
__attribute__((always_inline)) inline void attend_softmax_values(const T* __restrict values, int64_t Tk, int64_t hs,
                                                                 float scale, float* __restrict p,
                                                                 float* __restrict o) {
#pragma omp simd
  for (int64_t t = 0; t < Tk; ++t) p[t] *= scale;
  const float inv_total = 1.0f / exp_shifted_sum(p, max_of(p, Tk), p, Tk);  // p = exp(p - max)
#pragma omp simd
  for (int64_t t = 0; t < Tk; ++t) p[t] *= inv_total;  // the weights
  if (weighted_values_avx512(values, Tk, hs, p, o)) return;
  std::fill(o, o + hs, 0.0f);
  for (int64_t t = 0; t < Tk; ++t) {
    const T* v = values + t * hs;
    for (int64_t d = 0; d < hs; ++d) o[d] += p[t] * load_float(v[d]);
  }
}

// Compiled for AVX-512, AVX + FMA and plain x86-64, picked at load time by CPU feature (not by
// `arch=`, which tests for one vendor's model: an AMD CPU with AVX-512 got the plain variant).
__attribute__((target_clones("avx512f", "fma", "default")))
void softmax_values(const float* __restrict values, int64_t Tk, int64_t hs, float scale, float* __restrict p,
                    float* __restrict o) {
  attend_softmax_values(values, Tk, hs, scale, p, o);
}
__attribute__((target_clones("avx512f", "fma", "default")))
void softmax_values(const uint16_t* __restrict values, int64_t Tk, int64_t hs, float scale, float* __restrict p,
                    float* __restrict o) {
  attend_softmax_values(values, Tk, hs, scale, p, o);
}

// One query head against Tk cached keys and values, each (Tk, hs), fp32 or bf16 (raw bits):
// o = softmax(q kᵀ · scale) v. Every filled slot, in slot order: the softmax and the weighted sum
// do not depend on the order. With bf16 keys, matvec_rows rounds q to bf16 as well (as autocast's
// q kᵀ); the softmax and the weighted sum are fp32 either way.
template <typename T>
void attend(const float* __restrict q, const T* __restrict keys, const T* __restrict values, int64_t Tk, int64_t hs,
            float scale, float* __restrict p, float* __restrict o) {
  matvec_rows(keys, q, 0, 1, hs, 0, Tk, p, 0, false);  // p[t] = k_t · q: four keys a pass
  softmax_values(values, Tk, hs, scale, p, o);         // p = softmax(p · scale), o = p v
}

}  // namespace

torch::Tensor decode_attention(const torch::Tensor& qkv, torch::Tensor& k_cache, torch::Tensor& v_cache, int64_t pos,
                               int64_t n_head, int64_t n_kv_head, const float* rope_cos2, const float* rope_sin2,
                               double qk_norm_eps) {
  const int64_t B = qkv.size(0), block = k_cache.size(2), hs = k_cache.size(3);
  const int64_t width = (n_head + 2 * n_kv_head) * hs;
  TORCH_CHECK(qkv.is_contiguous() && qkv.scalar_type() == torch::kFloat && qkv.size(1) == 1 && qkv.size(2) == width,
              "decode_attention: qkv must be contiguous fp32 (B, 1, (nh + 2 nkv) hs)");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && pos >= 0, "decode_attention: bad cache");
  auto y = torch::empty({B, 1, n_head * hs}, qkv.options());  // (B, 1, nh hs)
  decode_attention(qkv.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), y.data_ptr<float>(), B,
                   block, hs, pos, n_head, n_kv_head, rope_cos2, rope_sin2, qk_norm_eps);
  return y;
}

namespace {

// Shapes and places shared by the functions below.
struct Layout {
  int64_t block, hs, n_head, n_kv_head, width, group, slot, Tk;
  Layout(int64_t block_, int64_t hs_, int64_t pos, int64_t n_head_, int64_t n_kv_head_)
      : block(block_),
        hs(hs_),
        n_head(n_head_),
        n_kv_head(n_kv_head_),
        width((n_head_ + 2 * n_kv_head_) * hs_),
        group(n_head_ / n_kv_head_),
        slot(pos % block_),                   // the cache is a ring of `block` slots
        Tk(std::min(pos + 1, block_)) {}
};

// The new key (rotated) and value of sequence b, kv head j into the caches' slot for `pos`, fp32
// or rounded to bf16. kc, vc: [b][kv head][position][hs]. scratch: 2 hs floats.
template <typename T>
void write_new_kv(const Layout& L, const float* in, T* kc, T* vc, int64_t b, int64_t j, const float* cos2,
                  const float* sin2, double qk_norm_eps, float* scratch) {
  const float* k_new = in + b * L.width + (L.n_head + j) * L.hs;
  const float* v_new = in + b * L.width + (L.n_head + L.n_kv_head + j) * L.hs;
  T* k_slot = kc + ((b * L.n_kv_head + j) * L.block + L.slot) * L.hs;
  T* v_slot = vc + ((b * L.n_kv_head + j) * L.block + L.slot) * L.hs;
  float* k = scratch + L.hs;
  prepare(k_new, L.hs, qk_norm_eps, cos2, sin2, scratch, k);
  for (int64_t i = 0; i < L.hs; ++i) {
    store_float(k[i], k_slot + i);
    store_float(v_new[i], v_slot + i);
  }
}

// Query head h of sequence b against its kv head's cache -> out's (b, h) row. q, normed: hs floats;
// p: Tk floats of scratch.
template <typename T>
void attend_head(const Layout& L, const float* in, const T* kc, const T* vc, float* out, int64_t b, int64_t h,
                 const float* cos2, const float* sin2, double qk_norm_eps, float* q, float* normed, float* p) {
  const int64_t j = h / L.group;  // query head h reads kv head j
  prepare(in + b * L.width + h * L.hs, L.hs, qk_norm_eps, cos2, sin2, normed, q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.hs));
  attend(q, kc + (b * L.n_kv_head + j) * L.block * L.hs, vc + (b * L.n_kv_head + j) * L.block * L.hs, L.Tk, L.hs,
         scale, p, out + b * L.n_head * L.hs + h * L.hs);
}

}  // namespace

void decode_attention(const float* in, float* kc, float* vc, float* out, int64_t B, int64_t block, int64_t hs,
                      int64_t pos, int64_t n_head, int64_t n_kv_head, const float* rope_cos2, const float* rope_sin2,
                      double qk_norm_eps, bool parallel) {
  // Whole kv groups (a kv head's new key and value, then its query heads) per task, as the decoder's
  // threads take them.
  const Layout L(block, hs, pos, n_head, n_kv_head);
  const int64_t items = B * n_kv_head;
  const int64_t grain =  // small work stays serial
      parallel ? std::max<int64_t>(1, 32768 / std::max<int64_t>(1, L.Tk * hs * L.group)) : items;
  at::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(decode_attention_scratch(block, hs));
    decode_attention_groups(in, kc, vc, out, block, hs, pos, n_head, n_kv_head, rope_cos2, rope_sin2, qk_norm_eps, begin,
                            end, scratch.data());
  });
}

namespace {

template <typename T>
void attention_groups(const float* in, T* kc, T* vc, float* out, int64_t block, int64_t hs, int64_t pos,
                      int64_t n_head, int64_t n_kv_head, const float* rope_cos2, const float* rope_sin2,
                      double qk_norm_eps, int64_t begin, int64_t end, float* scratch) {
  const Layout L(block, hs, pos, n_head, n_kv_head);
  float *q = scratch, *normed = scratch + hs, *p = scratch + 2 * hs;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / n_kv_head, j = item % n_kv_head;
    write_new_kv(L, in, kc, vc, b, j, rope_cos2, rope_sin2, qk_norm_eps, q);  // q, normed: its scratch
    for (int64_t h = j * L.group; h < (j + 1) * L.group; ++h)
      attend_head(L, in, kc, vc, out, b, h, rope_cos2, rope_sin2, qk_norm_eps, q, normed, p);
  }
}

}  // namespace

void decode_attention_groups(const float* in, float* kc, float* vc, float* out, int64_t block, int64_t hs, int64_t pos,
                             int64_t n_head, int64_t n_kv_head, const float* rope_cos2, const float* rope_sin2,
                             double qk_norm_eps, int64_t begin, int64_t end, float* scratch) {
  attention_groups(in, kc, vc, out, block, hs, pos, n_head, n_kv_head, rope_cos2, rope_sin2, qk_norm_eps, begin, end,
                   scratch);
}

void decode_attention_groups(const float* in, uint16_t* kc, uint16_t* vc, float* out, int64_t block, int64_t hs,
                             int64_t pos, int64_t n_head, int64_t n_kv_head, const float* rope_cos2,
                             const float* rope_sin2, double qk_norm_eps, int64_t begin, int64_t end, float* scratch) {
  attention_groups(in, kc, vc, out, block, hs, pos, n_head, n_kv_head, rope_cos2, rope_sin2, qk_norm_eps, begin, end,
                   scratch);
}

}  // namespace nanogpt::model
