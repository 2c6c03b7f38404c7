// The products of a weight matrix stored row by row in fp32 or bf16 with one or more rows of x
// (dot.h's matvec_rows for float and uint16_t weights): the decoder's embeddings and head, its bf16
// matrices where the CPU has no AVX512-BF16 for the panels, and attention's scores over the cached
// keys. Four weight rows at a time, so that each load of x feeds four of them, in one of four
// kernels picked by CPU feature: plain C++ lane sums that each instruction-set clone vectorises,
// AVX2 FMAs, AVX-512 FMAs, or AVX512-BF16 dot products. Shares too large to stay in cache are streamed with
// prefetches, on AMD CPUs only.
#include <cstdint>

#include "model/fast/avx2.h"
#include "model/fast/avx512.h"
#include "model/fast/dot.h"
#include "model/fast/kernel_choice.h"
#include "model/fast/products.h"
#include "model/fast/simd.h"

namespace nanogpt::model {

namespace {

// Four rows' dot products with x finished: the columns past the last whole step of the lane sums
// added to the rows' sums s, then stored into y (or added to it).
template <typename W, typename X>
NANOGPT_INLINE void finish_rows(const W* const (&w)[kRowBlock], const X* xb, int64_t full,
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
NANOGPT_INLINE void prefetch_two_ahead(const W* w, int64_t r, int64_t r1, int64_t cols) {
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
NANOGPT_INLINE void matvec_rows_blocks(const W* __restrict w, const X* __restrict x,
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

// Without AVX-512 (a laptop's AVX2 + FMA): 16 weights of each of four rows into eight FMAs per two
// loads of x, bf16 widened by a shift (load8); N rows of x one after the other (8 accumulators:
// AVX2 has 16 registers), each in the same operations and order whatever N. The CPU preset's
// (512, 128) product: 4.8 against the FMA clone of LaneSums' 6.3 us, and (65, 128) 0.44 against 0.68
// (2-core AMD EPYC, one thread, best of 15 rounds of 2,000).
struct Avx2Sums {
  static constexpr int64_t kStep = 16;
  static constexpr bool kTiles = true;
  template <int64_t N, typename W, typename X>
  __attribute__((target("avx2,fma"))) void tile(const W* const (&w)[kRowBlock], const X* const (&x)[N],
                                                int64_t full, float (&s)[N][kRowBlock]) const {
    const W *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    for (int64_t j = 0; j < N; ++j) {
      // named, not an array: GCC kept an array of accumulators on the stack, a store each step
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      const X* xj = x[j];
      for (int64_t i = 0; i < full; i += kStep) {
        const __m256 xl = load8(xj + i), xh = load8(xj + i + 8);
        a0 = _mm256_fmadd_ps(load8(w0 + i), xl, a0);
        b0 = _mm256_fmadd_ps(load8(w0 + i + 8), xh, b0);
        a1 = _mm256_fmadd_ps(load8(w1 + i), xl, a1);
        b1 = _mm256_fmadd_ps(load8(w1 + i + 8), xh, b1);
        a2 = _mm256_fmadd_ps(load8(w2 + i), xl, a2);
        b2 = _mm256_fmadd_ps(load8(w2 + i + 8), xh, b2);
        a3 = _mm256_fmadd_ps(load8(w3 + i), xl, a3);
        b3 = _mm256_fmadd_ps(load8(w3 + i + 8), xh, b3);
      }
      _mm_storeu_ps(s[j], sum_lanes4(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1), _mm256_add_ps(a2, b2),
                                     _mm256_add_ps(a3, b3)));
    }
  }
};

template <typename W, typename X>
__attribute__((target("avx2,fma"), flatten))
void matvec_rows_avx2(const W* __restrict w, const X* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                      int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
  matvec_rows_blocks(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate, Avx2Sums{});
}

#endif


template <typename W, typename X>
void matvec_rows_any(const W* __restrict w, const X* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                     int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
#if NANOGPT_X86_INTRINSICS
  if (avx512_kernels())
    return matvec_rows_avx512(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate);
  if (avx2_kernels())
    return matvec_rows_avx2(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate);
#endif
  matvec_rows_portable(w, x, x_stride, B, cols, r0, r1, y, y_stride, accumulate);
}

}  // namespace

// out[b * out_stride + i] = x[b * x_stride + i] rounded to bf16 (simd.h's float_to_bf16_bits).
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, round_rows_to_bf16, (const float* __restrict x, int64_t x_stride, int64_t B,
               int64_t cols, uint16_t* __restrict out, int64_t out_stride), (x, x_stride, B, cols, out, out_stride), {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < cols; ++i) out[b * out_stride + i] = float_to_bf16_bits(x[b * x_stride + i]);
})

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

}  // namespace nanogpt::model
