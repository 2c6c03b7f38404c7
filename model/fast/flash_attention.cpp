// Flash-style causal attention for CPU training, forward and backward (see flash_attention.h).
#include "model/fast/flash_attention.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "model/fast/dropout.h"
#include "model/fast/simd.h"

// The BLAS inside LibTorch's CPU library (MKL on x86-64) exports the Fortran sgemm; where none does,
// the block products run as at::addmm_ on the same memory.
extern "C" __attribute__((weak)) void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                                              const int* k, const float* alpha, const float* a, const int* lda,
                                              const float* b, const int* ldb, const float* beta, float* c,
                                              const int* ldc);

namespace nanogpt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// c (m × n, row stride ldc) = alpha a' b' + beta c, all row-major: a' is a (m × k, row stride lda)
// or, with ta, the transpose of a (k × m); b' likewise. beta = 0 ignores what c held.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (sgemm_ != nullptr) {  // column-major BLAS computes cᵀ = b'ᵀ a'ᵀ
    const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
    const int LDA = static_cast<int>(ldb), LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
    sgemm_(tb ? "T" : "N", ta ? "T" : "N", &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
    return;
  }
  auto view = [](const float* p, int64_t rows, int64_t cols, int64_t ld, bool t) {  // (rows, cols) of p
    auto x = torch::from_blob(const_cast<float*>(p), {t ? cols : rows, t ? rows : cols}, {ld, 1});
    return t ? x.t() : x;
  };
  torch::from_blob(c, {m, n}, {ldc, 1}).addmm_(view(a, m, k, lda, ta), view(b, k, n, ldb, tb), beta, alpha);
}

// One block of scores s (rows × cols, row stride ld): row r is query i0 + r, column c key j0 + c, and
// keys after the query are hidden. Each row's running maximum m and sum l advance by the block, its
// output so far (o, rows × hs) is rescaled to the new maximum, and s becomes the block's
// exponentials (0 where hidden), times the dropout factors where f is given (row r's key j at
// f[r * ldf + j]): what multiplies the values.
NANOGPT_INLINE void online_softmax_rows(float* s, int64_t rows, int64_t cols, int64_t ld, int64_t i0, int64_t j0, float* m,
                                float* l, float* o, int64_t hs, const float* f, int64_t ldf) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const int64_t n = std::clamp<int64_t>(i0 + r - j0 + 1, 0, cols);  // visible keys
    if (n > 0) {
      const float top = std::max(m[r], max_of(row, n));
      const float rescale = exp_nonpositive(m[r] - top);  // m = -inf at first: o and l are still 0
      l[r] = l[r] * rescale + exp_shifted_sum(row, top, row, n);
      m[r] = top;
      float* out = o + r * hs;
#pragma omp simd
      for (int64_t d = 0; d < hs; ++d) out[d] *= rescale;
      if (f != nullptr) {
        const float* keep = f + r * ldf + j0;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) row[j] *= keep[j];
      }
    }
    std::fill(row + n, row + cols, 0.0f);
  }
}

// Backward's block: s holds the scores (scaled), dp the gradient of the dropped weights (dy vᵀ).
// With w = exp(s - lse) the weights, s becomes the dropped weights w f and dp the scores' gradient
// scale w (f dp - D), D = the row's dy · y (FlashAttention-2's form of <w, dw>); 0 where hidden.
NANOGPT_INLINE void softmax_grad_rows(float* s, float* dp, int64_t rows, int64_t cols, int64_t ld, int64_t i0, int64_t j0,
                              const float* lse, const float* D, const float* f, int64_t ldf, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float *srow = s + r * ld, *dprow = dp + r * ld;
    const int64_t n = std::clamp<int64_t>(i0 + r - j0 + 1, 0, cols);
    const float row_lse = lse[i0 + r], row_d = D[i0 + r];
    if (f != nullptr) {
      const float* keep = f + r * ldf + j0;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float w = exp_nonpositive(srow[j] - row_lse);
        dprow[j] = scale * w * (keep[j] * dprow[j] - row_d);
        srow[j] = w * keep[j];
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float w = exp_nonpositive(srow[j] - row_lse);
        dprow[j] = scale * w * (dprow[j] - row_d);
        srow[j] = w;
      }
    }
    std::fill(srow + n, srow + cols, 0.0f);
    std::fill(dprow + n, dprow + cols, 0.0f);
  }
}

NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, online_softmax_block,
               (float* s, int64_t rows, int64_t cols, int64_t ld, int64_t i0, int64_t j0, float* m, float* l,
                float* o, int64_t hs, const float* f, int64_t ldf),
               (s, rows, cols, ld, i0, j0, m, l, o, hs, f, ldf),
               { online_softmax_rows(s, rows, cols, ld, i0, j0, m, l, o, hs, f, ldf); })
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, softmax_grad_block,
               (float* s, float* dp, int64_t rows, int64_t cols, int64_t ld, int64_t i0, int64_t j0,
                const float* lse, const float* D, const float* f, int64_t ldf, float scale),
               (s, dp, rows, cols, ld, i0, j0, lse, D, f, ldf, scale),
               { softmax_grad_rows(s, dp, rows, cols, ld, i0, j0, lse, D, f, ldf, scale); })

