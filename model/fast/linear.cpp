// Linear with a matrix-vector fast path and a one-node autocast path for CPU training (see linear.h).
#include "model/fast/linear.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

// MKL's bf16 GEMM with an fp32 result (its documented CBLAS interface, LP64 integers). LibTorch's
// x86 builds link MKL statically and export it; declared weak, so that a LibTorch without MKL (ARM,
// some source builds) links all the same and mm_to_float falls back to an fp32 GEMM.
extern "C" __attribute__((weak)) void cblas_gemm_bf16bf16f32(int layout, int transa, int transb, int m, int n, int k,
                                                            float alpha, const uint16_t* a, int lda,
                                                            const uint16_t* b, int ldb, float beta, float* c,
                                                            int ldc);

namespace nanogpt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// How a (rows, cols) operand is laid out for CBLAS: row-major with a leading dimension, or the
// transpose of a row-major matrix. Neither (a general stride) -> nullopt.
struct BlasOperand {
  int trans;  // CblasNoTrans 111, CblasTrans 112
  int64_t ld;
};
std::optional<BlasOperand> blas_operand(const torch::Tensor& m) {
  const int64_t rows = m.size(0), cols = m.size(1);
  if (m.stride(1) == 1 && m.stride(0) >= std::max<int64_t>(cols, 1)) return BlasOperand{111, m.stride(0)};
  if (m.stride(0) == 1 && m.stride(1) >= std::max<int64_t>(rows, 1)) return BlasOperand{112, m.stride(1)};
  return std::nullopt;
}

// y = x wᵀ + b computed as autocast's linear computes it on the CPU (x and w rounded to the autocast
// dtype, the product in it, b added in it), as one autograd node; `wide` leaves the product and the
// bias's sum in fp32 instead (Result::kWide). Through LibTorch, autocast's linear records the
// weight's cast, a transpose, the input's reshape, the GEMM and the output's view: five nodes and
// their ~10 kernels' dispatch per layer, each way; at the CPU preset (17 linears, ~11 ms a step) that
// bookkeeping was about a tenth of the step. Backward: dx = dy w, dw = dyᵀ x, db = the sum of dy
// over the rows, in fp32; the products that land in fp32 (dw for fp32 weights, dx for an fp32 input)
// are summed in fp32 and never rounded to bf16 on the way (mm_to_float).
struct AutocastLinear : public torch::autograd::Function<AutocastLinear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, c10::ScalarType dtype, bool wide) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // dtypes chosen here
    const int64_t in = x.size(-1), out = w.size(0);
    auto x2 = x.reshape({-1, in}).to(dtype);  // (N, in)
    auto w_low = w.to(dtype);                 // (out, in)
    const bool bias = b.numel() > 0;
    torch::Tensor y;  // (N, out)
    if (wide) {
      y = mm_to_float(x2, w_low.t());
      if (bias) y.add_(b);
    } else {
      y = bias ? torch::addmm(b.to(dtype), x2, w_low.t()) : x2.mm(w_low.t());
    }
    ctx->save_for_backward({x2, w_low});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    ctx->saved_data["bias"] = bias;
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(b.scalar_type());
    auto sizes = x.sizes().vec();
    sizes.back() = out;
    return y.view(sizes);  // (..., out)
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const auto &x2 = saved[0], &w_low = saved[1];
    const auto as = [&](const char* key) { return static_cast<c10::ScalarType>(ctx->saved_data[key].toInt()); };
    auto dy = grads[0].reshape({-1, w_low.size(0)}).to(w_low.scalar_type());  // (N, out)
    auto dx = mm_into(dy, w_low, as("x_dtype"));   // (N, in)
    auto dw = mm_into(dy.t(), x2, as("w_dtype"));  // (out, in)
    auto db = ctx->saved_data["bias"].toBool() ? dy.sum(0, false, torch::kFloat).to(as("b_dtype")) : torch::Tensor();
    auto sizes = grads[0].sizes().vec();
    sizes.back() = x2.size(1);
    return {dx.view(sizes), dw, db, torch::Tensor(), torch::Tensor()};
  }
};

