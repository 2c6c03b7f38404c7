// Weights quantized to 4 bits in tiles of 16 rows (dot.h's Int4Tiles, `nanogpt sample
// --quantize=int4`, for the blocks' matrices): the quantization, a bf16 step and minimum for every
// 64 columns of a row, tile by tile in parallel; the products, each row of x quantized to int8 as
// for the int8 product, the exact integer sums over a group's nibble planes (AVX512-VNNI, AVX2's
// VPMADDUBSW, or portable loops: the same bits), then the group's step and minimum applied in fp32
// fused multiply-adds; and one weight read back as the products use it (int4_weight).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "model/fast/avx2.h"
#include "model/fast/avx512.h"
#include "model/fast/dot.h"
#include "model/fast/kernel_choice.h"
#include "model/fast/products.h"
#include "model/fast/simd.h"

namespace nanogpt::model {

namespace {

constexpr int64_t kInt4Chunks = kInt4Group / 8;          // 64-byte chunks of nibbles a group of a tile
constexpr int64_t kInt4GroupBytes = kInt4Chunks * 64 + 64;  // the chunks, then 16 d's and 16 m's in bf16
int64_t int4_groups(int64_t cols) { return (cols + kInt4Group - 1) / kInt4Group; }

// Each row of x (B of them, x_stride apart) as the int4 product takes it: xq (B, groups * kInt4Group)
// int8, zeros past cols; s[b] its scale; gsum (B, groups) Σ x_q of each group, as float (exact: at
// most 127 * kInt4Group).
void quantize_rows_for_int4(const float* x, int64_t x_stride, int64_t B, int64_t cols, AlignedVector<int8_t>& xq,
                            std::vector<float>& s, std::vector<float>& gsum) {
  const int64_t groups = int4_groups(cols), padded = groups * kInt4Group;
  xq.assign(B * padded, int8_t{0});
  s.resize(B);
  gsum.resize(B * groups);
  for (int64_t b = 0; b < B; ++b) {
    int32_t total = 0;
    int8_t* q = xq.data() + b * padded;
    s[b] = quantize_row_int8(x + b * x_stride, cols, q, &total);
    for (int64_t g = 0; g < groups; ++g) {
      int32_t sum = 0;
      for (int64_t i = g * kInt4Group; i < (g + 1) * kInt4Group; ++i) sum += q[i];
      gsum[b * groups + g] = static_cast<float>(sum);
    }
  }
}

// The tile's 16 output rows from their fp32 sums, scaled by s, stored (or added) into y for the rows
// below r1.
inline void store_tile(const float (&acc)[kInt4Tile], float s, int64_t row0, int64_t r1, float* y, bool accumulate) {
  for (int64_t j = 0; j < kInt4Tile && row0 + j < r1; ++j) {
    const float v = acc[j] * s;
    y[row0 + j] = accumulate ? y[row0 + j] + v : v;
  }
}

// The portable loops: the same integer sums (exact, so in any order) and the same fp32 fused
// multiply-adds in the same order as the VNNI kernel, so the same bits.
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, matvec_rows_int4_portable, (const Int4Tiles& w, const int8_t* __restrict xq,
               const float* s, const float* gsum, int64_t B, int64_t r0, int64_t r1, float* __restrict y,
               int64_t y_stride, bool accumulate), (w, xq, s, gsum, B, r0, r1, y, y_stride, accumulate), {
  const int64_t groups = int4_groups(w.cols), padded = groups * kInt4Group;
  for (int64_t row0 = r0; row0 < r1; row0 += kInt4Tile) {
    const uint8_t* tile = w.data + row0 / kInt4Tile * groups * kInt4GroupBytes;
    for (int64_t b = 0; b < B; ++b) {
      float acc[kInt4Tile] = {};
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* p = tile + g * kInt4GroupBytes;
        const int8_t* xg = xq + b * padded + g * kInt4Group;
        int32_t sum[kInt4Tile] = {};
        for (int64_t c = 0; c < kInt4Chunks; ++c)
          for (int64_t j = 0; j < kInt4Tile; ++j)
            for (int64_t i = 0; i < 4; ++i) {
              const int32_t byte = p[c * 64 + 4 * j + i];
              sum[j] += (byte & 15) * int32_t{xg[8 * c + i]} + (byte >> 4) * int32_t{xg[8 * c + 4 + i]};
            }
        uint16_t scale[2 * kInt4Tile];
        std::memcpy(scale, p + kInt4Chunks * 64, sizeof scale);
        const float gs = gsum[b * groups + g];
        for (int64_t j = 0; j < kInt4Tile; ++j) {
          acc[j] = std::fma(static_cast<float>(sum[j]), bf16_bits_to_float(scale[j]), acc[j]);
          acc[j] = std::fma(bf16_bits_to_float(scale[kInt4Tile + j]), gs, acc[j]);
        }
      }
      store_tile(acc, s[b], row0, r1, y + b * y_stride, accumulate);
    }
  }
})

