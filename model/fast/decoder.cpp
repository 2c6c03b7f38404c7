// One-token whole-model decoding on the CPU (see decoder.h).
#include "model/fast/decoder.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define NANOGPT_X86_INTRINSICS 1
#include <immintrin.h>
#else
#define NANOGPT_X86_INTRINSICS 0
#endif

#include "model/attention.h"
#include "model/fast/avx512.h"
#include "model/fast/decode_attention.h"
#include "model/fast/dot.h"
#include "model/fast/simd.h"
#include "model/norm.h"

namespace nanogpt::model {

namespace {

// Four rows' dot products with x finished: the columns past the last whole step of the lane sums
// added to the rows' sums s, then stored into y (or added to it).
template <typename W, typename X>
inline __attribute__((always_inline)) void finish_rows(const W* const (&w)[kRowBlock], const X* xb, int64_t full,
                                                       int64_t cols, float (&s)[kRowBlock], float* yb, bool accumulate) {
  for (int64_t k = 0; k < kRowBlock; ++k) {
    for (int64_t i = full; i < cols; ++i) s[k] += load_float(w[k][i]) * load_float(xb[i]);
    yb[k] = accumulate ? yb[k] + s[k] : s[k];
  }
}

// Large shares of a product (256 KB and up: the full preset's every fp32 product, none of the CPU
// preset's) are streamed from L3 or memory: the block two ahead is prefetched, a cache line at a
// time, while this one computes. Full-preset model (42.6 MB of fp32 weights, past the 32 MB L3),
// 1,000 tokens on a host whose other tenants came and went: median 0.97 s against 1.30 s over 10
// alternating runs, 1.61 s against 1.83 s over 8 more. The CPU preset's weights (3.2 MB) stay in
// cache, where the prefetches only cost (~3%). On an Intel Xeon (family 6 model 207, AVX512-BF16,
// 2 MB L2 a core) the same prefetches made the full-preset model 2-9x slower: 409-528 against
// 860-1,377 tok/s in bf16, 85-173 against 767-836 in fp32, and a microbenchmark of the bf16 kernel
// lost half its rate at every size from 1 to 256 MB (16 MB: 8.8 against 19.5 GB/s). They are issued
// on AMD CPUs only.
bool prefetch_pays() {
#if NANOGPT_X86_INTRINSICS
  static const bool amd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") != 0;
  }();
  return amd;
#else
  return false;
#endif
}
template <typename W>
bool prefetched(int64_t r0, int64_t r1, int64_t cols) {
  return prefetch_pays() && (r1 - r0) * cols * static_cast<int64_t>(sizeof(W)) >= (int64_t{1} << 18);
}
template <typename W>
inline __attribute__((always_inline)) void prefetch_two_ahead(const W* w, int64_t r, int64_t r1, int64_t cols) {
  if (r + 3 * kRowBlock > r1) return;
  for (const W* p = w + (r + 2 * kRowBlock) * cols; p < w + (r + 3 * kRowBlock) * cols; p += 64 / sizeof(W))
    __builtin_prefetch(p, 0, 0);  // for reading, no temporal locality: streamed once a token
}

// Rows r0 <= r < r1 of w @ x for each of B rows of x, four rows at a time (so each load of x feeds
// four rows) and the last rows through dot(). sums(w4, xb, full, s) sets s[k] = w4[k] · xb over the
// first `full` columns (whole steps of Sums::kStep columns); finish_rows adds the rest. W and X are
// float, or uint16_t for bf16 (load_float widens it exactly). With Sums::kTiles, sums.tile<N>(w4,
// xn, full, s) does the same for N rows of x at once, s[j][k] = w4[k] · xn[j], each sum in the same
// operations and order whatever N: a row of x gets the same bits in a batch of any size (serve's
// requests alone or side by side), while a batch loads each weight once for four of its rows.
template <typename W, typename X, typename Sums>
inline __attribute__((always_inline)) void matvec_rows_blocks(const W* __restrict w, const X* __restrict x,
                                                               int64_t x_stride, int64_t B, int64_t cols, int64_t r0,
                                                               int64_t r1, float* __restrict y, int64_t y_stride,
                                                               bool accumulate, Sums sums) {
  const int64_t full = cols - cols % Sums::kStep;
  const bool prefetch = prefetched<W>(r0, r1, cols);
  int64_t r = r0;
  for (; r + kRowBlock <= r1; r += kRowBlock) {
    const W* w0 = w + r * cols;
    const W* const rows[kRowBlock] = {w0, w0 + cols, w0 + 2 * cols, w0 + 3 * cols};
    if (prefetch) prefetch_two_ahead(w, r, r1, cols);
    int64_t b = 0;
    if constexpr (Sums::kTiles) {  // four rows of x at a time: each load of w feeds four of them
      for (; b + kRowBlock <= B; b += kRowBlock) {
        const X* const xs[kRowBlock] = {x + b * x_stride, x + (b + 1) * x_stride, x + (b + 2) * x_stride,
                                        x + (b + 3) * x_stride};
        float s[kRowBlock][kRowBlock];
        sums.template tile<kRowBlock>(rows, xs, full, s);
        for (int64_t j = 0; j < kRowBlock; ++j)
          finish_rows(rows, xs[j], full, cols, s[j], y + (b + j) * y_stride + r, accumulate);
      }
    }
    for (; b < B; ++b) {
      const X* const xs[1] = {x + b * x_stride};
      float s[1][kRowBlock];
      if constexpr (Sums::kTiles) sums.template tile<1>(rows, xs, full, s);
      else sums(rows, xs[0], full, s[0]);
      finish_rows(rows, xs[0], full, cols, s[0], y + b * y_stride + r, accumulate);
    }
  }
  for (; r < r1; ++r) {  // the last rows, fewer than a block
    const W* wr = w + r * cols;
    for (int64_t b = 0; b < B; ++b) {
      const float s = dot(wr, x + b * x_stride, cols);
      y[b * y_stride + r] = accumulate ? y[b * y_stride + r] + s : s;
    }
  }
}

// One element as the lane sums' type: fp32 (bf16 widened exactly by load_float) or int32 (a byte
// of the int8 products).
template <typename Acc, typename T>
inline __attribute__((always_inline)) Acc widen(T v) {
  if constexpr (std::is_same_v<Acc, float>) return load_float(v);
  else return static_cast<Acc>(v);
}

// The lane sums in plain C++: independent lanes (as dot()) that GCC vectorises at whatever width
// the target_clones variant has; in fp32, or in int32 for the int8 products (exact).
struct LaneSums {
  static constexpr int64_t kStep = kLanes;
  static constexpr bool kTiles = false;
  template <typename W, typename X, typename Acc>
  inline __attribute__((always_inline)) void operator()(const W* const (&w)[kRowBlock], const X* __restrict xb,
                                                        int64_t full, Acc (&s)[kRowBlock]) const {
    Acc a0[kLanes] = {}, a1[kLanes] = {}, a2[kLanes] = {}, a3[kLanes] = {};
    const W *__restrict w0 = w[0], *__restrict w1 = w[1], *__restrict w2 = w[2], *__restrict w3 = w[3];
    for (int64_t i = 0; i < full; i += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) {
        const Acc xv = widen<Acc>(xb[i + j]);
        a0[j] += widen<Acc>(w0[i + j]) * xv;
        a1[j] += widen<Acc>(w1[i + j]) * xv;
        a2[j] += widen<Acc>(w2[i + j]) * xv;
        a3[j] += widen<Acc>(w3[i + j]) * xv;
      }
    for (int64_t k = 0; k < kRowBlock; ++k) s[k] = Acc{0};
    for (int64_t j = 0; j < kLanes; ++j) {
      s[0] += a0[j];
      s[1] += a1[j];
      s[2] += a2[j];
      s[3] += a3[j];
    }
  }
};

// Without AVX-512 (fp32, or bf16 weights and x): compiled for AVX + FMA and plain x86-64, picked at
// load time by CPU feature (as decode_attention.cpp).
NANOGPT_KERNEL(NANOGPT_FMA_ONLY_CLONES, void, matvec_rows_portable, (const float* __restrict w,
               const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols, int64_t r0, int64_t r1,
               float* __restrict y, int64_t y_stride, bool accumulate), (w, x, x_stride, B, cols, r0, r1, y, y_stride,
               accumulate), {
  matvec_rows_blocks(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate, LaneSums{});
})

NANOGPT_KERNEL(NANOGPT_FMA_ONLY_CLONES, void, matvec_rows_portable, (const uint16_t* __restrict w,
               const uint16_t* __restrict x, int64_t x_stride, int64_t B, int64_t cols, int64_t r0, int64_t r1,
               float* __restrict y, int64_t y_stride, bool accumulate), (w, x, x_stride, B, cols, r0, r1, y, y_stride,
               accumulate), {
  matvec_rows_blocks(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate, LaneSums{});
})

#if NANOGPT_X86_INTRINSICS
// The lanes' adds of sum_lanes: fp32, or int32 on the same 512 bits (the int8 products' sums).
struct AddFp32 {
  __attribute__((target("avx512f"), always_inline)) __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_add_ps(a, b);
  }
};
struct AddInt32 {
  __attribute__((target("avx512f"), always_inline)) __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
};

