// One-token attention as plain loops (see decode_attention.h).
#include "model/fast/decode_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "model/fast/avx2.h"
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

// The same with AVX2 + FMA (8 lanes a register: hs = 8 NV), for CPUs without AVX-512. Head size
// 128 (NV = 16) has one set of sums: two would take all 16 registers and more.
template <int NV, typename T>
__attribute__((target("avx2,fma"))) void weighted_values_avx2(const T* __restrict values, int64_t Tk, const float* w,
                                                              float* __restrict o) {
  constexpr int64_t hs = 8 * NV;
  constexpr bool two = NV <= 8;
  __m256 even[NV], odd[NV];
  for (int k = 0; k < NV; ++k) even[k] = odd[k] = _mm256_setzero_ps();
  int64_t t = 0;
  if constexpr (two) {
    for (; t + 2 <= Tk; t += 2) {
      const T* v = values + t * hs;
      const __m256 w0 = _mm256_set1_ps(w[t]), w1 = _mm256_set1_ps(w[t + 1]);
      for (int k = 0; k < NV; ++k) {
        even[k] = _mm256_fmadd_ps(w0, load8(v + 8 * k), even[k]);
        odd[k] = _mm256_fmadd_ps(w1, load8(v + hs + 8 * k), odd[k]);
      }
    }
  }
  for (; t < Tk; ++t) {
    const __m256 w0 = _mm256_set1_ps(w[t]);
    for (int k = 0; k < NV; ++k) even[k] = _mm256_fmadd_ps(w0, load8(values + t * hs + 8 * k), even[k]);
  }
  for (int k = 0; k < NV; ++k) _mm256_storeu_ps(o + 8 * k, _mm256_add_ps(even[k], odd[k]));
}

// Whether o = Σ_t w[t] v_t was computed here: AVX-512 or AVX2 kernels (kernel_choice.h) and a head
// size of 16, 32, 64 or 128.
template <typename T>
bool weighted_values_intrinsics(const T* values, int64_t Tk, int64_t hs, const float* w, float* o) {
  if (avx512_kernels()) {
    switch (hs) {
      case 16: weighted_values<1>(values, Tk, w, o); return true;
      case 32: weighted_values<2>(values, Tk, w, o); return true;
      case 64: weighted_values<4>(values, Tk, w, o); return true;
      case 128: weighted_values<8>(values, Tk, w, o); return true;
      default: return false;
    }
  }
  if (avx2_kernels()) {
    switch (hs) {
      case 16: weighted_values_avx2<2>(values, Tk, w, o); return true;
      case 32: weighted_values_avx2<4>(values, Tk, w, o); return true;
      case 64: weighted_values_avx2<8>(values, Tk, w, o); return true;
      case 128: weighted_values_avx2<16>(values, Tk, w, o); return true;
      default: return false;
    }
  }
  return false;
}
#else
template <typename T>
bool weighted_values_intrinsics(const T*, int64_t, int64_t, const float*, float*) { return false; }
#endif

// p = softmax(p · scale) over Tk scores, in place.
NANOGPT_INLINE void softmax_in_place(float* __restrict p, int64_t Tk, float scale) {
#pragma omp simd
  for (int64_t t = 0; t < Tk; ++t) p[t] *= scale;
  const float inv_total = 1.0f / exp_shifted_sum(p, max_of(p, Tk), p, Tk);  // p = exp(p - max)
#pragma omp simd
  for (int64_t t = 0; t < Tk; ++t) p[t] *= inv_total;  // the weights
}

// p[t] = softmax(p · scale)[t] and o = Σ_t p[t] v_t over Tk values (Tk, hs), fp32 or bf16 (raw
// bits), in fp32.
template <typename T>
NANOGPT_INLINE void attend_softmax_values(const T* __restrict values, int64_t Tk, int64_t hs,
                                                                 float scale, float* __restrict p,
                                                                 float* __restrict o) {
  softmax_in_place(p, Tk, scale);
  if (weighted_values_intrinsics(values, Tk, hs, p, o)) return;
  std::fill(o, o + hs, 0.0f);
  for (int64_t t = 0; t < Tk; ++t) {
    const T* v = values + t * hs;
    for (int64_t d = 0; d < hs; ++d) o[d] += p[t] * load_float(v[d]);
  }
}

