// Fused CPU cross-entropy (see cross_entropy.h). Legend: N rows (B*T), V vocabulary.
#include "model/fast/cross_entropy.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/fast/simd.h"

namespace nanogpt::model {
namespace {

constexpr int64_t kIgnoreIndex = -100;  // LibTorch's default ignore_index

// simd.h's softmax passes, compiled into this file's clones (loss_rows itself is a template).
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, float, row_max, (const float* x, int64_t n), (x, n), { return max_of(x, n); })
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, float, row_exp_shifted_sum, (const float* x, float m, float* e, int64_t n), (x, m,
               e, n), { return exp_shifted_sum(x, m, e, n); })

NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, bf16_to_float, (const uint16_t* in, float* out, int64_t n), (in, out, n), {
_Pragma("omp simd")
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(in[i]);
})

// out[i] = e[i] * scale rounded to the nearest bf16, ties to even, as c10::BFloat16 rounds.
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, scale_to_bf16, (const float* e, float scale, uint16_t* out, int64_t n),
               (e, scale, out, n), {
_Pragma("omp simd")
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(e[i] * scale);
})

NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, scale_to_float, (const float* e, float scale, float* out, int64_t n),
               (e, scale, out, n), {
_Pragma("omp simd")
  for (int64_t i = 0; i < n; ++i) out[i] = e[i] * scale;
})

// z = cap tanh(x / cap), the soft-capped logits, and slope = dz/dx = 1 - (z / cap)^2; z may be x.
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, softcap_row, (const float* x, float cap, float* z, float* slope, int64_t n),
               (x, cap, z, slope, n), {
  const float inv_cap = 1.0f / cap;
_Pragma("omp simd")
  for (int64_t i = 0; i < n; ++i) {
    const float t = tanh_float(x[i] * inv_cap);
    z[i] = cap * t;
    slope[i] = 1.0f - t * t;
  }
})

NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, multiply_into, (float* e, const float* by, int64_t n), (e, by, n), {
_Pragma("omp simd")
  for (int64_t i = 0; i < n; ++i) e[i] *= by[i];
})

// A row of logits as fp32: fp32 rows are read in place, bf16 and fp16 rows converted into buf.
const float* load_row(const float* row, int64_t, float*) { return row; }
const float* load_row(const c10::BFloat16* row, int64_t V, float* buf) {
  bf16_to_float(bits(row), buf, V);
  return buf;
}
const float* load_row(const c10::Half* row, int64_t V, float* buf) {
  for (int64_t v = 0; v < V; ++v) buf[v] = static_cast<float>(row[v]);
  return buf;
}

void store_row(const float* e, float scale, float* out, int64_t V) { scale_to_float(e, scale, out, V); }
void store_row(const float* e, float scale, c10::BFloat16* out, int64_t V) {
  scale_to_bf16(e, scale, bits(out), V);
}
void store_row(const float* e, float scale, c10::Half* out, int64_t V) {
  for (int64_t v = 0; v < V; ++v) out[v] = static_cast<c10::Half>(e[v] * scale);
}