// The four rows' lane sums a0..a3 (16 lanes each) -> s[0..3]: a transpose-and-add tree, 9 shuffles
// and 6 adds for all four. (Lane by lane in scalar code, as LaneSums, was 64 dependent adds: about
// as many instructions as the FMAs of a 384-wide row, and most of those of a 64-wide key's score.)
// T and Add: fp32 lanes, or int32 lanes carried in the same registers (the shuffles only move bits).
template <typename T, typename Add = AddFp32>
__attribute__((target("avx512f"), always_inline)) inline void sum_lanes(__m512 a0, __m512 a1, __m512 a2, __m512 a3,
                                                                       T (&s)[kRowBlock], Add add = {}) {
  // (The all-ones masked forms, as load16() (avx512.h): GCC 12's bug 105593.)
  constexpr __mmask16 all = 0xFFFF;
  // 256-bit halves: u01 = [a0 lo + a0 hi | a1 lo + a1 hi], 8 partial sums of each row
  const __m512 u01 = add(_mm512_maskz_shuffle_f32x4(all, a0, a1, 0x44), _mm512_maskz_shuffle_f32x4(all, a0, a1, 0xEE));
  const __m512 u23 = add(_mm512_maskz_shuffle_f32x4(all, a2, a3, 0x44), _mm512_maskz_shuffle_f32x4(all, a2, a3, 0xEE));
  // 128-bit quarters: v = [row 0 | row 1 | row 2 | row 3], 4 partial sums each
  const __m512 v =
      add(_mm512_maskz_shuffle_f32x4(all, u01, u23, 0x88), _mm512_maskz_shuffle_f32x4(all, u01, u23, 0xDD));
  // within each quarter: 4 -> 2 -> 1
  const __m512 w = add(v, _mm512_maskz_permute_ps(all, v, 0x4E));
  const __m512 x = add(w, _mm512_maskz_permute_ps(all, w, 0xB1));
  alignas(64) T lanes[kLanes];
  _mm512_store_si512(lanes, _mm512_castps_si512(x));
  for (int64_t k = 0; k < kRowBlock; ++k) s[k] = lanes[4 * k];
}

// Weights are loaded 16 at a time as fp32 by load16() (avx512.h): bf16 widened exactly. GCC
// vectorises LaneSums' bf16 widening over 8 lanes with separate multiplies and adds (full-preset
// model: 666-704 tok/s against 416-587 in fp32, where the fp32 loop runs 16-lane FMAs); load16 feeds
// 16-lane FMAs either way.

// The lane sums in AVX-512 intrinsics: 16 weights of each of four rows into four FMAs per load of
// x, then sum_lanes' tree (GCC keeps LaneSums' lane-by-lane order: it may not reassociate).
struct Avx512Sums {
  static constexpr int64_t kStep = kLanes;
  static constexpr bool kTiles = true;
  // N rows of x: 4N accumulators, each row's four as for N = 1.
  template <int64_t N, typename W, typename X>
  __attribute__((target("avx512f"))) void tile(const W* const (&w)[kRowBlock], const X* const (&x)[N],
                                                int64_t full, float (&s)[N][kRowBlock]) const {
    __m512 a[N][kRowBlock];
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < kRowBlock; ++k) a[j][k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += kLanes) {
      const __m512 w0 = load16(w[0] + i), w1 = load16(w[1] + i), w2 = load16(w[2] + i), w3 = load16(w[3] + i);
      for (int64_t j = 0; j < N; ++j) {
        const __m512 xv = load16(x[j] + i);
        a[j][0] = _mm512_fmadd_ps(w0, xv, a[j][0]);
        a[j][1] = _mm512_fmadd_ps(w1, xv, a[j][1]);
        a[j][2] = _mm512_fmadd_ps(w2, xv, a[j][2]);
        a[j][3] = _mm512_fmadd_ps(w3, xv, a[j][3]);
      }
    }
    for (int64_t j = 0; j < N; ++j) sum_lanes(a[j][0], a[j][1], a[j][2], a[j][3], s[j]);
  }
};

// bf16 weights and x with AVX512-BF16's dot product (VDPBF16PS): 32 columns of a row a step, each
// lane adding two exact products in fp32, where Avx512Sums widens 16 weights into one FMA. Full-preset
// model, 1,000 tokens, alternating with Avx512Sums on the same rounded x: a first version, median
// 3,100 against 2,063 tok/s over 10 runs, each faster; this one on a slower hour, 1,605 against
// 1,377 over 8 (7 faster).
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline __m512bh pairs(const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));  // 32 bf16: 16 lanes of two
}

