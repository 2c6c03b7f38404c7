// The residual add + dropout + norm as an autograd Function over the CUDA kernels (see
// residual_norm_kernel.h), on the current stream of x's device; on CPU tensors the same per-element
// lines in a host loop. Legend as residual_norm_kernel_math.h.
#include "model/cuda/residual_norm_kernel.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/cuda/residual_norm_kernel_math.h"

namespace nanogpt::model::cuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Calls f with a value of y's element type: float, c10::BFloat16 or c10::Half.
template <class F>
void with_branch_type(c10::ScalarType dtype, F&& f) {
  if (dtype == torch::kFloat) return f(float{});
  if (dtype == torch::kBFloat16) return f(c10::BFloat16{});
  if (dtype == torch::kHalf) return f(c10::Half{});
  throw std::logic_error(std::string("[model] the residual norm kernel has no ") + c10::toString(dtype) + " form");
}

template <class T>
Rows<T> rows_of(const torch::Tensor& t) {
  return {t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr};
}

template <class T>
const float* floats_or_null(const T& t) {
  return t.defined() ? t.template data_ptr<float>() : nullptr;
}

DropoutStream stream_of(const torch::Tensor& rng_state, double p) {
  if (!rng_state.defined()) return {nullptr, 0, 1.0f};
  return {rng_state.data_ptr<int64_t>(), dropout_threshold(p), static_cast<float>(1.0 / (1.0 - p))};
}

// The forward over rows 0 .. N - 1 on the host: the kernel's lines, one row at a time.
template <class Y>
void forward_on_host(const ResidualNormForward<Y>& t, DropoutStream d, int64_t N, int64_t C) {
  const uint64_t seed = d.rng ? static_cast<uint64_t>(d.rng[0]) : 0, offset = d.rng ? static_cast<uint64_t>(d.rng[1]) : 0;
  for (int64_t row = 0; row < N; ++row) {
    const float* x = t.x.row(row, C);
    const Y* y = t.y.row(row, C);
    float* h = t.h.row(row, C);
    float sum = 0.0f;
    for (int64_t col = 0; col < C; col += 4) {
      const Keep4 kept = kept_of(d, seed, offset, static_cast<uint64_t>(row * C + col) / 4);
      for (int v = 0; v < 4; ++v) {
        h[col + v] = residual_sum(x[col + v], static_cast<float>(y[col + v]), kept.v[v], d.scale);
        sum += h[col + v];
      }
    }
    if (!t.weight) continue;
    const float mean = t.rms ? 0.0f : sum / C;
    float square = 0.0f;
    for (int64_t col = 0; col < C; ++col) square += (h[col] - mean) * (h[col] - mean);
    const float rstd = inverse_std(square / C, t.eps);
    float* n = t.n.row(row, C);
    for (int64_t col = 0; col < C; ++col)
      n[col] = normalised(h[col], mean, rstd, t.weight[col], t.bias ? t.bias[col] : 0.0f);
    t.mean[row] = mean;
    t.rstd[row] = rstd;
  }
}

// The backward on the host: one "block", so dw_db is (1, 2, C).
template <class Y>
void backward_on_host(const ResidualNormBackward<Y>& t, DropoutStream d, int64_t N, int64_t C) {
  const uint64_t seed = d.rng ? static_cast<uint64_t>(d.rng[0]) : 0, offset = d.rng ? static_cast<uint64_t>(d.rng[1]) : 0;
  std::vector<float> dh(C), hhat(C), grad(C);
  if (t.weight) std::fill(t.dw_db, t.dw_db + 2 * C, 0.0f);
  for (int64_t row = 0; row < N; ++row) {
    const float* dh_out = t.dh_out.row(row, C);
    const float* dn = t.dn.row(row, C);
    for (int64_t col = 0; col < C; ++col) dh[col] = dh_out ? dh_out[col] : 0.0f;
    if (t.weight) {
      const float* h = t.h.row(row, C);
      float sum_g = 0.0f, sum_gh = 0.0f;
      for (int64_t col = 0; col < C; ++col) {
        const float dnv = dn ? dn[col] : 0.0f;
        hhat[col] = (h[col] - t.mean[row]) * t.rstd[row];
        grad[col] = dnv * t.weight[col];
        sum_g += grad[col];
        sum_gh += grad[col] * hhat[col];
        t.dw_db[col] += dnv * hhat[col];
        t.dw_db[C + col] += dnv;
      }
      const float mean_g = t.rms ? 0.0f : sum_g / C, mean_gh = sum_gh / C;
      for (int64_t col = 0; col < C; ++col)
        dh[col] = normalised_grad(dh[col], grad[col], hhat[col], t.rstd[row], mean_g, mean_gh);
    }
    float* dx = t.dx.row(row, C);
    Y* dy = t.dy.row(row, C);
    for (int64_t col = 0; col < C; col += 4) {
      const Keep4 kept = kept_of(d, seed, offset, static_cast<uint64_t>(row * C + col) / 4);
      for (int v = 0; v < 4; ++v) {
        dx[col + v] = dh[col + v];
        dy[col + v] = static_cast<Y>(kept.v[v] ? dh[col + v] * d.scale : 0.0f);
      }
    }
  }
}