#if NANOGPT_X86_INTRINSICS
// Four bytes of x in every lane.
__attribute__((target("avx512f"), always_inline)) inline __m512i x4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// VPDPBUSD on the nibble planes: each 64-byte chunk is 16 rows x 8 columns; its low nibbles (masked)
// and its high ones (shifted down 4, masked) each multiply four broadcast bytes of x, every lane a
// row, so no lanes are summed across at the end. Two chunks at a time into four independent sums.
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void matvec_rows_int4_vnni(const Int4Tiles& w, const int8_t* __restrict xq, const float* s, const float* gsum,
                           int64_t B, int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
  static_assert(kInt4Chunks % 2 == 0, "two chunks a step");
  const int64_t groups = int4_groups(w.cols), padded = groups * kInt4Group;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t row0 = r0; row0 < r1; row0 += kInt4Tile) {
    const uint8_t* tile = w.data + row0 / kInt4Tile * groups * kInt4GroupBytes;
    for (int64_t b = 0; b < B; ++b) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* p = tile + g * kInt4GroupBytes;
        const int8_t* xg = xq + b * padded + g * kInt4Group;
        __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512(), a2 = _mm512_setzero_si512(),
                a3 = _mm512_setzero_si512();
        for (int64_t c = 0; c < kInt4Chunks; c += 2) {
          const __m512i v0 = _mm512_loadu_si512(p + c * 64), v1 = _mm512_loadu_si512(p + c * 64 + 64);
          a0 = _mm512_dpbusd_epi32(a0, _mm512_and_si512(v0, nibble), x4(xg + 8 * c));
          a1 = _mm512_dpbusd_epi32(a1, _mm512_and_si512(_mm512_srli_epi16(v0, 4), nibble), x4(xg + 8 * c + 4));
          a2 = _mm512_dpbusd_epi32(a2, _mm512_and_si512(v1, nibble), x4(xg + 8 * c + 8));
          a3 = _mm512_dpbusd_epi32(a3, _mm512_and_si512(_mm512_srli_epi16(v1, 4), nibble), x4(xg + 8 * c + 12));
        }
        const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
        const auto* dm = reinterpret_cast<const uint16_t*>(p + kInt4Chunks * 64);  // the 16 rows' d, then their m (bf16)
        acc = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, sum), load16(dm), acc);
        acc = _mm512_fmadd_ps(load16(dm + 16), _mm512_set1_ps(gsum[b * groups + g]), acc);
      }
      alignas(64) float out[kInt4Tile];
      _mm512_store_ps(out, acc);
      store_tile(out, s[b], row0, r1, y + b * y_stride, accumulate);
    }
  }
}

// Without VNNI (a laptop's AVX2): a chunk is two registers (rows 0-7, rows 8-15); VPMADDUBSW
// multiplies each plane's nibbles (unsigned, <= 15) by four broadcast bytes of x (signed) and adds
// them in pairs into int16 (|pair| <= 2 * 15 * 127: no saturation), the low and high planes' pairs
// added in int16 too (<= 7,620), and VPMADDWD by ones adds the lane's two pairs into its row's int32
// sum. Integer sums, then the same FMAs in the same order as the portable loops: the same bits.
__attribute__((target("avx2,fma"), always_inline)) inline __m256i x4_avx2(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

__attribute__((target("avx2,fma")))
void matvec_rows_int4_avx2(const Int4Tiles& w, const int8_t* __restrict xq, const float* s, const float* gsum,
                           int64_t B, int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
  const int64_t groups = int4_groups(w.cols), padded = groups * kInt4Group;
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t row0 = r0; row0 < r1; row0 += kInt4Tile) {
    const uint8_t* tile = w.data + row0 / kInt4Tile * groups * kInt4GroupBytes;
    for (int64_t b = 0; b < B; ++b) {
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // rows 0-7, 8-15
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* p = tile + g * kInt4GroupBytes;
        const int8_t* xg = xq + b * padded + g * kInt4Group;
        __m256i sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int64_t c = 0; c < kInt4Chunks; ++c) {
          const __m256i xlo = x4_avx2(xg + 8 * c), xhi = x4_avx2(xg + 8 * c + 4);
          for (int h = 0; h < 2; ++h) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + c * 64 + 32 * h));
            const __m256i pairs = _mm256_add_epi16(
                _mm256_maddubs_epi16(_mm256_and_si256(v, nibble), xlo),
                _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), nibble), xhi));
            sum[h] = _mm256_add_epi32(sum[h], _mm256_madd_epi16(pairs, ones));
          }
        }
        const auto* dm = reinterpret_cast<const uint16_t*>(p + kInt4Chunks * 64);  // the 16 rows' d, then their m (bf16)
        const __m256 gs = _mm256_set1_ps(gsum[b * groups + g]);
        for (int h = 0; h < 2; ++h) {
          acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[h]), load8(dm + 8 * h), acc[h]);
          acc[h] = _mm256_fmadd_ps(load8(dm + kInt4Tile + 8 * h), gs, acc[h]);
        }
      }
      alignas(32) float out[kInt4Tile];
      _mm256_store_ps(out, acc[0]);
      _mm256_store_ps(out + 8, acc[1]);
      store_tile(out, s[b], row0, r1, y + b * y_stride, accumulate);
    }
  }
}
#endif

}  // namespace