struct Avx512Bf16DotSums {
  static constexpr int64_t kStep = 2 * kLanes;
  static constexpr bool kTiles = true;
  // N rows of x, as Avx512Sums::tile.
  template <int64_t N>
  __attribute__((target("avx512f,avx512bf16"))) void tile(const uint16_t* const (&w)[kRowBlock],
                                                           const uint16_t* const (&x)[N], int64_t full,
                                                           float (&s)[N][kRowBlock]) const {
    __m512 a[N][kRowBlock];
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < kRowBlock; ++k) a[j][k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += kStep) {
      const __m512bh w0 = pairs(w[0] + i), w1 = pairs(w[1] + i), w2 = pairs(w[2] + i), w3 = pairs(w[3] + i);
      for (int64_t j = 0; j < N; ++j) {
        const __m512bh xv = pairs(x[j] + i);
        a[j][0] = _mm512_dpbf16_ps(a[j][0], w0, xv);
        a[j][1] = _mm512_dpbf16_ps(a[j][1], w1, xv);
        a[j][2] = _mm512_dpbf16_ps(a[j][2], w2, xv);
        a[j][3] = _mm512_dpbf16_ps(a[j][3], w3, xv);
      }
    }
    for (int64_t j = 0; j < N; ++j) sum_lanes(a[j][0], a[j][1], a[j][2], a[j][3], s[j]);
  }
};

template <typename W, typename X>
__attribute__((target("avx512f"), flatten))  // flatten: every call inlined, in this target
void matvec_rows_avx512(const W* __restrict w, const X* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                        int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
  matvec_rows_blocks(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate, Avx512Sums{});
}

__attribute__((target("avx512f,avx512bf16"), flatten))
void matvec_rows_avx512_bf16(const uint16_t* __restrict w, const uint16_t* __restrict x, int64_t x_stride, int64_t B,
                             int64_t cols, int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride,
                             bool accumulate) {
  matvec_rows_blocks(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate, Avx512Bf16DotSums{});
}

#endif


template <typename W, typename X>
void matvec_rows_any(const W* __restrict w, const X* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                     int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
#if NANOGPT_X86_INTRINSICS
  if (avx512_kernels())
    return matvec_rows_avx512(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate);
#endif
  matvec_rows_portable(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate);
}

// out[b * out_stride + i] = x[b * x_stride + i] rounded to bf16 (simd.h's float_to_bf16_bits).
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, round_rows_to_bf16, (const float* __restrict x, int64_t x_stride, int64_t B,
               int64_t cols, uint16_t* __restrict out, int64_t out_stride), (x, x_stride, B, cols, out, out_stride), {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < cols; ++i) out[b * out_stride + i] = float_to_bf16_bits(x[b * x_stride + i]);
})

}  // namespace


void matvec_rows(const float* __restrict w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                 int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
  matvec_rows_any(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate);
}

void matvec_rows(const uint16_t* __restrict w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                 int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
  thread_local AlignedVector<uint16_t> rounded;  // each thread's copy of x in bf16
  rounded.resize(B * cols);
  round_rows_to_bf16(x, x_stride, B, cols, rounded.data(), cols);
#if NANOGPT_X86_INTRINSICS
  if (avx512_bf16_kernels())
    return matvec_rows_avx512_bf16(w, rounded.data(), cols, B, cols, r0, r1, y, y_stride, accumulate);
#endif
  matvec_rows_any(w, rounded.data(), cols, B, cols, r0, r1, y, y_stride, accumulate);
}

namespace {

// Rows r0 <= r < r1 of the int8 product for each of B rows of xq (int8, `cols` apart), four rows at a
// time as matvec_rows_blocks: sums(w4, xb, full, s) sets s[k] to the integer dot product of the
// stored bytes w4[k] (q + 128) and xb over the first `full` columns; the rest are added here. Then
// Σ (q + 128) x_q - 128 Σ x_q = Σ q x_q, scaled. The sums are exact in int32 while
// 255 * 127 * cols < 2^31 (cols < 66,000); integer sums do not depend on their order, so every
// kernel gives the same bits.
template <typename Sums>
inline __attribute__((always_inline)) void matvec_rows_int8_blocks(const Int8Rows& w, const int8_t* __restrict xq,
                                                                    const float* xs, const int32_t* xsum, int64_t B,
                                                                    int64_t cols, int64_t r0, int64_t r1,
                                                                    float* __restrict y, int64_t y_stride,
                                                                    bool accumulate, Sums sums) {
  const int64_t full = cols - cols % Sums::kStep;
  const auto store = [&](int64_t b, int64_t r, int32_t dot) {
    const float v = w.scale[r] * xs[b] * static_cast<float>(dot - 128 * xsum[b]);
    float& out = y[b * y_stride + r];
    out = accumulate ? out + v : v;
  };
  int64_t r = r0;
  for (; r + kRowBlock <= r1; r += kRowBlock) {
    const uint8_t* w0 = w.q + r * cols;
    const uint8_t* const rows[kRowBlock] = {w0, w0 + cols, w0 + 2 * cols, w0 + 3 * cols};
    for (int64_t b = 0; b < B; ++b) {
      const int8_t* xb = xq + b * cols;
      int32_t s[kRowBlock];
      sums(rows, xb, full, s);
      for (int64_t k = 0; k < kRowBlock; ++k) {
        for (int64_t i = full; i < cols; ++i) s[k] += int32_t{rows[k][i]} * int32_t{xb[i]};
        store(b, r + k, s[k]);
      }
    }
  }
  for (; r < r1; ++r)  // the last rows, fewer than a block
    for (int64_t b = 0; b < B; ++b) {
      int32_t s = 0;
      for (int64_t i = 0; i < cols; ++i) s += int32_t{w.q[r * cols + i]} * int32_t{xq[b * cols + i]};
      store(b, r, s);
    }
}

NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, matvec_rows_int8_portable, (const Int8Rows& w, const int8_t* __restrict xq,
               const float* xs, const int32_t* xsum, int64_t B, int64_t cols, int64_t r0, int64_t r1,
               float* __restrict y, int64_t y_stride, bool accumulate), (w, xq, xs, xsum, B, cols, r0, r1, y, y_stride,
               accumulate), {
  matvec_rows_int8_blocks(w, xq, xs, xsum, B, cols, r0, r1, y, y_stride, accumulate, LaneSums{});
})