// A (B, heads, T, hs) tensor's data, hs contiguous: fp32 as float, bf16 as its raw 16 bits.
template <typename S>
struct Heads {
  S* data;
  int64_t sb, sh, st;  // strides of batch, head, position
  S* head(int64_t b, int64_t h) const { return data + b * sb + h * sh; }
};

template <typename S>
Heads<S> heads(const torch::Tensor& t) {
  void* p = t.data_ptr();
  return {static_cast<S*>(p), t.stride(0), t.stride(1), t.stride(2)};
}

// Rows r0 .. r0 + n - 1 of a head (row stride `stride`) as fp32, with the result's row stride in
// *ld: fp32 is read in place, bf16 widened into `scratch` (n × hs).
inline const float* rows_f32(const float* head, int64_t stride, int64_t r0, int64_t, int64_t, float*, int64_t* ld) {
  *ld = stride;
  return head + r0 * stride;
}
inline const float* rows_f32(const uint16_t* head, int64_t stride, int64_t r0, int64_t n, int64_t hs, float* scratch,
                             int64_t* ld) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < hs; ++d) scratch[r * hs + d] = bf16_bits_to_float(head[(r0 + r) * stride + d]);
  *ld = hs;
  return scratch;
}

// n rows of hs fp32 values (row stride lds), each times its factor (or 1), rounded to S once.
template <typename S>
void store_rows(const float* src, int64_t lds, const float* factor, int64_t n, int64_t hs, S* dst, int64_t ldd) {
  for (int64_t r = 0; r < n; ++r) {
    const float g = factor ? factor[r] : 1.0f;
    for (int64_t d = 0; d < hs; ++d) store_float(g * src[r * lds + d], dst + r * ldd + d);
  }
}

struct Shape {
  int64_t B, nh, nkv, T, hs, block;
  int64_t blocks() const { return (T + block - 1) / block; }
  int64_t group() const { return nh / nkv; }  // query heads per kv head
};

// The dropout factors (1 / (1 - p) or 0) of pair n's queries i0 .. i0 + rows - 1 against every key,
// (rows × T): elements (n T + i) T + j of the mask, as chunked attention draws them. `ones` holds at
// least rows × T ones (one per thread, made once).
torch::Tensor dropout_factors(const torch::Tensor& ones, double p, uint64_t seed, int64_t n, int64_t i0, int64_t rows,
                              int64_t T) {
  return apply_dropout_mask(ones.narrow(0, 0, rows * T), p, seed, (n * T + i0) * T, torch::kFloat);
}

// y (B, T, nh, hs) and lse (B nh T): one task per (batch, head, query block).
template <typename S>
void forward_kernel(const Heads<S>& q, const Heads<S>& k, const Heads<S>& v, S* y, float* lse, const Shape& sh,
                    double p, uint64_t seed) {
  const int64_t T = sh.T, hs = sh.hs, bs = sh.block, nqb = sh.blocks();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  at::parallel_for(0, sh.B * sh.nh * nqb, 1, [&](int64_t begin, int64_t end) {
    AlignedVector<float> qs(bs * hs), ks(T * hs), vs(T * hs), s(bs * bs), o(bs * hs), m(bs), l(bs);
    const auto ones = p > 0 ? torch::ones({bs * T}) : torch::Tensor();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / nqb, b = n / sh.nh, h = n % sh.nh, i0 = (task % nqb) * bs;
      const int64_t rows = std::min(bs, T - i0), keys = i0 + rows;  // keys 0 .. keys - 1 are seen
      int64_t ldq, ldk, ldv;
      const float* qf = rows_f32(q.head(b, h), q.st, i0, rows, hs, qs.data(), &ldq);
      const float* kf = rows_f32(k.head(b, h / sh.group()), k.st, 0, keys, hs, ks.data(), &ldk);
      const float* vf = rows_f32(v.head(b, h / sh.group()), v.st, 0, keys, hs, vs.data(), &ldv);
      const auto factors = p > 0 ? dropout_factors(ones, p, seed, n, i0, rows, T) : torch::Tensor();
      const float* f = p > 0 ? factors.data_ptr<float>() : nullptr;
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t j0 = 0; j0 < keys; j0 += bs) {  // key blocks after the diagonal's are never visited
        const int64_t cols = std::min(bs, keys - j0);
        gemm(false, true, rows, cols, hs, scale, qf, ldq, kf + j0 * ldk, ldk, 0.0f, s.data(), bs);  // scale q kᵀ
        online_softmax_block(s.data(), rows, cols, bs, i0, j0, m.data(), l.data(), o.data(), hs, f, T);
        gemm(false, false, rows, hs, cols, 1.0f, s.data(), bs, vf + j0 * ldv, ldv, 1.0f, o.data(), hs);  // o += w v
      }
      for (int64_t r = 0; r < rows; ++r) {
        lse[n * T + i0 + r] = m[r] + std::log(l[r]);
        l[r] = 1.0f / l[r];
      }
      store_rows(o.data(), hs, l.data(), rows, hs, y + ((b * T + i0) * sh.nh + h) * hs, sh.nh * hs);
    }
  });
}