// Rows [begin, end): row_loss[i] = logsumexp(x_i) - x_i[t_i] (0 for ignored rows) and, when grad
// is given, grad_i = (softmax(x_i) - one_hot(t_i)) * inv_count (zero for ignored rows). With cap > 0,
// x_i is the soft-capped row z_i = cap tanh(logits_i / cap), written to capped (when given), and the
// gradient w.r.t. the raw logits carries the cap's slope 1 - (z / cap)^2. grad may be logits itself
// (a row is read before its gradient is written).
template <typename T>
void loss_rows(const T* logits, const int64_t* targets, int64_t V, float inv_count, float cap, int64_t begin,
               int64_t end, float* row_loss, T* grad, T* capped) {
  std::vector<float> buf(static_cast<size_t>(V));  // (V,) fp32 row, then its exponentials
  std::vector<float> slope(cap > 0.0f ? static_cast<size_t>(V) : 0);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t t = targets[i];
    T* grad_row = grad ? grad + i * V : nullptr;
    const float* x = nullptr;  // the row as fp32, read unless nothing needs it (an ignored row, no cap)
    if (cap > 0.0f) {
      softcap_row(load_row(logits + i * V, V, buf.data()), cap, buf.data(), slope.data(), V);  // buf = z
      x = buf.data();
      if (capped) store_row(x, 1.0f, capped + i * V, V);  // every row's z, ignored or not
    }
    if (t == kIgnoreIndex) {
      row_loss[i] = 0.0f;
      if (grad_row) std::fill(grad_row, grad_row + V, static_cast<T>(0.0f));
      continue;
    }
    if (!x) x = load_row(logits + i * V, V, buf.data());
    const float x_t = x[t];                            // before buf turns into exponentials
    const float m = row_max(x, V);                         // shift: exp never overflows
    const float sum = row_exp_shifted_sum(x, m, buf.data(), V);  // buf = exp(x - m)
    row_loss[i] = m + std::log(sum) - x_t;
    if (!grad_row) continue;
    const float scale = inv_count / sum;  // softmax / count in one multiply
    float grad_t = buf[t] * scale - inv_count;
    if (cap > 0.0f) {
      grad_t *= slope[t];
      multiply_into(buf.data(), slope.data(), V);
    }
    store_row(buf.data(), scale, grad_row, V);
    grad_row[t] = static_cast<T>(grad_t);
  }
}

// The targets that count (not the ignore index); throws on one outside [0, V).
int64_t counted_targets(const int64_t* target, int64_t N, int64_t V) {
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (target[i] == kIgnoreIndex) continue;
    if (target[i] < 0 || target[i] >= V)
      throw std::invalid_argument(fmt::format("[model] cross_entropy: target {} at row {} is outside [0, {}) "
                                              "(and is not the ignore index {})", target[i], i, V, kIgnoreIndex));
    ++count;
  }
  return count;
}

// The mean of the rows' losses, summed in row order (the same for any thread count); NaN for none.
double mean_loss(const std::vector<float>& row_loss, int64_t count) {
  double total = 0.0;
  for (float l : row_loss) total += l;
  return count > 0 ? total / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
}

// What one pass gives: the mean loss (fp32 scalar); with_grad, d(loss)/d(logits) (N, V) in the
// logits' dtype; with a cap, the capped logits (N, V) in the logits' dtype.
struct FusedLoss {
  torch::Tensor loss, grad, capped;
};

FusedLoss fused_forward(const torch::Tensor& logits_in, const torch::Tensor& targets_in, bool with_grad,
                        double softcap) {
  RECORD_FUNCTION("nanogpt::cross_entropy", std::vector<c10::IValue>());  // a row in bench --profile
  const auto logits = logits_in.contiguous();
  const auto targets = targets_in.contiguous();
  const int64_t N = logits.size(0), V = logits.size(1);
  const int64_t* target = targets.data_ptr<int64_t>();
  const int64_t count = counted_targets(target, N, V);
  const float inv_count = count > 0 ? 1.0f / static_cast<float>(count) : std::numeric_limits<float>::quiet_NaN();
  std::vector<float> row_loss(static_cast<size_t>(N));
  torch::Tensor grad = with_grad ? torch::empty_like(logits) : torch::Tensor();
  const float cap = static_cast<float>(softcap);
  torch::Tensor capped = cap > 0.0f ? torch::empty_like(logits) : torch::Tensor();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1));  // ~32k logits per task
  const auto run = [&](auto* tag) {  // tag: the logits' element type (fused_cross_entropy_applies' three)
    using scalar_t = std::remove_pointer_t<decltype(tag)>;
    const scalar_t* x = logits.data_ptr<scalar_t>();
    scalar_t* g = with_grad ? grad.data_ptr<scalar_t>() : nullptr;
    scalar_t* z = cap > 0.0f ? capped.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
      loss_rows<scalar_t>(x, target, V, inv_count, cap, begin, end, row_loss.data(), g, z);
    });
  };
  if (logits.scalar_type() == torch::kFloat)
    run(static_cast<float*>(nullptr));
  else if (logits.scalar_type() == torch::kBFloat16)
    run(static_cast<c10::BFloat16*>(nullptr));
  else
    run(static_cast<c10::Half*>(nullptr));
  return {torch::full({}, mean_loss(row_loss, count), logits.options().dtype(torch::kFloat)), grad, capped};
}