#if NANOGPT_X86_INTRINSICS
// VPDPBUSD: 64 byte pairs of a row a step, each lane adding four products of an unsigned weight
// byte and a signed x byte into int32 (no saturation). Then the four rows' lanes summed by
// sum_lanes' tree, in integers. Full-preset model's 24 matrices, 2 threads, a barrier after each
// (/tmp microbenchmark, 4 runs): 240-247 us a token against 562-656 for the bf16 dot products on
// the same rows: half the bytes, and four products an instruction where converting int8 to fp32
// for FMAs (559-701 us) ran out of arithmetic.
struct Avx512VnniSums {
  static constexpr int64_t kStep = 64;
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) void operator()(const uint8_t* const (&w)[kRowBlock],
                                                                         const int8_t* __restrict xb, int64_t full,
                                                                         int32_t (&s)[kRowBlock]) const {
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512(), a2 = _mm512_setzero_si512(),
            a3 = _mm512_setzero_si512();
    for (int64_t i = 0; i < full; i += kStep) {
      const __m512i xv = _mm512_loadu_si512(xb + i);
      a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(w[0] + i), xv);
      a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512(w[1] + i), xv);
      a2 = _mm512_dpbusd_epi32(a2, _mm512_loadu_si512(w[2] + i), xv);
      a3 = _mm512_dpbusd_epi32(a3, _mm512_loadu_si512(w[3] + i), xv);
    }
    sum_lanes(_mm512_castsi512_ps(a0), _mm512_castsi512_ps(a1), _mm512_castsi512_ps(a2), _mm512_castsi512_ps(a3), s,
              AddInt32{});
  }
};

__attribute__((target("avx512f,avx512bw,avx512vnni"), flatten))
void matvec_rows_int8_vnni(const Int8Rows& w, const int8_t* __restrict xq, const float* xs, const int32_t* xsum,
                           int64_t B, int64_t cols, int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride,
                           bool accumulate) {
  matvec_rows_int8_blocks(w, xq, xs, xsum, B, cols, r0, r1, y, y_stride, accumulate, Avx512VnniSums{});
}
#endif

// x (cols) -> xq = nearbyint(x / s), s = max|x| / 127 (1 for zeros); returns s, and Σ xq in *sum.
// NaN or inf in x: s is NaN (so are the products' outputs) and xq zeros. Each thread quantizes each
// product's input itself, so these loops run 24 times a token per thread on the full-preset model:
// as scalar code (nearbyintf through the PLT, no vector max) they took 13% of a token's time.
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, float, quantize_row_int8_portable, (const float* __restrict x, int64_t cols,
               int8_t* __restrict xq, int32_t* sum), (x, cols, xq, sum), {
  float amax = 0.0f, nonfinite = 0.0f;  // nonfinite: x - x summed, NaN once any x is NaN or inf
_Pragma("omp simd reduction(max : amax) reduction(+ : nonfinite)")
  for (int64_t i = 0; i < cols; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    nonfinite += x[i] - x[i];
  }
  int32_t total = 0;
  if (nonfinite != 0.0f) {  // NaN compares unequal
    std::fill(xq, xq + cols, int8_t{0});
    *sum = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
_Pragma("omp simd reduction(+ : total)")
  for (int64_t i = 0; i < cols; ++i) {
    const float v = std::nearbyint(x[i] / s);
    xq[i] = static_cast<int8_t>(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    total += xq[i];
  }
  *sum = total;
  return s;
})

#if NANOGPT_X86_INTRINSICS
// The same with AVX-512 intrinsics, the same bits (IEEE division, round to nearest even, the same
// clamp): GCC vectorised the portable loop's int8 stores at 128 bits, with blends, at ~4x the
// instructions.
__attribute__((target("avx512f")))
float quantize_row_int8_avx512(const float* __restrict x, int64_t cols, int8_t* __restrict xq, int32_t* sum) {
  // (The all-ones masked forms, and the lanes reduced through memory: GCC 12's bug 105593.)
  constexpr __mmask16 all = 0xFFFF;
  const int64_t full = cols - cols % 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (cols - full)) - 1);
  __m512 amax = _mm512_setzero_ps(), nonfinite = _mm512_setzero_ps();
  for (int64_t i = 0; i <= full; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(i < full ? all : tail, x + i);
    amax = _mm512_maskz_max_ps(all, amax, _mm512_abs_ps(v));
    nonfinite = _mm512_maskz_add_ps(all, nonfinite, _mm512_maskz_sub_ps(all, v, v));
  }
  alignas(64) float lanes[16], holes[16];
  _mm512_store_ps(lanes, amax);
  _mm512_store_ps(holes, nonfinite);
  float m = 0.0f, bad = 0.0f;
  for (int k = 0; k < 16; ++k) {
    m = std::max(m, lanes[k]);
    bad += holes[k];
  }
  if (bad != 0.0f) {  // NaN compares unequal
    std::fill(xq, xq + cols, int8_t{0});
    *sum = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float s = m > 0.0f ? m / 127.0f : 1.0f;
  const __m512 sv = _mm512_set1_ps(s), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  __m512i total = _mm512_setzero_si512();
  for (int64_t i = 0; i <= full; i += 16) {
    const __mmask16 k = i < full ? all : tail;
    if (!k) break;
    const __m512 v = _mm512_maskz_roundscale_ps(all, _mm512_maskz_div_ps(all, _mm512_maskz_loadu_ps(k, x + i), sv),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i q =
        _mm512_maskz_cvttps_epi32(all, _mm512_maskz_min_ps(all, _mm512_maskz_max_ps(all, v, lo), hi));
    _mm512_mask_cvtepi32_storeu_epi8(xq + i, k, q);
    total = _mm512_add_epi32(total, q);
  }
  alignas(64) int32_t parts[16];
  _mm512_store_si512(parts, total);
  int32_t t = 0;
  for (int k = 0; k < 16; ++k) t += parts[k];
  *sum = t;
  return s;
}
#endif

}  // namespace

// The AVX-512 version unless NANOGPT_KERNELS=portable.
float quantize_row_int8(const float* __restrict x, int64_t cols, int8_t* __restrict xq, int32_t* sum) {
#if NANOGPT_X86_INTRINSICS
  if (avx512_kernels()) return quantize_row_int8_avx512(x, cols, xq, sum);
#endif
  return quantize_row_int8_portable(x, cols, xq, sum);
}

void quantize_rows_int8(const float* w, int64_t rows, int64_t cols, uint8_t* q, float* scale) {
  std::vector<int8_t> row(cols);  // the same rule as each product's input (NaN scale and zeros for a damaged row)
  for (int64_t r = 0; r < rows; ++r) {
    int32_t sum = 0;
    scale[r] = quantize_row_int8(w + r * cols, cols, row.data(), &sum);
    for (int64_t i = 0; i < cols; ++i) q[r * cols + i] = static_cast<uint8_t>(row[i] + 128);
  }
}