// dq (B, T, nh, hs), dk and dv (B, T, nkv, hs): one task per (batch, kv head), which sums the
// gradients of its keys and values over the query heads that share them.
template <typename S>
void backward_kernel(const Heads<S>& q, const Heads<S>& k, const Heads<S>& v, const Heads<S>& y, const Heads<S>& dy,
                     const float* lse, S* dq, S* dk, S* dv, const Shape& sh, double p, uint64_t seed) {
  const int64_t T = sh.T, hs = sh.hs, bs = sh.block;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  at::parallel_for(0, sh.B * sh.nkv, 1, [&](int64_t begin, int64_t end) {
    AlignedVector<float> ks(T * hs), vs(T * hs), qs(T * hs), dys(T * hs), dq_sum(T * hs), dk_sum(T * hs),
        dv_sum(T * hs), s(bs * bs), dp(bs * bs), D(T);
    const auto ones = p > 0 ? torch::ones({bs * T}) : torch::Tensor();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / sh.nkv, g = task % sh.nkv;
      int64_t ldk, ldv, ldq, lddy;
      const float* kf = rows_f32(k.head(b, g), k.st, 0, T, hs, ks.data(), &ldk);
      const float* vf = rows_f32(v.head(b, g), v.st, 0, T, hs, vs.data(), &ldv);
      std::fill(dk_sum.begin(), dk_sum.end(), 0.0f);
      std::fill(dv_sum.begin(), dv_sum.end(), 0.0f);
      for (int64_t h = g * sh.group(); h < (g + 1) * sh.group(); ++h) {
        const int64_t n = b * sh.nh + h;
        const float* qf = rows_f32(q.head(b, h), q.st, 0, T, hs, qs.data(), &ldq);
        const float* dyf = rows_f32(dy.head(b, h), dy.st, 0, T, hs, dys.data(), &lddy);
        const S* yh = y.head(b, h);
        for (int64_t i = 0; i < T; ++i) {  // D_i = dy_i · y_i
          float dot = 0.0f;
          for (int64_t d = 0; d < hs; ++d) dot += dyf[i * lddy + d] * load_float(yh[i * y.st + d]);
          D[i] = dot;
        }
        std::fill(dq_sum.begin(), dq_sum.end(), 0.0f);
        for (int64_t i0 = 0; i0 < T; i0 += bs) {
          const int64_t rows = std::min(bs, T - i0), keys = i0 + rows;
          const auto factors = p > 0 ? dropout_factors(ones, p, seed, n, i0, rows, T) : torch::Tensor();
          const float* f = p > 0 ? factors.data_ptr<float>() : nullptr;
          const float *q_rows = qf + i0 * ldq, *dy_rows = dyf + i0 * lddy;
          for (int64_t j0 = 0; j0 < keys; j0 += bs) {
            const int64_t cols = std::min(bs, keys - j0);
            gemm(false, true, rows, cols, hs, scale, q_rows, ldq, kf + j0 * ldk, ldk, 0.0f, s.data(), bs);  // scores
            gemm(false, true, rows, cols, hs, 1.0f, dy_rows, lddy, vf + j0 * ldv, ldv, 0.0f, dp.data(), bs);  // dy vᵀ
            softmax_grad_block(s.data(), dp.data(), rows, cols, bs, i0, j0, lse + n * T, D.data(), f, T, scale);
            gemm(true, false, cols, hs, rows, 1.0f, s.data(), bs, dy_rows, lddy, 1.0f, dv_sum.data() + j0 * hs, hs);
            gemm(false, false, rows, hs, cols, 1.0f, dp.data(), bs, kf + j0 * ldk, ldk, 1.0f, dq_sum.data() + i0 * hs, hs);
            gemm(true, false, cols, hs, rows, 1.0f, dp.data(), bs, q_rows, ldq, 1.0f, dk_sum.data() + j0 * hs, hs);
          }
        }
        store_rows(dq_sum.data(), hs, nullptr, T, hs, dq + (b * T * sh.nh + h) * hs, sh.nh * hs);
      }
      store_rows(dk_sum.data(), hs, nullptr, T, hs, dk + (b * T * sh.nkv + g) * hs, sh.nkv * hs);
      store_rows(dv_sum.data(), hs, nullptr, T, hs, dv + (b * T * sh.nkv + g) * hs, sh.nkv * hs);
    }
  });
}