// Compiled for AVX-512, AVX + FMA and plain x86-64, picked at load time by CPU feature (not by
// `arch=`, which tests for one vendor's model: an AMD CPU with AVX-512 got the plain variant).
NANOGPT_KERNEL(NANOGPT_FMA_CLONES, void, softmax_values, (const float* __restrict values, int64_t Tk, int64_t hs,
               float scale, float* __restrict p, float* __restrict o), (values, Tk, hs, scale, p, o), {
  attend_softmax_values(values, Tk, hs, scale, p, o);
})
NANOGPT_KERNEL(NANOGPT_FMA_CLONES, void, softmax_values, (const uint16_t* __restrict values, int64_t Tk, int64_t hs,
               float scale, float* __restrict p, float* __restrict o), (values, Tk, hs, scale, p, o), {
  attend_softmax_values(values, Tk, hs, scale, p, o);
})

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

// ---- The int8 cache ----

namespace {

constexpr int64_t kKeyTile = 16;  // keys a tile: one AVX-512 register of int32 scores

int64_t key_tiles(int64_t block) { return (block + kKeyTile - 1) / kKeyTile; }
int64_t whole_lines(int64_t bytes) { return (bytes + 63) / 64 * 64; }  // each kv head's bytes start on a line
// The scales after the tiles (a multiple of 64 bytes) and after the rows (hs a multiple of 4).
float* key_scales(uint8_t* keys, int64_t block, int64_t hs) {
  return reinterpret_cast<float*>(keys + key_tiles(block) * kKeyTile * hs);
}
const float* key_scales(const uint8_t* keys, int64_t block, int64_t hs) {
  return reinterpret_cast<const float*>(keys + key_tiles(block) * kKeyTile * hs);
}
float* value_scales(uint8_t* values, int64_t block, int64_t hs) {
  return reinterpret_cast<float*>(values + block * hs);
}
const float* value_scales(const uint8_t* values, int64_t block, int64_t hs) {
  return reinterpret_cast<const float*>(values + block * hs);
}

// The integer part of the scores: p[t] = Σ_d (k8_td + 128) q8_d for the tiles covering t < Tk
// (p has room for whole tiles), exact in int32, as floats. Portable loops and the VNNI kernel give
// the same numbers.
void int8_dots_portable(const uint8_t* keys, int64_t hs, int64_t Tk, const int8_t* q8, float* p) {
  for (int64_t tile = 0; tile * kKeyTile < Tk; ++tile) {
    const uint8_t* k = keys + tile * kKeyTile * hs;
    int32_t sum[kKeyTile] = {};
    for (int64_t c = 0; c < hs / 4; ++c)
      for (int64_t j = 0; j < kKeyTile; ++j)
        for (int64_t i = 0; i < 4; ++i) sum[j] += int32_t{k[c * 64 + 4 * j + i]} * int32_t{q8[4 * c + i]};
    for (int64_t j = 0; j < kKeyTile; ++j) p[tile * kKeyTile + j] = static_cast<float>(sum[j]);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// VPDPBUSD: a 64-byte chunk is 4 dims of 16 keys, against 4 bytes of the query in every lane; each
// lane a key, so a tile's 16 scores come out in one register with no sums across lanes. Four sums
// in turn (the instruction's latency).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void int8_dots_vnni(const uint8_t* keys, int64_t hs, int64_t Tk,
                                                                             const int8_t* q8, float* p) {
  const int64_t chunks = hs / 4;
  for (int64_t tile = 0; tile * kKeyTile < Tk; ++tile) {
    const uint8_t* k = keys + tile * kKeyTile * hs;
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    int64_t c = 0;
    for (; c + 4 <= chunks; c += 4)
      for (int s = 0; s < 4; ++s) {
        int32_t q4;
        std::memcpy(&q4, q8 + 4 * (c + s), 4);
        a[s] = _mm512_dpbusd_epi32(a[s], _mm512_loadu_si512(k + (c + s) * 64), _mm512_set1_epi32(q4));
      }
    for (; c < chunks; ++c) {
      int32_t q4;
      std::memcpy(&q4, q8 + 4 * c, 4);
      a[0] = _mm512_dpbusd_epi32(a[0], _mm512_loadu_si512(k + c * 64), _mm512_set1_epi32(q4));
    }
    const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
    _mm512_storeu_ps(p + tile * kKeyTile, _mm512_maskz_cvtepi32_ps(0xFFFF, sum));  // (masked: GCC 12 bug 105593)
  }
}

// The same with AVX2 (no VNNI): each 32-byte half of a chunk is 4 dims of 8 keys. VPMADDUBSW takes
// an unsigned and a signed operand and saturates pairs in int16, which the stored k8 + 128 (up to
// 255) times q8 would overflow; so the keys go back to k8 (XOR 0x80: |k8| <= 127), |k8| multiplies
// q8 with k8's sign (VPSIGNB), pairs <= 2 * 127 * 127 fit, and VPMADDWD by ones adds each key's two
// pairs into int32. Then 128 Σ q8 added back: the same integers as the other kernels.
__attribute__((target("avx2,fma"))) void int8_dots_avx2(const uint8_t* keys, int64_t hs, int64_t Tk, const int8_t* q8,
                                                        float* p) {
  const int64_t chunks = hs / 4;
  int32_t qsum = 0;
  for (int64_t d = 0; d < hs; ++d) qsum += q8[d];
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1),
                offset = _mm256_set1_epi32(128 * qsum);
  for (int64_t tile = 0; tile * kKeyTile < Tk; ++tile) {
    const uint8_t* k = keys + tile * kKeyTile * hs;
    __m256i a[2] = {offset, offset};  // keys 0-7, 8-15
    for (int64_t c = 0; c < chunks; ++c) {
      int32_t q4;
      std::memcpy(&q4, q8 + 4 * c, 4);
      const __m256i qv = _mm256_set1_epi32(q4);
      for (int h = 0; h < 2; ++h) {
        const __m256i k8 =
            _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + c * 64 + 32 * h)), flip);
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(k8), _mm256_sign_epi8(qv, k8));
        a[h] = _mm256_add_epi32(a[h], _mm256_madd_epi16(pairs, ones));
      }
    }
    _mm256_storeu_ps(p + tile * kKeyTile, _mm256_cvtepi32_ps(a[0]));
    _mm256_storeu_ps(p + tile * kKeyTile + 8, _mm256_cvtepi32_ps(a[1]));
  }
}
#endif