void matvec_rows(const Int8Rows& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                 int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
  thread_local AlignedVector<int8_t> xq;  // each thread quantizes x itself: no barrier for it
  thread_local std::vector<float> xs;
  thread_local std::vector<int32_t> xsum;
  xq.resize(B * cols);
  xs.resize(B);
  xsum.resize(B);
  for (int64_t b = 0; b < B; ++b) xs[b] = quantize_row_int8(x + b * x_stride, cols, xq.data() + b * cols, &xsum[b]);
#if NANOGPT_X86_INTRINSICS
  if (vnni_kernels())
    return matvec_rows_int8_vnni(w, xq.data(), xs.data(), xsum.data(), B, cols, r0, r1, y, y_stride, accumulate);
#endif
  matvec_rows_int8_portable(w, xq.data(), xs.data(), xsum.data(), B, cols, r0, r1, y, y_stride, accumulate);
}

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
#endif

}  // namespace

int64_t int4_bytes(int64_t rows, int64_t cols) {
  return (rows + kInt4Tile - 1) / kInt4Tile * int4_groups(cols) * kInt4GroupBytes;
}

namespace {

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
    const uint16_t d_bits = float_to_bf16_bits(nonfinite != 0.0f ? std::numeric_limits<float>::quiet_NaN()
                                                                : (hi - lo) / 15.0f);
    const uint16_t m_bits = float_to_bf16_bits(nonfinite != 0.0f ? 0.0f : lo);
    std::memcpy(p + kInt4Chunks * 64 + 2 * j, &d_bits, 2);
    std::memcpy(p + kInt4Chunks * 64 + 2 * (kInt4Tile + j), &m_bits, 2);
    const float d = bf16_bits_to_float(d_bits), m = bf16_bits_to_float(m_bits);
_Pragma("omp simd")
    for (int64_t k = 0; k < n; ++k) {
      const float v = d > 0.0f ? std::nearbyint((group[k] - m) / d) : 0.0f;
      u[k] = static_cast<uint8_t>(v > 15.0f ? 15.0f : v > 0.0f ? v : 0.0f);  // (NaN: 0)
    }
    std::fill(u + n, u + kInt4Group, uint8_t{0});  // columns past the matrix's end
    for (int64_t c = 0; c < kInt4Chunks; ++c)  // row j's 4 bytes of chunk c: columns 0..3 low, 4..7 high
      for (int64_t i = 0; i < 4; ++i)
        p[c * 64 + 4 * j + i] = static_cast<uint8_t>(u[8 * c + i] | u[8 * c + 4 + i] << 4);
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
    float lo = low[0], hi = high[0];
    for (int k = 1; k < 16; ++k) {
      lo = std::min(lo, low[k]);
      hi = std::max(hi, high[k]);
    }
    uint8_t* p = tile + g * kInt4GroupBytes;
    const uint16_t d_bits = float_to_bf16_bits(bad ? std::numeric_limits<float>::quiet_NaN() : (hi - lo) / 15.0f);
    const uint16_t m_bits = float_to_bf16_bits(bad ? 0.0f : lo);
    std::memcpy(p + kInt4Chunks * 64 + 2 * j, &d_bits, 2);
    std::memcpy(p + kInt4Chunks * 64 + 2 * (kInt4Tile + j), &m_bits, 2);
    const float d = bf16_bits_to_float(d_bits), m = bf16_bits_to_float(m_bits);
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

namespace {

// Panels p0 .. p0 + P - 1 (rows row0 .. row0 + 16P - 1, those below r1 stored) against rows x[0 .. N)
// of x: P * N accumulators, one multiply-add a column each, columns in order.
template <int P, int N, typename Store>
inline __attribute__((always_inline)) void panel_block_portable(const float* __restrict w, int64_t cols,
                                                                const float* __restrict x, int64_t x_stride,
                                                                Store store) {
  float acc[P][N][kPanel] = {};
  for (int64_t k = 0; k < cols; ++k)
    for (int n = 0; n < N; ++n) {
      const float xv = x[n * x_stride + k];
      for (int p = 0; p < P; ++p)
        for (int64_t l = 0; l < kPanel; ++l) acc[p][n][l] += w[(p * cols + k) * kPanel + l] * xv;
    }
  for (int p = 0; p < P; ++p)
    for (int n = 0; n < N; ++n) store(p, n, acc[p][n]);
}

// Bytes to bring into L2 while the passes over a slice compute: the next slice of panels.
struct Prefetch {
  const char* next = nullptr;  // the next line to fetch
  const char* end = nullptr;
};

// Bytes a panel of w.
inline int64_t panel_bytes(const F32Panels& w) { return kPanel * w.cols * 4; }
inline int64_t panel_bytes(const Bf16Panels& w) { return kPanel * 2 * bf16_panel_pairs(w.cols) * 2; }

// The panels [p_begin, p_end) against rows b .. b + N - 1 of x, P panels a pass, then one.
template <template <int, int> class Block, int P, int N, typename W, typename X>
inline __attribute__((always_inline)) void panel_rows(const W& w, int64_t p_begin, int64_t p_end,
                                                      const X* __restrict x, int64_t x_stride, int64_t r1,
                                                      float* __restrict y, int64_t y_stride, bool accumulate,
                                                      Prefetch& pf) {
  int64_t p = p_begin;
  for (; p + P <= p_end; p += P) Block<P, N>::run(w, p, x, x_stride, r1, y, y_stride, accumulate, pf);
  for (; p < p_end; ++p) Block<1, N>::run(w, p, x, x_stride, r1, y, y_stride, accumulate, pf);
}

// Every panel of [r0, r1) against every row of x, P panels and N rows of x a pass (N: 8, then 4,
// then 1; P as many as the registers hold), through Block<P, N>::run.
template <template <int, int> class Block, typename W, typename X>
inline __attribute__((always_inline)) void panel_passes(const W& w, const X* __restrict x,
                                                        int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
                                                        float* __restrict y, int64_t y_stride, bool accumulate) {
  const int64_t p_begin = r0 / kPanel, p_end = (r1 + kPanel - 1) / kPanel;
  // With more than one pass of x rows, the panels go by in slices of ~512 KB, each met by every
  // pass before the next: a slice stays in L2 instead of coming from L3 once a pass. The passes
  // over a slice also bring the next one into L2 (Prefetch): the first pass over a slice waited
  // for memory, and the others left it idle. 16 rows, the full preset's block matrices, one
  // thread: 3.06-3.35 against 3.17-4.88 ms over 6 alternating runs; a decoder step of 16 rows on
  // two threads 4.26-4.85 against 4.73-5.19 ms (the mean of 100).
  const int64_t bytes = panel_bytes(w);
  const int64_t slice = B >= 8 ? std::max<int64_t>(3, (int64_t{1} << 19) / bytes / 3 * 3) : p_end;
  for (int64_t s0 = p_begin; s0 < p_end; s0 += slice) {
    const int64_t s1 = std::min(p_end, s0 + slice);
    Prefetch pf;
    if (s1 < p_end && B > 8) {  // more than one pass over this slice
      pf.next = reinterpret_cast<const char*>(w.data) + s1 * bytes;
      pf.end = reinterpret_cast<const char*>(w.data) + std::min(p_end, s1 + slice) * bytes;
    }
    int64_t b = 0;
    for (; b + 8 <= B; b += 8)
      panel_rows<Block, 3, 8>(w, s0, s1, x + b * x_stride, x_stride, r1, y + b * y_stride, y_stride, accumulate, pf);
    for (; b + 4 <= B; b += 4)
      panel_rows<Block, 4, 4>(w, s0, s1, x + b * x_stride, x_stride, r1, y + b * y_stride, y_stride, accumulate, pf);
    for (; b < B; ++b)
      panel_rows<Block, 8, 1>(w, s0, s1, x + b * x_stride, x_stride, r1, y + b * y_stride, y_stride, accumulate, pf);
  }
}

// Row `row` of output lane l into y (or added to it), for the rows below r1.
inline void store_panel_row(const float* acc, int64_t row0, int64_t r1, float* y, bool accumulate) {
  for (int64_t l = 0; l < kPanel && row0 + l < r1; ++l) y[row0 + l] = accumulate ? y[row0 + l] + acc[l] : acc[l];
}

template <int P, int N>
struct PortablePanels {
  static inline __attribute__((always_inline)) void run(const F32Panels& w, int64_t p0, const float* x, int64_t x_stride,
                                                        int64_t r1, float* y, int64_t y_stride, bool accumulate,
                                                        Prefetch&) {
    panel_block_portable<P, N>(w.data + p0 * kPanel * w.cols, w.cols, x, x_stride, [&](int p, int n, const float* acc) {
      store_panel_row(acc, (p0 + p) * kPanel, r1, y + n * y_stride, accumulate);
    });
  }
};

NANOGPT_KERNEL(NANOGPT_FMA_ONLY_CLONES, void, matvec_panels_portable, (const F32Panels& w, const float* __restrict x,
               int64_t x_stride, int64_t B, int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride,
               bool accumulate), (w, x, x_stride, B, r0, r1, y, y_stride, accumulate), {
  panel_passes<PortablePanels>(w, x, x_stride, B, r0, r1, y, y_stride, accumulate);
})

#if NANOGPT_X86_INTRINSICS
// Panels p0 .. p0 + P - 1's accumulators (a lane a row, one register for each row of x) into y
// (or added to it), the rows below r1.
template <int P, int N>
__attribute__((target("avx512f"), always_inline)) inline void store_panels(const __m512 (&acc)[P][N], int64_t p0,
                                                                          int64_t r1, float* y, int64_t y_stride,
                                                                          bool accumulate) {
  for (int p = 0; p < P; ++p) {
    const int64_t row0 = (p0 + p) * kPanel;
    if (row0 >= r1) break;
    const __mmask16 mask = r1 - row0 >= kPanel ? __mmask16(0xFFFF) : __mmask16((1u << (r1 - row0)) - 1);
    for (int n = 0; n < N; ++n) {
      float* out = y + n * y_stride + row0;
      const __m512 v = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), acc[p][n]) : acc[p][n];
      _mm512_mask_storeu_ps(out, mask, v);
    }
  }
}

