// The blocks' weight matrices in panels of 16 rows (dot.h's F32Panels and Bf16Panels) and their
// products with several rows of x at once (serve's batches): each output sits in one vector lane and
// is summed over the columns in order, so a row gets the same bits in a batch of any size while the
// batch shares every load of a weight. fp32 by AVX-512 FMAs, AVX2 FMAs (or portable loops built for
// AVX + FMA and the baseline), bf16 by AVX512-BF16's dot product a pair of columns at a time. A large batch
// goes over the panels in slices that stay in L2, fetching the next slice while it computes.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "model/fast/avx2.h"
#include "model/fast/dot.h"
#include "model/fast/kernel_choice.h"
#include "model/fast/products.h"
#include "model/fast/simd.h"

namespace nanogpt::model {

namespace {

// The portable loops with no fused multiply-adds: GCC contracted `acc += w * x` into FMAs in some of
// the (P, N) passes of the FMA clone and not in others, so an output's bits depended on which pass
// took its panel, i.e. on where the decoder's threads split the rows (their shares move with their
// measured speeds): a row of a batch of 9 differed from the row alone by ~2e-7 on 2 threads.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
// Panels p0 .. p0 + P - 1 (rows row0 .. row0 + 16P - 1, those below r1 stored) against rows x[0 .. N)
// of x: P * N accumulators, one multiply-add a column each, columns in order.
template <int P, int N, typename Store>
NANOGPT_INLINE void panel_block_portable(const float* __restrict w, int64_t cols,
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
NANOGPT_INLINE void panel_rows(const W& w, int64_t p_begin, int64_t p_end,
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
NANOGPT_INLINE void panel_passes(const W& w, const X* __restrict x,
                                                        int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
                                                        float* __restrict y, int64_t y_stride, bool accumulate) {
  // An empty share (a thread's share of a split can be r0 == r1 == w.rows, which is not a panel's
  // first row when rows is not a multiple of kPanel) computes nothing: rounded down, r0 would name
  // the last panel and write rows that are another thread's.
  if (r0 >= r1) return;
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
  static NANOGPT_INLINE void run(const F32Panels& w, int64_t p0, const float* x, int64_t x_stride,
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

#pragma GCC pop_options

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
NANOGPT_INLINE void fetch_two(const Prefetch& pf, int64_t k, int64_t fetch) {
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

// Without AVX-512 (a laptop's AVX2 + FMA): a panel's 16 rows are two registers, so P panels
// against N rows of x go as sub-blocks that fit AVX2's 16 registers: 7 panels a pass for one row
// of x (14 accumulators), then 4 or 1, else one panel against 4 rows of x. Each output is still one
// FMA a column, columns in order: the same bits whatever the sub-blocks. One row of x, one thread,
// best of 15 rounds of 2,000 on a 2-core AMD EPYC: (384, 128) 3.1 against the FMA clone of the
// portable loops' 3.9 us, (1152, 384) 27 against 35.
template <int PC, int NC>
__attribute__((target("avx2,fma"), always_inline)) inline void avx2_panel_tile(const float* wp, int64_t cols,
                                                                              const float* x, int64_t x_stride,
                                                                              int64_t row0, int64_t r1, float* y,
                                                                              int64_t y_stride, bool accumulate) {
  __m256 acc[PC][NC][2];  // (the loops unrolled so that these stay in registers, not on the stack)
#pragma GCC unroll 8
  for (int p = 0; p < PC; ++p)
#pragma GCC unroll 8
    for (int n = 0; n < NC; ++n) acc[p][n][0] = acc[p][n][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < cols; ++k) {
#pragma GCC unroll 8
    for (int n = 0; n < NC; ++n) {
      const __m256 xv = _mm256_broadcast_ss(x + n * x_stride + k);
#pragma GCC unroll 8
      for (int p = 0; p < PC; ++p) {
        const float* wk = wp + (p * cols + k) * kPanel;
        acc[p][n][0] = _mm256_fmadd_ps(_mm256_loadu_ps(wk), xv, acc[p][n][0]);
        acc[p][n][1] = _mm256_fmadd_ps(_mm256_loadu_ps(wk + 8), xv, acc[p][n][1]);
      }
    }
  }
  alignas(32) float out[PC][NC][kPanel];
#pragma GCC unroll 8
  for (int p = 0; p < PC; ++p)
#pragma GCC unroll 8
    for (int n = 0; n < NC; ++n) {
      _mm256_store_ps(out[p][n], acc[p][n][0]);
      _mm256_store_ps(out[p][n] + 8, acc[p][n][1]);
    }
  for (int p = 0; p < PC; ++p)
    for (int n = 0; n < NC; ++n) store_panel_row(out[p][n], row0 + p * kPanel, r1, y + n * y_stride, accumulate);
}

template <int P, int N>
struct Avx2Panels {
  __attribute__((target("avx2,fma"))) static void run(const F32Panels& w, int64_t p0, const float* x,
                                                      int64_t x_stride, int64_t r1, float* y, int64_t y_stride,
                                                      bool accumulate, Prefetch&) {
    const int64_t cols = w.cols;
    for (int p = 0; p < P;) {
      const float* wp = w.data + (p0 + p) * kPanel * cols;
      const int64_t row0 = (p0 + p) * kPanel;
      if (row0 >= r1) break;
      if constexpr (N == 1) {
        if (p + 7 <= P) {
          avx2_panel_tile<7, 1>(wp, cols, x, x_stride, row0, r1, y, y_stride, accumulate);
          p += 7;
          continue;
        }
        if (p + 4 <= P) {
          avx2_panel_tile<4, 1>(wp, cols, x, x_stride, row0, r1, y, y_stride, accumulate);
          p += 4;
          continue;
        }
        avx2_panel_tile<1, 1>(wp, cols, x, x_stride, row0, r1, y, y_stride, accumulate);
      } else {
        static_assert(N % 4 == 0, "rows of x in fours");
        for (int n = 0; n < N; n += 4)
          avx2_panel_tile<1, 4>(wp, cols, x + n * x_stride, x_stride, row0, r1, y + n * y_stride, y_stride,
                                accumulate);
      }
      ++p;
    }
  }
};

__attribute__((target("avx2,fma"), flatten)) void matvec_panels_avx2(const F32Panels& w, const float* __restrict x,
                                                                     int64_t x_stride, int64_t B, int64_t r0,
                                                                     int64_t r1, float* __restrict y,
                                                                     int64_t y_stride, bool accumulate) {
  panel_passes<Avx2Panels>(w, x, x_stride, B, r0, r1, y, y_stride, accumulate);
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
  if (avx2_kernels()) return matvec_panels_avx2(w, x, x_stride, B, r0, r1, y, y_stride, accumulate);
#endif
  matvec_panels_portable(w, x, x_stride, B, r0, r1, y, y_stride, accumulate);
}

}  // namespace nanogpt::model