// A gradient made in the forward pass times the loss's incoming gradient (a scalar). loss.backward()
// (one micro-batch per step) sends exactly 1: then no pass over the gradient.
torch::Tensor scaled(const torch::Tensor& grad, const torch::Tensor& upstream) {
  const bool one = upstream.device().is_cpu() && upstream.numel() == 1 && upstream.item<double>() == 1.0;
  return one ? grad : grad * upstream;
}

// Autograd node: the gradient is made in the forward pass, backward scales it.
// With a cap, the capped logits come back as a second output without a gradient of their own.
struct FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                                                const torch::Tensor& targets, double softcap) {
    auto out = fused_forward(logits, targets, true, softcap);
    ctx->saved_data["grad"] = out.grad;
    if (!out.capped.defined()) return {out.loss};
    ctx->mark_non_differentiable({out.capped});
    return {out.loss, out.capped};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto grad = ctx->saved_data["grad"].toTensor();  // (N, V)
    return {scaled(grad, grad_outputs[0]), torch::Tensor(), torch::Tensor()};
  }
};

// The head's loss by chunks of rows (head_cross_entropy): the mean loss, and its gradients w.r.t.
// x (N, C) and w (V, C), fp32.
struct HeadLoss {
  torch::Tensor loss, dx, dw;
};

HeadLoss head_forward(const torch::Tensor& x_in, const torch::Tensor& w_in, const torch::Tensor& targets_in,
                      double softcap) {
  RECORD_FUNCTION("nanogpt::head_cross_entropy", std::vector<c10::IValue>());  // the loss rows, in bench --profile
  const auto x = x_in.contiguous(), w = w_in.contiguous(), targets = targets_in.contiguous();
  const int64_t N = x.size(0), V = w.size(0);
  const int64_t* target = targets.data_ptr<int64_t>();
  const int64_t count = counted_targets(target, N, V);
  const float inv_count = count > 0 ? 1.0f / static_cast<float>(count) : std::numeric_limits<float>::quiet_NaN();
  // ~2M logits a chunk (8 MB): in the last-level cache while the loss pass and both products read it.
  const int64_t rows = std::min<int64_t>(N, std::max<int64_t>(64, (int64_t{1} << 21) / std::max<int64_t>(V, 1)));
  auto chunk = torch::empty({rows, V}, x.options());  // a chunk's logits, then (in place) their gradient
  auto dx = torch::empty_like(x);
  auto dw = torch::zeros_like(w);
  std::vector<float> row_loss(static_cast<size_t>(N));
  const float cap = static_cast<float>(softcap);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1));
  const auto wt = w.t();
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t r = std::min(rows, N - r0);
    auto logits = chunk.narrow(0, 0, r);
    const auto xc = x.narrow(0, r0, r);
    torch::mm_out(logits, xc, wt);  // (r, V)
    float* g = logits.data_ptr<float>();
    at::parallel_for(0, r, grain, [&](int64_t begin, int64_t end) {
      loss_rows<float>(g, target + r0, V, inv_count, cap, begin, end, row_loss.data() + r0, g, nullptr);
    });
    auto dxc = dx.narrow(0, r0, r);
    torch::mm_out(dxc, logits, w);  // (r, C)
    dw.addmm_(logits.t(), xc);      // (V, C)
  }
  return {torch::full({}, mean_loss(row_loss, count), x.options()), dx, dw};
}