// Column step k of a pass: lines 2k and 2k + 1 of the next slice into L2, while below `fetch`.
__attribute__((always_inline)) inline void fetch_two(const Prefetch& pf, int64_t k, int64_t fetch) {
  if (2 * k >= fetch) return;
  _mm_prefetch(pf.next + 2 * k * 64, _MM_HINT_T1);
  _mm_prefetch(pf.next + 2 * k * 64 + 64, _MM_HINT_T1);
}

template <int P, int N>
struct Avx512Panels {
  __attribute__((target("avx512f"))) static void run(const F32Panels& w, int64_t p0,
                                                                             const float* x, int64_t x_stride,
                                                                             int64_t r1, float* y, int64_t y_stride,
                                                                             bool accumulate, Prefetch& pf) {
    const int64_t cols = w.cols;
    const float* wp = w.data + p0 * kPanel * cols;
    __m512 acc[P][N];
    for (int p = 0; p < P; ++p)
      for (int n = 0; n < N; ++n) acc[p][n] = _mm512_setzero_ps();
    // Lines of the next slice into L2 while this pass reads panels that are there already: two a
    // column of P panels' (P lines of them), so that the memory works while the arithmetic does.
    const int64_t fetch = pf.next < pf.end ? std::min<int64_t>(2 * cols, (pf.end - pf.next) / 64) : 0;
    for (int64_t k = 0; k < cols; ++k) {
      __m512 wv[P];
      for (int p = 0; p < P; ++p) wv[p] = _mm512_loadu_ps(wp + (p * cols + k) * kPanel);
      fetch_two(pf, k, fetch);
      for (int n = 0; n < N; ++n) {
        const __m512 xv = _mm512_set1_ps(x[n * x_stride + k]);
        for (int p = 0; p < P; ++p) acc[p][n] = _mm512_fmadd_ps(wv[p], xv, acc[p][n]);
      }
    }
    pf.next += fetch * 64;
    store_panels(acc, p0, r1, y, y_stride, accumulate);
  }
};

__attribute__((target("avx512f"), flatten)) void matvec_panels_avx512(const F32Panels& w, const float* __restrict x,
                                                                      int64_t x_stride, int64_t B, int64_t r0,
                                                                      int64_t r1, float* __restrict y, int64_t y_stride,
                                                                      bool accumulate) {
  panel_passes<Avx512Panels>(w, x, x_stride, B, r0, r1, y, y_stride, accumulate);
}

// Bf16Panels (x in bf16, each row's pairs side by side, x_stride even): P panels against N rows of
// x, one VDPBF16PS a pair of columns, the pair of x broadcast to every lane.
template <int P, int N>
struct Avx512Bf16Panels {
  __attribute__((target("avx512f,avx512bf16"))) static void run(const Bf16Panels& w, int64_t p0, const uint16_t* x,
                                                                int64_t x_stride, int64_t r1, float* y,
                                                                int64_t y_stride, bool accumulate, Prefetch& pf) {
    const int64_t npairs = bf16_panel_pairs(w.cols);
    const uint16_t* wp = w.data + p0 * kPanel * 2 * npairs;
    __m512 acc[P][N];
    for (int p = 0; p < P; ++p)
      for (int n = 0; n < N; ++n) acc[p][n] = _mm512_setzero_ps();
    const int64_t fetch = pf.next < pf.end ? std::min<int64_t>(2 * npairs, (pf.end - pf.next) / 64) : 0;
    for (int64_t c = 0; c < npairs; ++c) {
      __m512bh wv[P];
      for (int p = 0; p < P; ++p) wv[p] = pairs(wp + (p * npairs + c) * 2 * kPanel);
      fetch_two(pf, c, fetch);
      for (int n = 0; n < N; ++n) {
        int32_t two;
        std::memcpy(&two, x + n * x_stride + 2 * c, sizeof two);
        const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(two));
        for (int p = 0; p < P; ++p) acc[p][n] = _mm512_dpbf16_ps(acc[p][n], wv[p], xv);
      }
    }
    pf.next += fetch * 64;
    store_panels(acc, p0, r1, y, y_stride, accumulate);
  }
};

