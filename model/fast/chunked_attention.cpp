// Chunked, recomputing causal attention (see chunked_attention.h).
#include "model/fast/chunked_attention.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cmath>

#include "model/fast/dropout.h"

namespace nanogpt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One chunk's attention weights: fp32 softmax rows, and the same after dropout in the values' dtype.
struct ChunkWeights {
  torch::Tensor probs;    // (g, T, Tk) fp32
  torch::Tensor dropped;  // (g, T, Tk) dtype, what multiplies v
};

ChunkWeights chunk_weights(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& bias, double scale,
                           double p, uint64_t seed, int64_t offset) {
  auto scores = at::baddbmm(bias, q, k.transpose(1, 2), /*beta=*/1.0, /*alpha=*/scale);  // (g, T, Tk)
  auto probs = at::softmax(scores, -1, torch::kFloat);                                     // (g, T, Tk) fp32
  auto dropped = p > 0 ? apply_dropout_mask(probs, p, seed, offset, q.scalar_type()) : probs.to(q.scalar_type());
  return {probs, dropped};
}

struct ChunkedAttention : public torch::autograd::Function<ChunkedAttention> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& bias, double p, int64_t chunk) {
    // The dtypes are the caller's: autocast would otherwise recast inside, and backward runs outside it.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t B = q.size(0), nh = q.size(1), T = q.size(2), hs = q.size(3), N = B * nh, Tk = k.size(2);
    auto q3 = q.reshape({N, T, hs}).contiguous();   // (N, T, hs)
    auto k3 = k.reshape({N, Tk, hs}).contiguous();  // (N, Tk, hs)
    auto v3 = v.reshape({N, Tk, hs}).contiguous();  // (N, Tk, hs)
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    const uint64_t seed = p > 0 ? draw_dropout_seed() : 0;
    auto y = torch::empty({N, T, hs}, v3.options());  // (N, T, hs)
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
      const int64_t g = std::min(chunk, N - n0);
      auto w = chunk_weights(q3.narrow(0, n0, g), k3.narrow(0, n0, g), bias, scale, p, seed, n0 * T * Tk);
      auto y_chunk = y.narrow(0, n0, g);
      at::bmm_out(y_chunk, w.dropped, v3.narrow(0, n0, g));  // (g, T, hs)
    }
    ctx->save_for_backward({q3, k3, v3, bias});
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["B"] = B;
    return y.view({B, nh, T, hs});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const auto &q3 = saved[0], &k3 = saved[1], &v3 = saved[2], &bias = saved[3];
    const double p = ctx->saved_data["p"].toDouble();
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), B = ctx->saved_data["B"].toInt();
    const int64_t N = q3.size(0), T = q3.size(1), hs = q3.size(2), Tk = k3.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    auto dy = grads[0].reshape({N, T, hs}).to(v3.scalar_type()).contiguous();  // (N, T, hs)
    auto dq = torch::empty_like(q3), dk = torch::empty_like(k3), dv = torch::empty_like(v3);
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
      const int64_t g = std::min(chunk, N - n0);
      auto q_c = q3.narrow(0, n0, g), k_c = k3.narrow(0, n0, g), v_c = v3.narrow(0, n0, g), dy_c = dy.narrow(0, n0, g);
      auto w = chunk_weights(q_c, k_c, bias, scale, p, seed, n0 * T * Tk);  // recomputed, never stored
      auto dv_c = dv.narrow(0, n0, g);
      at::bmm_out(dv_c, w.dropped.transpose(1, 2), dy_c);         // (g, Tk, hs) = dropped ᵀ dy
      auto d_dropped = at::bmm(dy_c, v_c.transpose(1, 2));         // (g, T, Tk) = dy vᵀ
      auto d_probs = p > 0 ? apply_dropout_mask(d_dropped, p, seed, n0 * T * Tk, torch::kFloat)
                           : d_dropped.to(torch::kFloat);         // through the same mask
      auto d_scores = at::_softmax_backward_data(d_probs, w.probs, -1, q3.scalar_type())
                          .to(q3.scalar_type());  // (g, T, Tk); fp32 from the CPU kernel whatever input_dtype says
      auto dq_c = dq.narrow(0, n0, g), dk_c = dk.narrow(0, n0, g);
      // beta 0: the uninitialised outputs are ignored, not read.
      at::baddbmm_out(dq_c, dq_c, d_scores, k_c, /*beta=*/0.0, /*alpha=*/scale);                  // (g, T, hs)
      at::baddbmm_out(dk_c, dk_c, d_scores.transpose(1, 2), q_c, /*beta=*/0.0, /*alpha=*/scale);  // (g, Tk, hs)
    }
    const int64_t nh = N / B;
    return {dq.view({B, nh, T, hs}), dk.view({B, nh, Tk, hs}), dv.view({B, nh, Tk, hs}),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t attention_chunk_pairs(int64_t T, int64_t Tk) {
  constexpr int64_t kScoresPerChunk = 256 * 1024;  // 64K-1M measured alike at the full preset; 1 pair (64K) was slower
  return std::max<int64_t>(1, kScoresPerChunk / std::max<int64_t>(1, T * Tk));
}

torch::Tensor chunked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& bias, double dropout_p, int64_t chunk_pairs) {
  TORCH_CHECK(chunk_pairs >= 1, "chunked_attention: chunk_pairs must be >= 1, got ", chunk_pairs);
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "chunked_attention: q, k and v must share a dtype");
  return ChunkedAttention::apply(q, k, v, bias.to(q.scalar_type()), dropout_p, chunk_pairs);
}

}  // namespace nanogpt::model