int64_t int4_bytes(int64_t rows, int64_t cols) {
  return (rows + kInt4Tile - 1) / kInt4Tile * int4_groups(cols) * kInt4GroupBytes;
}

namespace {

// Group p's step d = (hi - lo) / 15 and offset m = lo for row j, stored in bf16 (d NaN and m 0 when
// the group holds a NaN or an infinity); returned as stored, the values every weight rounds against.
inline std::pair<float, float> store_int4_range(uint8_t* p, int64_t j, float lo, float hi, bool nonfinite) {
  const uint16_t d_bits = float_to_bf16_bits(nonfinite ? std::numeric_limits<float>::quiet_NaN() : (hi - lo) / 15.0f);
  const uint16_t m_bits = float_to_bf16_bits(nonfinite ? 0.0f : lo);
  std::memcpy(p + kInt4Chunks * 64 + 2 * j, &d_bits, 2);
  std::memcpy(p + kInt4Chunks * 64 + 2 * (kInt4Tile + j), &m_bits, 2);
  return {bf16_bits_to_float(d_bits), bf16_bits_to_float(m_bits)};
}

// Row j's steps u (0..15, one per column of group p) into the group's chunks: chunk c's 4 bytes for
// row j hold columns 0..3 in their low nibbles and 4..7 in their high ones.
template <typename Step>
inline void pack_int4_steps(uint8_t* p, int64_t j, const Step* u) {
  for (int64_t c = 0; c < kInt4Chunks; ++c)
    for (int64_t i = 0; i < 4; ++i) p[c * 64 + 4 * j + i] = static_cast<uint8_t>(u[8 * c + i] | u[8 * c + 4 + i] << 4);
}

// The smallest of `lanes` minima and the largest of as many maxima (a register's lanes, stored).
inline std::pair<float, float> lanes_range(const float* low, const float* high, int lanes) {
  float lo = low[0], hi = high[0];
  for (int k = 1; k < lanes; ++k) {
    lo = std::min(lo, low[k]);
    hi = std::max(hi, high[k]);
  }
  return {lo, hi};
}

// Row j of a tile (its bytes zeroed, or those of a row written before) from w's `cols` weights,
// group by group: d = (max - min) / 15 and m = min in bf16 (d NaN once a weight is NaN or
// infinite), then each weight's nearest step u = (w - m) / d in 0..15 from the rounded d and m,
// as an IEEE division and round-to-nearest-even in every lane.
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, quantize_int4_row, (const float* __restrict w, int64_t cols, int64_t j,
               uint8_t* __restrict tile), (w, cols, j, tile), {
  uint8_t u[kInt4Group];
  for (int64_t g = 0, k0 = 0; k0 < cols; ++g, k0 += kInt4Group) {
    const int64_t n = std::min(kInt4Group, cols - k0);
    const float* group = w + k0;
    float lo = group[0], hi = group[0], nonfinite = 0.0f;
_Pragma("omp simd reduction(min : lo) reduction(max : hi) reduction(+ : nonfinite)")
    for (int64_t k = 0; k < n; ++k) {
      lo = std::min(lo, group[k]);
      hi = std::max(hi, group[k]);
      nonfinite += group[k] - group[k];  // NaN once any weight is NaN or inf
    }
    uint8_t* p = tile + g * kInt4GroupBytes;
    const auto [d, m] = store_int4_range(p, j, lo, hi, nonfinite != 0.0f);
_Pragma("omp simd")
    for (int64_t k = 0; k < n; ++k) {
      const float v = d > 0.0f ? std::nearbyint((group[k] - m) / d) : 0.0f;
      u[k] = static_cast<uint8_t>(v > 15.0f ? 15.0f : v > 0.0f ? v : 0.0f);  // (NaN: 0)
    }
    std::fill(u + n, u + kInt4Group, uint8_t{0});  // columns past the matrix's end
    pack_int4_steps(p, j, u);
  }
})