__attribute__((target("avx512f,avx512bf16"), flatten)) void matvec_bf16_panels_avx512(
    const Bf16Panels& w, const uint16_t* __restrict x, int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
    float* __restrict y, int64_t y_stride, bool accumulate) {
  panel_passes<Avx512Bf16Panels>(w, x, x_stride, B, r0, r1, y, y_stride, accumulate);
}
#endif

}  // namespace

bool bf16_panels_supported() {
#if NANOGPT_X86_INTRINSICS
  return avx512_bf16_kernels();
#else
  return false;
#endif
}

void matvec_rows(const Bf16Panels& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
                 float* __restrict y, int64_t y_stride, bool accumulate) {
  const int64_t npairs = bf16_panel_pairs(w.cols), stride = 2 * npairs;
  thread_local AlignedVector<uint16_t> rounded;  // each thread's x in bf16, its rows padded to whole pairs
  rounded.resize(B * stride);
  round_rows_to_bf16(x, x_stride, B, w.cols, rounded.data(), stride);
  if (stride > w.cols)
    for (int64_t b = 0; b < B; ++b) rounded[b * stride + w.cols] = 0;
#if NANOGPT_X86_INTRINSICS
  if (avx512_bf16_kernels())
    return matvec_bf16_panels_avx512(w, rounded.data(), stride, B, r0, r1, y, y_stride, accumulate);
#endif
  // (The decoder packs Bf16Panels only where the kernel above runs: bf16_panels_supported.) As it:
  // each pair's odd column's product, then its even one's, added in fp32.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* panel = w.data + r / kPanel * kPanel * stride;
      const uint16_t* xb = rounded.data() + b * stride;
      float sum = 0.0f;
      for (int64_t c = 0; c < npairs; ++c) {
        const uint16_t* pair = panel + (c * kPanel + r % kPanel) * 2;
        sum += bf16_bits_to_float(pair[1]) * bf16_bits_to_float(xb[2 * c + 1]);
        sum += bf16_bits_to_float(pair[0]) * bf16_bits_to_float(xb[2 * c]);
      }
      float& out = y[b * y_stride + r];
      out = accumulate ? out + sum : sum;
    }
}

void matvec_rows(const F32Panels& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
                 float* __restrict y, int64_t y_stride, bool accumulate) {
#if NANOGPT_X86_INTRINSICS
  if (avx512_kernels()) return matvec_panels_avx512(w, x, x_stride, B, r0, r1, y, y_stride, accumulate);
#endif
  matvec_panels_portable(w, x, x_stride, B, r0, r1, y, y_stride, accumulate);
}

void matvec_rows(const Int4Tiles& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
                 float* __restrict y, int64_t y_stride, bool accumulate) {
  thread_local AlignedVector<int8_t> xq;  // each thread quantizes x itself: no barrier for it
  thread_local std::vector<float> s, gsum;
  quantize_rows_for_int4(x, x_stride, B, w.cols, xq, s, gsum);
#if NANOGPT_X86_INTRINSICS
  if (vnni_kernels())
    return matvec_rows_int4_vnni(w, xq.data(), s.data(), gsum.data(), B, r0, r1, y, y_stride, accumulate);
#endif
  matvec_rows_int4_portable(w, xq.data(), s.data(), gsum.data(), B, r0, r1, y, y_stride, accumulate);
}

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

}  // namespace

bool decoder_supports(const GPTImpl& model) {
  if (model.is_training() || torch::GradMode::is_enabled()) return false;
  if (at::autocast::is_autocast_enabled(at::kCPU) && at::autocast::get_autocast_dtype(at::kCPU) != at::kBFloat16)
    return false;
  for (const auto& p : model.parameters())
    if (!p.device().is_cpu() || p.scalar_type() != torch::kFloat) return false;
  return true;
}

Decoder::Decoder(GPTImpl& model, Quantize quantize)
    : config_(model.config()),
      C_(config_.n_embd),
      hs_(config_.head_size()),
      nkv_(config_.kv_heads()),
      qkv_width_((config_.n_head + 2 * config_.kv_heads()) * config_.head_size()),
      fc_out_(config_.mlp == "swiglu" ? 2 * config_.mlp_hidden() : config_.mlp_hidden()),
      hidden_(config_.mlp_hidden()),
      rms_(config_.norm == "rmsnorm"),
      activation_(config_.mlp == "swiglu" ? Activation::swiglu
                   : config_.mlp == "relu2" ? Activation::relu2
                                            : Activation::gelu),
      bf16_(at::autocast::is_autocast_enabled(at::kCPU)),
      quantize_(quantize),
      kv_int8_(quantize != Quantize::none && int8_kv_supported(config_.head_size())),
      unit_(quantize == Quantize::int4                                        ? kInt4Tile
            : quantize == Quantize::none && (!bf16_ || bf16_panels_supported()) ? kPanel
                                                                                 : kRowBlock) {
  if (!decoder_supports(model))
    throw std::invalid_argument(
        "[model] the hand-written decoder needs an fp32 model on the CPU in eval mode, without autograd, and CPU "
        "autocast off or in bf16");
  torch::NoGradGuard no_grad;
  lay_out(model);  // measures
  packed_ = torch::empty({packed_size_}, torch::kFloat);
  if (packed_bf16_size_ > 0) packed_bf16_ = torch::empty({packed_bf16_size_}, torch::kBFloat16);
  if (packed_int8_size_ > 0) packed_int8_ = torch::empty({packed_int8_size_}, torch::kByte);
  packed_size_ = packed_bf16_size_ = packed_int8_size_ = 0;
  lay_out(model);  // copies
  if (config_.pos_encoding == "sinusoidal") sinusoid_ = sinusoidal_table(config_.block_size, C_);
  if (config_.pos_encoding == "rope") rope_ = std::make_unique<Rope>(config_.block_size, hs_, config_.rope_base);
}

namespace {

// Places t, flattened and converted to `buffer`'s dtype by LibTorch's copy (its rounding, as
// autocast's cast), at element `size` of `buffer`, and moves `size` on to the next 64-byte line.
// While measuring (buffer undefined) it only counts and returns nullptr; nullptr for an undefined t.
void* place(torch::Tensor& buffer, int64_t& size, const torch::Tensor& t, torch::ScalarType dtype) {
  if (!t.defined()) return nullptr;
  const int64_t offset = size, n = t.numel(), line = 64 / static_cast<int64_t>(c10::elementSize(dtype));
  size += (n + line - 1) / line * line;  // every matrix starts on a 64-byte line
  if (!buffer.defined()) return nullptr;
  auto dst = buffer.narrow(0, offset, n);
  dst.copy_(t.detach().reshape({-1}));
  return dst.data_ptr();
}

}  // namespace