// No bias: custom functions take defined tensors only, so an empty one stands for it.
const torch::Tensor& kNoBias() {
  static const torch::Tensor none = torch::empty({0});
  return none;
}

}  // namespace

bool bf16_products_summed_in_fp32() {
  static const bool mkl = [] {
    if (cblas_gemm_bf16bf16f32 == nullptr) return true;  // mm_to_float widens to fp32: the same sums
    const char* env = std::getenv("NANOGPT_BF16_GEMM");
    const std::string choice = env ? env : "";
    if (choice == "mkl") return true;
    if (choice == "onednn") return false;
    if (!choice.empty())
      fmt::print(stderr, "[model] warning: NANOGPT_BF16_GEMM={} is neither mkl nor onednn: ignored\n", choice);
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;  // MKL's fast bf16 kernels are Intel's; elsewhere it ran ~3x slower
#else
    return true;
#endif
  }();
  return mkl;
}

torch::Tensor mm_to_float(const torch::Tensor& a, const torch::Tensor& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  const bool bf16 = a.scalar_type() == torch::kBFloat16 && b.scalar_type() == torch::kBFloat16 && a.is_cpu() && b.is_cpu();
  if (bf16 && !bf16_products_summed_in_fp32())
    return a.mm(b).to(torch::kFloat);  // oneDNN's bf16 GEMM: summed in fp32, rounded to bf16 once
  if (bf16 && cblas_gemm_bf16bf16f32 != nullptr && M > 0 && N > 0 && K > 0 &&
      M * K < kMaxInt && K * N < kMaxInt && M * N < kMaxInt) {
    auto ao = blas_operand(a), bo = blas_operand(b);
    const auto& ac = ao ? a : a.contiguous();
    const auto& bc = bo ? b : b.contiguous();
    if (!ao) ao = blas_operand(ac);
    if (!bo) bo = blas_operand(bc);
    auto c = torch::empty({M, N}, a.options().dtype(torch::kFloat));
    cblas_gemm_bf16bf16f32(101 /*CblasRowMajor*/, ao->trans, bo->trans, static_cast<int>(M), static_cast<int>(N),
                           static_cast<int>(K), 1.0f, reinterpret_cast<const uint16_t*>(ac.data_ptr()),
                           static_cast<int>(ao->ld), reinterpret_cast<const uint16_t*>(bc.data_ptr()),
                           static_cast<int>(bo->ld), 0.0f, c.data_ptr<float>(), static_cast<int>(N));
    return c;
  }
  return a.to(torch::kFloat).mm(b.to(torch::kFloat));  // the same sums, slower: bf16 values are exact in fp32
}

torch::Tensor mm_into(const torch::Tensor& a, const torch::Tensor& b, c10::ScalarType dtype) {
  return dtype == torch::kFloat && a.is_cpu() ? mm_to_float(a, b) : a.mm(b).to(dtype);
}

torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, Result result) {
  const int64_t in = x.size(-1);
  const bool autocast = at::autocast::is_autocast_enabled(at::kCPU);
  const bool wide = result == Result::kWide;
  if (autocast && x.device().is_cpu() && (torch::GradMode::is_enabled() || wide) && x.numel() != in) {
    const auto dtype = at::autocast::get_autocast_dtype(at::kCPU);
    if (w.scalar_type() == torch::kFloat && (dtype == torch::kBFloat16 || dtype == torch::kHalf))
      return AutocastLinear::apply(x, w, b.defined() ? b : kNoBias(), dtype, wide);
  }
  // Under autocast, linear computes in bf16 / fp16 and mv (not on the CPU's autocast list) would
  // stay fp32: a lone row must get the same dtype and rounding as the rows of a batch.
  if (x.numel() != in || !x.device().is_cpu() || x.scalar_type() != w.scalar_type() || autocast)
    return torch::nn::functional::linear(x, w, b);
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  auto y = torch::mv(w, x.reshape({in}));  // (out,)
  if (b.defined()) y = y + b;
  return y.view(sizes);  // (..., out)
}

}  // namespace nanogpt::model