// Autograd node: the gradients are made in the forward pass, backward scales them.
struct HeadCrossEntropy : public torch::autograd::Function<HeadCrossEntropy> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& targets, double softcap) {
    auto out = head_forward(x, w, targets, softcap);
    ctx->saved_data["dx"] = out.dx;
    ctx->saved_data["dw"] = out.dw;
    return out.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    return {scaled(ctx->saved_data["dx"].toTensor(), grad_outputs[0]),
            scaled(ctx->saved_data["dw"].toTensor(), grad_outputs[0]), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool head_cross_entropy_applies(const torch::Tensor& x, const torch::Tensor& w) {
  return x.device().is_cpu() && w.device().is_cpu() && x.scalar_type() == torch::kFloat &&
         w.scalar_type() == torch::kFloat && x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && w.size(0) >= 1;
}

torch::Tensor head_cross_entropy(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& targets,
                                 double softcap) {
  if (!head_cross_entropy_applies(x, w))
    throw std::invalid_argument(fmt::format("[model] head_cross_entropy wants fp32 x (N, C) and w (V, C) on the CPU, "
                                            "got {} {} and {} {}", c10::toString(x.scalar_type()), c10::str(x.sizes()),
                                            c10::toString(w.scalar_type()), c10::str(w.sizes())));
  if (targets.dim() != 1 || targets.size(0) != x.size(0) || targets.scalar_type() != torch::kLong)
    throw std::invalid_argument(fmt::format("[model] head_cross_entropy wants int64 targets ({},), got {} {}", x.size(0),
                                            c10::toString(targets.scalar_type()), c10::str(targets.sizes())));
  if (softcap < 0.0 || !std::isfinite(softcap))
    throw std::invalid_argument(fmt::format("[model] head_cross_entropy: the cap must be >= 0 (0: none), got {}", softcap));
  if (torch::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad()))
    return HeadCrossEntropy::apply(x, w, targets, softcap);
  return head_forward(x, w, targets, softcap).loss;
}

bool fused_cross_entropy_applies(const torch::Tensor& logits) {
  const auto dtype = logits.scalar_type();
  return logits.device().is_cpu() && logits.layout() == torch::kStrided &&
         (dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf);
}

namespace {

void check_loss_inputs(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0) || logits.size(1) < 1)
    throw std::invalid_argument(fmt::format("[model] cross_entropy wants logits (N, V) and targets (N,), got {} and {}",
                                            c10::str(logits.sizes()), c10::str(targets.sizes())));
  if (targets.scalar_type() != torch::kLong)
    throw std::invalid_argument(fmt::format("[model] cross_entropy: targets must be int64, got {}",
                                            c10::toString(targets.scalar_type())));
}

}  // namespace

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  check_loss_inputs(logits, targets);
  if (!fused_cross_entropy_applies(logits) || !targets.device().is_cpu())
    return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), targets);  // fp32 loss, as on the CPU
  if (torch::GradMode::is_enabled() && logits.requires_grad()) return FusedCrossEntropy::apply(logits, targets, 0.0)[0];
  return fused_forward(logits, targets, false, 0.0).loss;
}

std::pair<torch::Tensor, torch::Tensor> softcapped_cross_entropy(const torch::Tensor& logits,
                                                                 const torch::Tensor& targets, double softcap) {
  check_loss_inputs(logits, targets);
  if (!(softcap > 0.0) || !std::isfinite(softcap))
    throw std::invalid_argument(fmt::format("[model] softcapped_cross_entropy: the cap must be > 0, got {}", softcap));
  if (!fused_cross_entropy_applies(logits) || !targets.device().is_cpu()) {
    auto capped = torch::tanh(logits / softcap) * softcap;
    return {cross_entropy(capped, targets), capped};
  }
  if (torch::GradMode::is_enabled() && logits.requires_grad()) {
    auto out = FusedCrossEntropy::apply(logits, targets, softcap);
    return {out[0], out[1]};
  }
  auto out = fused_forward(logits, targets, false, softcap);
  return {out.loss, out.capped};
}

}  // namespace nanogpt::model