struct ResidualDropoutNorm : public torch::autograd::Function<ResidualDropoutNorm> {
  // rng, weight and bias as optionals: autograd takes an undefined tensor argument for a variable.
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& y_in, double p,
                               const std::optional<torch::Tensor>& rng_given,
                               const std::optional<torch::Tensor>& weight_given,
                               const std::optional<torch::Tensor>& bias_given, double eps, bool rms) {
    const auto rng = rng_given.value_or(torch::Tensor()), weight = weight_given.value_or(torch::Tensor()),
               bias = bias_given.value_or(torch::Tensor());
    const auto x = x_in.contiguous(), y = y_in.contiguous();
    const int64_t C = x.size(-1), N = x.numel() / C;
    const bool norm = weight.defined(), cuda = x.is_cuda();
    auto h = torch::empty_like(x);
    auto n = norm ? torch::empty_like(x) : torch::Tensor();
    const auto stats = x.options().dtype(torch::kFloat);
    auto mean = norm ? torch::empty({N}, stats) : torch::Tensor(), rstd = norm ? torch::empty({N}, stats) : torch::Tensor();
    // {seed, offset} of this call's mask, where the backward reads them: on the GPU written by the
    // forward kernel as it runs (under a CUDA graph the generator's values at that replay).
    auto rng_state = p > 0 ? torch::empty({2}, x.options().dtype(torch::kLong)) : torch::Tensor();
    at::PhiloxCudaState philox;
    if (p > 0 && rng.defined()) {
      const auto given = rng.to(torch::kCPU, torch::kLong).contiguous();
      philox = at::PhiloxCudaState(static_cast<uint64_t>(given.data_ptr<int64_t>()[0]),
                                   static_cast<uint64_t>(given.data_ptr<int64_t>()[1]));
      if (!cuda) rng_state.copy_(given);
    } else if (p > 0) {
      if (!cuda) throw std::invalid_argument("[model] residual norm kernel: dropout on the host needs a {seed, offset}");
      auto gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
          std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(x.device().index()));
      std::lock_guard<std::mutex> lock(gen->mutex_);
      philox = gen->philox_cuda_state(4);  // the counter's other half is the element's word: 4 is plenty
    }
    with_branch_type(y.scalar_type(), [&](auto element) {
      using Y = decltype(element);
      const ResidualNormForward<Y> t{rows_of<const float>(x), rows_of<const Y>(y), floats_or_null(weight),
                                     floats_or_null(bias),    rows_of<float>(h),    rows_of<float>(n),
                                     norm ? mean.data_ptr<float>() : nullptr,
                                     norm ? rstd.data_ptr<float>() : nullptr,
                                     static_cast<float>(eps), rms};
      const DropoutStream d = stream_of(rng_state, p);
      if (cuda) {
        c10::cuda::CUDAGuard on_device(x.device());
        launch_residual_norm_forward(t, philox, d, N, C, at::cuda::getCurrentCUDAStream(x.device().index()).stream());
      } else {
        forward_on_host(t, d, N, C);
      }
    });
    ctx->save_for_backward({h, mean, rstd, weight, rng_state});
    ctx->saved_data["p"] = p;
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["bias"] = bias.defined();
    ctx->saved_data["y_dtype"] = static_cast<int64_t>(y.scalar_type());
    ctx->set_materialize_grads(false);  // a gradient that never arrived is read as zeros, not made
    if (!norm) return {h};
    return {h, n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &mean = saved[1], &rstd = saved[2], &weight = saved[3], &rng_state = saved[4];
    const double p = ctx->saved_data["p"].toDouble();
    const bool rms = ctx->saved_data["rms"].toBool(), has_bias = ctx->saved_data["bias"].toBool();
    const auto y_dtype = static_cast<c10::ScalarType>(ctx->saved_data["y_dtype"].toInt());
    const bool norm = weight.defined(), cuda = h.is_cuda();
    const auto packed = [&](size_t i) {
      return i < grads.size() && grads[i].defined() ? grads[i].to(torch::kFloat).contiguous() : torch::Tensor();
    };
    const auto dh_out = packed(0), dn = norm ? packed(1) : torch::Tensor();
    const int64_t C = h.size(-1), N = h.numel() / C;
    int64_t blocks = 1;
    if (cuda) {
      const auto* props = at::cuda::getDeviceProperties(h.device().index());
      blocks = std::max<int64_t>(1, std::min<int64_t>((N + 7) / 8, 2 * props->multiProcessorCount));
    }
    auto dx = torch::empty_like(h), dy = torch::empty(h.sizes(), h.options().dtype(y_dtype));
    auto dw_db = norm ? torch::empty({blocks, 2, C}, h.options()) : torch::Tensor();
    with_branch_type(y_dtype, [&](auto element) {
      using Y = decltype(element);
      const ResidualNormBackward<Y> t{rows_of<const float>(dh_out), rows_of<const float>(dn), rows_of<const float>(h),
                                      floats_or_null(mean), floats_or_null(rstd), floats_or_null(weight),
                                      rows_of<float>(dx), rows_of<Y>(dy),
                                      norm ? dw_db.data_ptr<float>() : nullptr, rms};
      const DropoutStream d = stream_of(rng_state, p);
      if (cuda) {
        c10::cuda::CUDAGuard on_device(h.device());
        launch_residual_norm_backward(t, d, N, C, blocks, at::cuda::getCurrentCUDAStream(h.device().index()).stream());
      } else {
        backward_on_host(t, d, N, C);
      }
    });
    torch::Tensor dw, db;
    if (norm) {
      auto sums = dw_db.sum(0);  // (2, C)
      dw = sums[0];
      if (has_bias) db = sums[1];
    }
    return {dx, dy, torch::Tensor(), torch::Tensor(), dw, db, torch::Tensor(), torch::Tensor()};
  }
};