const float* Decoder::pack(const torch::Tensor& t) {
  return static_cast<const float*>(place(packed_, packed_size_, t, torch::kFloat));
}

Decoder::Matrix Decoder::pack_matrix(const torch::Tensor& t, bool in_block) {
  if (quantize_ == Quantize::int4 && in_block) {
    if (!t.defined()) return {};
    const int64_t rows = t.size(0), cols = t.size(1);
    if (!packed_int8_.defined()) {  // measuring
      packed_int8_size_ += int4_bytes(rows, cols);  // whole 64-byte lines (kInt4GroupBytes is)
      return {};
    }
    const auto w = t.detach().to(torch::kFloat).contiguous();
    Matrix m;
    m.int4 = {packed_int8_.data_ptr<uint8_t>() + packed_int8_size_, rows, cols};
    quantize_int4(w.data_ptr<float>(), rows, cols, packed_int8_.data_ptr<uint8_t>() + packed_int8_size_);
    packed_int8_size_ += int4_bytes(rows, cols);
    return m;
  }
  if (quantize_ != Quantize::none) {
    if (!t.defined()) return {};
    if (!packed_int8_.defined()) {  // measuring: the bytes, and a scale a row
      place(packed_int8_, packed_int8_size_, t, torch::kByte);
      place(packed_, packed_size_, t.select(1, 0), torch::kFloat);
      return {};
    }
    const auto w = t.detach().to(torch::kFloat).contiguous();
    auto q = torch::empty(w.sizes(), torch::kByte);
    auto scale = torch::empty({w.size(0)}, torch::kFloat);
    quantize_rows_int8(w.data_ptr<float>(), w.size(0), w.size(1), q.data_ptr<uint8_t>(), scale.data_ptr<float>());
    Matrix m;
    m.int8.q = static_cast<const uint8_t*>(place(packed_int8_, packed_int8_size_, q, torch::kByte));
    m.int8.scale = static_cast<const float*>(place(packed_, packed_size_, scale, torch::kFloat));
    return m;
  }
  Matrix m;
  if (!bf16_ && in_block && t.defined()) {  // panels of kPanel rows (dot.h's F32Panels)
    const int64_t rows = t.size(0), cols = t.size(1), padded = (rows + kPanel - 1) / kPanel * kPanel;
    if (!packed_.defined()) {  // measuring: only the size (an untouched allocation)
      place(packed_, packed_size_, torch::empty({padded, cols}, torch::kFloat), torch::kFloat);
      return m;
    }
    auto w = torch::zeros({padded, cols}, torch::kFloat);
    w.narrow(0, 0, rows).copy_(t.detach());
    const auto panels = w.view({padded / kPanel, kPanel, cols}).permute({0, 2, 1}).contiguous();
    m.panels = {static_cast<const float*>(place(packed_, packed_size_, panels, torch::kFloat)), rows, cols};
    return m;
  }
  if (bf16_ && in_block && t.defined() && bf16_panels_supported()) {  // dot.h's Bf16Panels
    const int64_t rows = t.size(0), cols = t.size(1), padded = (rows + kPanel - 1) / kPanel * kPanel;
    const int64_t npairs = bf16_panel_pairs(cols);
    if (!packed_bf16_.defined()) {  // measuring: only the size (an untouched allocation)
      place(packed_bf16_, packed_bf16_size_, torch::empty({padded * 2 * npairs}, torch::kBFloat16), torch::kBFloat16);
      return m;
    }
    auto w = torch::zeros({padded, 2 * npairs}, torch::kFloat);
    w.narrow(0, 0, rows).narrow(1, 0, cols).copy_(t.detach());
    // (panel, pair, row in the panel, column of the pair), rounded as autocast rounds the weights
    const auto panels = w.to(torch::kBFloat16).view({padded / kPanel, kPanel, npairs, 2}).permute({0, 2, 1, 3}).contiguous();
    m.bf16_panels = {static_cast<const uint16_t*>(place(packed_bf16_, packed_bf16_size_, panels, torch::kBFloat16)),
                     rows, cols};
    return m;
  }
  if (!bf16_) m.f32 = pack(t);
  else m.bf16 = static_cast<const uint16_t*>(place(packed_bf16_, packed_bf16_size_, t, torch::kBFloat16));
  return m;
}

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

void Decoder::lay_out(GPTImpl& model) {
  const auto params = model.named_parameters();
  auto get = [&](const std::string& name) {
    const auto* t = params.find(name);
    return t ? *t : torch::Tensor();
  };
  auto cat = [&](const std::string& prefix, const std::string& what) {  // [q; k; v] as the general path
    auto q = get(prefix + "q_proj." + what);
    return q.defined() ? torch::cat({q, get(prefix + "k_proj." + what), get(prefix + "v_proj." + what)}) : q;
  };
  wte_ = pack_matrix(get("wte.weight"));
  wpe_ = pack_matrix(get("wpe.weight"));
  layers_.assign(config_.n_layer, Layer{});
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    const std::string p = fmt::format("h.{}.", i);
    Layer& l = layers_[i];
    l.ln_1_w = pack(get(p + "ln_1.weight"));
    l.ln_1_b = pack(get(p + "ln_1.bias"));
    l.qkv_w = pack_matrix(cat(p + "attn.", "weight"), true);
    l.qkv_b = pack(cat(p + "attn.", "bias"));
    l.o_w = pack_matrix(get(p + "attn.c_proj.weight"), true);
    l.o_b = pack(get(p + "attn.c_proj.bias"));
    l.ln_2_w = pack(get(p + "ln_2.weight"));
    l.ln_2_b = pack(get(p + "ln_2.bias"));
    const auto fc = get(p + "mlp.c_fc.weight");
    if (activation_ == Activation::swiglu) {  // two matrices: each thread's rows of both halves
      l.fc_w = pack_matrix(fc.narrow(0, 0, hidden_), true);
      l.fc_up_w = pack_matrix(fc.narrow(0, hidden_, hidden_), true);
    } else {
      l.fc_w = pack_matrix(fc, true);
    }
    l.fc_b = pack(get(p + "mlp.c_fc.bias"));
    l.proj_w = pack_matrix(get(p + "mlp.c_proj.weight"), true);
    l.proj_b = pack(get(p + "mlp.c_proj.bias"));
  }
  ln_f_w_ = pack(get("ln_f.weight"));
  ln_f_b_ = pack(get("ln_f.bias"));
  auto lm_head = get("lm_head.weight");
  head_ = lm_head.defined() ? pack_matrix(lm_head) : wte_;  // tied: the head is wte
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
  norm_row(x, w, b, C_, rms_, static_cast<float>(NormImpl::eps), out);
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