#if NANOGPT_X86_INTRINSICS
// The same for a row of whole groups in AVX-512 intrinsics, the same bytes (the same range, IEEE
// division, round to nearest even and clamp; each chunk's 8 steps as one 64-bit lane, its high 4
// bytes shifted onto the low 4 as the high nibbles). The vectorised loop above still spent ~5
// instructions a weight, most of them on the bytes' packing; the full-preset model's 8M block
// weights took 12 ms of the decoder's 15 ms start.
__attribute__((target("avx512f,avx512bw,avx512vl")))
void quantize_int4_row_avx512(const float* __restrict w, int64_t cols, int64_t j, uint8_t* __restrict tile) {
  constexpr __mmask16 all = 0xFFFF;  // (the masked forms: GCC 12's bug 105593)
  const __m256i chunk = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);  // byte offsets of the 8 chunks
  for (int64_t g = 0; g < cols / kInt4Group; ++g) {
    const float* group = w + g * kInt4Group;
    __m512 v[4];
    __mmask16 bad = 0;
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm512_loadu_ps(group + 16 * k);
      bad |= _mm512_cmp_ps_mask(_mm512_maskz_sub_ps(all, v[k], v[k]), _mm512_setzero_ps(), _CMP_NEQ_UQ);  // NaN or inf
    }
    alignas(64) float low[16], high[16];  // (the lanes reduced through memory: the same bug)
    _mm512_store_ps(low, _mm512_maskz_min_ps(all, _mm512_maskz_min_ps(all, v[0], v[1]),
                                             _mm512_maskz_min_ps(all, v[2], v[3])));
    _mm512_store_ps(high, _mm512_maskz_max_ps(all, _mm512_maskz_max_ps(all, v[0], v[1]),
                                              _mm512_maskz_max_ps(all, v[2], v[3])));
    const auto [lo, hi] = lanes_range(low, high, 16);
    uint8_t* p = tile + g * kInt4GroupBytes;
    const auto [d, m] = store_int4_range(p, j, lo, hi, bad != 0);
    __m512i bytes = _mm512_setzero_si512();  // the 64 steps, in column order
    if (d > 0.0f) {
      const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m), top = _mm512_set1_ps(15.0f);
      for (int k = 0; k < 4; ++k) {
        const __m512 ratio = _mm512_maskz_div_ps(all, _mm512_maskz_sub_ps(all, v[k], mv), dv);
        const __m512 q = _mm512_maskz_roundscale_ps(all, ratio, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i u = _mm512_maskz_cvttps_epi32(
            all, _mm512_maskz_max_ps(all, _mm512_maskz_min_ps(all, q, top), _mm512_setzero_ps()));
        bytes = _mm512_maskz_inserti32x4(all, bytes, _mm512_maskz_cvtepi32_epi8(all, u), k);
      }
    }
    // Each 64-bit lane holds a chunk's 8 steps; the low 32 bits of x | x >> 28 are its 4 bytes.
    const __m512i packed = _mm512_or_si512(bytes, _mm512_maskz_srli_epi64(0xFF, bytes, 28));
    _mm256_i32scatter_epi32(p + 4 * j, chunk, _mm512_maskz_cvtepi64_epi32(0xFF, packed), 1);
  }
}