// A tensor whose last dimension is contiguous, as the kernels read rows.
torch::Tensor rows_contiguous(const torch::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// (B, heads, T, hs) laid out as (B, T, heads, hs).
torch::Tensor empty_heads(int64_t B, int64_t heads, int64_t T, int64_t hs, const torch::TensorOptions& options) {
  return torch::empty({B, T, heads, hs}, options).transpose(1, 2);
}

// What backward keeps of an input: the input itself, or a copy where it is a view into a larger
// buffer (v, and without RoPE q and k, are slices of the projections' output, which would otherwise
// stay alive until backward: at the full preset 75 MB a layer).
torch::Tensor compact(const torch::Tensor& t) {
  if (t.storage().nbytes() <= static_cast<size_t>(t.numel() * t.element_size())) return t;
  auto copy = empty_heads(t.size(0), t.size(1), t.size(2), t.size(3), t.options());
  return copy.copy_(t);
}

template <typename S>
S* out(const torch::Tensor& t) {
  return static_cast<S*>(t.data_ptr());
}

struct FlashAttention : public torch::autograd::Function<FlashAttention> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
                               const torch::Tensor& v_in, double p, int64_t block) {
    RECORD_FUNCTION("flash_attention", std::vector<c10::IValue>({q_in, k_in, v_in}));
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // the caller's dtypes
    auto q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
    const Shape sh{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), block};
    const uint64_t seed = p > 0 ? draw_dropout_seed() : 0;
    auto y = empty_heads(sh.B, sh.nh, sh.T, sh.hs, q.options());           // (B, nh, T, hs)
    auto lse = torch::empty({sh.B, sh.nh, sh.T}, q.options().dtype(torch::kFloat));  // log-sum-exp per query row
    if (q.scalar_type() == torch::kFloat) {
      forward_kernel(heads<float>(q), heads<float>(k), heads<float>(v), out<float>(y), lse.data_ptr<float>(), sh, p,
                     seed);
    } else {
      forward_kernel(heads<uint16_t>(q), heads<uint16_t>(k), heads<uint16_t>(v), out<uint16_t>(y),
                     lse.data_ptr<float>(), sh, p, seed);
    }
    ctx->save_for_backward({compact(q), compact(k), compact(v), y, lse});
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    ctx->saved_data["block"] = block;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_FUNCTION("flash_attention_backward", std::vector<c10::IValue>());
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &y = saved[3], &lse = saved[4];
    const double p = ctx->saved_data["p"].toDouble();
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    const Shape sh{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), ctx->saved_data["block"].toInt()};
    auto dy = rows_contiguous(grads[0].to(q.scalar_type()));  // (B, nh, T, hs)
    auto dq = empty_heads(sh.B, sh.nh, sh.T, sh.hs, q.options());
    auto dk = empty_heads(sh.B, sh.nkv, sh.T, sh.hs, q.options()), dv = empty_heads(sh.B, sh.nkv, sh.T, sh.hs, q.options());
    if (q.scalar_type() == torch::kFloat) {
      backward_kernel(heads<float>(q), heads<float>(k), heads<float>(v), heads<float>(y), heads<float>(dy),
                      lse.data_ptr<float>(), out<float>(dq), out<float>(dk), out<float>(dv), sh, p, seed);
    } else {
      backward_kernel(heads<uint16_t>(q), heads<uint16_t>(k), heads<uint16_t>(v), heads<uint16_t>(y),
                      heads<uint16_t>(dy), lse.data_ptr<float>(), out<uint16_t>(dq), out<uint16_t>(dk),
                      out<uint16_t>(dv), sh, p, seed);
    }
    return {dq, dk, dv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double dropout_p, int64_t block) {
  TORCH_CHECK(block >= 1, "flash_attention: block must be >= 1, got ", block);
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "flash_attention: q, k and v must be on the CPU");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
                  (q.scalar_type() == torch::kFloat || q.scalar_type() == torch::kBFloat16),
              "flash_attention: q, k and v must share a dtype, fp32 or bf16");
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && k.dim() == 4 && q.size(0) == k.size(0) &&
                  q.size(2) == k.size(2) && q.size(3) == k.size(3) && k.size(1) >= 1 && q.size(1) % k.size(1) == 0,
              "flash_attention: q must be (B, nh, T, hs) and k, v (B, nkv, T, hs) with nh a multiple of nkv, got ",
              q.sizes(), " and ", k.sizes());
  return FlashAttention::apply(q, k, v, dropout_p, block);
}

}  // namespace nanogpt::model