bool takes_branch(c10::ScalarType dtype) {
  return dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> residual_dropout_norm(const at::Tensor& x, const at::Tensor& y, double p,
                                                        const at::Tensor& rng, const at::Tensor& weight,
                                                        const at::Tensor& bias, double eps, bool rms) {
  const auto fp32_vector = [&](const at::Tensor& t) {
    return !t.defined() || (t.scalar_type() == torch::kFloat && t.dim() == 1 && t.size(0) == x.size(-1) &&
                            t.device() == x.device() && t.layout() == torch::kStrided);
  };
  if (x.dim() < 1 || x.layout() != torch::kStrided || y.layout() != torch::kStrided || x.scalar_type() != torch::kFloat ||
      !takes_branch(y.scalar_type()) || x.sizes() != y.sizes() || x.device() != y.device() || x.size(-1) % 4 != 0 ||
      x.size(-1) == 0 || x.size(-1) > kMaxResidualNormC || !fp32_vector(weight) || !fp32_vector(bias) ||
      (bias.defined() && !weight.defined()))
    return {};  // not one it takes: the caller's own path
  if (!(p >= 0 && p < 1))
    throw std::invalid_argument("[model] residual norm kernel: dropout " + std::to_string(p) + " is not in [0, 1)");
  if (rng.defined() && rng.numel() != 2)
    throw std::invalid_argument("[model] residual norm kernel: the dropout's rng is {seed, offset}, got " +
                                std::to_string(rng.numel()) + " values");
  const auto given = [](const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t.contiguous()) : std::optional<at::Tensor>();
  };
  auto out = ResidualDropoutNorm::apply(x, y, p, given(rng), given(weight), given(bias), eps, rms);
  return {out[0], out.size() > 1 ? out[1] : at::Tensor()};
}

}  // namespace nanogpt::model::cuda