// The same with AVX2 (no AVX-512), the same rule: the group's range from 8 registers, each step by
// an IEEE division and round to nearest even, clamped to 0..15; the nibbles packed as the loop above.
__attribute__((target("avx2,fma")))
void quantize_int4_row_avx2_fma(const float* __restrict w, int64_t cols, int64_t j, uint8_t* __restrict tile) {
  for (int64_t g = 0; g < cols / kInt4Group; ++g) {
    const float* group = w + g * kInt4Group;
    __m256 v[8], lo8 = _mm256_loadu_ps(group), hi8 = lo8;
    int bad = 0;
    for (int k = 0; k < 8; ++k) {
      v[k] = _mm256_loadu_ps(group + 8 * k);
      lo8 = _mm256_min_ps(lo8, v[k]);
      hi8 = _mm256_max_ps(hi8, v[k]);
      bad |= _mm256_movemask_ps(_mm256_cmp_ps(_mm256_sub_ps(v[k], v[k]), _mm256_setzero_ps(), _CMP_NEQ_UQ));
    }
    alignas(32) float low[8], high[8];
    _mm256_store_ps(low, lo8);
    _mm256_store_ps(high, hi8);
    const auto [lo, hi] = lanes_range(low, high, 8);
    uint8_t* p = tile + g * kInt4GroupBytes;
    const auto [d, m] = store_int4_range(p, j, lo, hi, bad != 0);
    alignas(32) int32_t u[kInt4Group] = {};
    if (d > 0.0f) {
      const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m), top = _mm256_set1_ps(15.0f);
      for (int k = 0; k < 8; ++k) {
        const __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(v[k], mv), dv),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_store_si256(reinterpret_cast<__m256i*>(u + 8 * k),
                           _mm256_cvttps_epi32(_mm256_max_ps(_mm256_min_ps(q, top), _mm256_setzero_ps())));
      }
    }
    pack_int4_steps(p, j, u);
  }
}
#endif

}  // namespace

// Tile by tile in parallel (a tile's bytes are its own): a full-preset model's 8M block weights
// took ~28 ms as one scalar loop, ~6% of a 2,000-token sample.
void quantize_int4(const float* w, int64_t rows, int64_t cols, uint8_t* out) {
  const int64_t groups = int4_groups(cols), tiles = (rows + kInt4Tile - 1) / kInt4Tile;
  at::parallel_for(0, tiles, std::max<int64_t>(1, 65536 / (kInt4Tile * std::max<int64_t>(cols, 1))),
                   [&](int64_t t0, int64_t t1) {
                     std::memset(out + t0 * groups * kInt4GroupBytes, 0,  // the padding rows: u = 0, d = m = 0
                                 static_cast<size_t>((t1 - t0) * groups * kInt4GroupBytes));
                     for (int64_t r = t0 * kInt4Tile; r < std::min(rows, t1 * kInt4Tile); ++r) {
                       uint8_t* tile = out + r / kInt4Tile * groups * kInt4GroupBytes;
#if NANOGPT_X86_INTRINSICS
                       if (avx512_kernels() && cols % kInt4Group == 0) {
                         quantize_int4_row_avx512(w + r * cols, cols, r % kInt4Tile, tile);
                         continue;
                       }
                       if (avx2_kernels() && cols % kInt4Group == 0) {
                         quantize_int4_row_avx2_fma(w + r * cols, cols, r % kInt4Tile, tile);
                         continue;
                       }
#endif
                       quantize_int4_row(w + r * cols, cols, r % kInt4Tile, tile);
                     }
                   });
}

float int4_weight(const Int4Tiles& w, int64_t r, int64_t c) {
  const int64_t groups = int4_groups(w.cols), g = c / kInt4Group, j = r % kInt4Tile, i = c % kInt4Group % 8;
  const uint8_t* p = w.data + (r / kInt4Tile * groups + g) * kInt4GroupBytes;
  const uint8_t byte = p[c % kInt4Group / 8 * 64 + 4 * j + i % 4];
  uint16_t d, m;
  std::memcpy(&d, p + kInt4Chunks * 64 + 2 * j, 2);
  std::memcpy(&m, p + kInt4Chunks * 64 + 2 * (kInt4Tile + j), 2);
  const int u = i < 4 ? byte & 15 : byte >> 4;
  return std::fma(bf16_bits_to_float(d), static_cast<float>(u), bf16_bits_to_float(m));
}

void matvec_rows(const Int4Tiles& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
                 float* __restrict y, int64_t y_stride, bool accumulate) {
  thread_local AlignedVector<int8_t> xq;  // each thread quantizes x itself: no barrier for it
  thread_local std::vector<float> s, gsum;
  quantize_rows_for_int4(x, x_stride, B, w.cols, xq, s, gsum);
#if NANOGPT_X86_INTRINSICS
  if (vnni_kernels())
    return matvec_rows_int4_vnni(w, xq.data(), s.data(), gsum.data(), B, r0, r1, y, y_stride, accumulate);
  if (avx2_kernels())
    return matvec_rows_int4_avx2(w, xq.data(), s.data(), gsum.data(), B, r0, r1, y, y_stride, accumulate);
#endif
  matvec_rows_int4_portable(w, xq.data(), s.data(), gsum.data(), B, r0, r1, y, y_stride, accumulate);
}

}  // namespace nanogpt::model