// p[t] = k_t · q over the filled slots, from the int8 keys: sk_t sq (Σ_d (k8_td + 128) q8_d − 128 Σ_d q8_d).
void int8_scores(const uint8_t* keys, int64_t block, int64_t hs, int64_t Tk, const float* q, int8_t* q8, float* p) {
  int32_t qsum = 0;
  const float sq = quantize_row_int8(q, hs, q8, &qsum);
#if defined(__x86_64__) && defined(__GNUC__)
  if (vnni_kernels()) int8_dots_vnni(keys, hs, Tk, q8, p);
  else if (avx2_kernels()) int8_dots_avx2(keys, hs, Tk, q8, p);
  else int8_dots_portable(keys, hs, Tk, q8, p);
#else
  int8_dots_portable(keys, hs, Tk, q8, p);
#endif
  const float* sk = key_scales(keys, block, hs);
  const float offset = 128.0f * static_cast<float>(qsum);  // exact, as the sums are, for hs <= 512
  for (int64_t t = 0; t < Tk; ++t) p[t] = (p[t] - offset) * (sk[t] * sq);
}

// p = softmax(p · scale); then the weights times each value's scale, and o = Σ_t w_t v8_t in fp32.
NANOGPT_KERNEL(NANOGPT_FMA_CLONES, void, softmax_int8_values, (const int8_t* __restrict values,
               const float* __restrict sv, int64_t Tk, int64_t hs, float scale, float* __restrict p,
               float* __restrict o), (values, sv, Tk, hs, scale, p, o), {
  softmax_in_place(p, Tk, scale);
_Pragma("omp simd")
  for (int64_t t = 0; t < Tk; ++t) p[t] *= sv[t];
  if (weighted_values_intrinsics(values, Tk, hs, p, o)) return;
  std::fill(o, o + hs, 0.0f);
  for (int64_t t = 0; t < Tk; ++t) {
    const int8_t* v = values + t * hs;
    for (int64_t d = 0; d < hs; ++d) o[d] += p[t] * load_float(v[d]);
  }
})

}  // namespace

int64_t int8_keys_bytes(int64_t block, int64_t hs) { return whole_lines(key_tiles(block) * kKeyTile * (hs + 4)); }
int64_t int8_values_bytes(int64_t block, int64_t hs) { return whole_lines(block * (hs + 4)); }

void int8_kv_write(uint8_t* keys, uint8_t* values, int64_t block, int64_t hs, int64_t slot, const float* k,
                   const float* v, int8_t* row) {
  int32_t sum = 0;
  key_scales(keys, block, hs)[slot] = quantize_row_int8(k, hs, row, &sum);
  uint8_t* tile = keys + slot / kKeyTile * kKeyTile * hs;
  const int64_t j = slot % kKeyTile;
  for (int64_t c = 0; c < hs / 4; ++c)
    for (int64_t i = 0; i < 4; ++i) tile[c * 64 + 4 * j + i] = static_cast<uint8_t>(row[4 * c + i] + 128);
  value_scales(values, block, hs)[slot] = quantize_row_int8(v, hs, row, &sum);
  std::memcpy(values + slot * hs, row, static_cast<size_t>(hs));
}

void int8_kv_read(const uint8_t* keys, const uint8_t* values, int64_t block, int64_t hs, int64_t slot, float* k,
                  float* v) {
  const uint8_t* tile = keys + slot / kKeyTile * kKeyTile * hs;
  const int64_t j = slot % kKeyTile;
  const float sk = key_scales(keys, block, hs)[slot], sv = value_scales(values, block, hs)[slot];
  for (int64_t d = 0; d < hs; ++d) {
    k[d] = sk * static_cast<float>(int32_t{tile[d / 4 * 64 + 4 * j + d % 4]} - 128);
    v[d] = sv * static_cast<float>(static_cast<int8_t>(values[slot * hs + d]));
  }
}

void decode_attention_groups_int8(const float* in, uint8_t* kc, uint8_t* vc, float* out, int64_t block, int64_t hs,
                                  int64_t pos, int64_t n_head, int64_t n_kv_head, const float* rope_cos2,
                                  const float* rope_sin2, double qk_norm_eps, int64_t begin, int64_t end,
                                  float* scratch) {
  const Layout L(block, hs, pos, n_head, n_kv_head);
  const int64_t key_bytes = int8_keys_bytes(block, hs), value_bytes = int8_values_bytes(block, hs);
  float *q = scratch, *normed = scratch + hs, *p = scratch + 3 * hs;
  auto* row = reinterpret_cast<int8_t*>(scratch + 2 * hs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / n_kv_head, j = item % n_kv_head;
    uint8_t* keys = kc + item * key_bytes;  // item = b * n_kv_head + j
    uint8_t* values = vc + item * value_bytes;
    prepare(in + b * L.width + (n_head + j) * hs, hs, qk_norm_eps, rope_cos2, rope_sin2, normed, q);  // the new key
    int8_kv_write(keys, values, block, hs, L.slot, q, in + b * L.width + (n_head + n_kv_head + j) * hs, row);
    for (int64_t h = j * L.group; h < (j + 1) * L.group; ++h) {
      prepare(in + b * L.width + h * hs, hs, qk_norm_eps, rope_cos2, rope_sin2, normed, q);
      int8_scores(keys, block, hs, L.Tk, q, row, p);
      softmax_int8_values(reinterpret_cast<const int8_t*>(values), value_scales(values, block, hs), L.Tk, hs, scale, p,
                          out + b * n_head * hs + h * hs);
    }
  }
}

}  // namespace nanogpt::model
