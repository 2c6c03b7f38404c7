// Chunked, recomputing causal attention (see chunked_attention.h).
#include "model/fast/chunked_attention.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cmath>

#include "model/fast/causal_softmax.h"
#include "model/fast/dropout.h"

namespace nanogpt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One chunk's attention weights in q's dtype: the causal softmax of q kᵀ / √hs, and the same after
// dropout, what multiplies v.
struct ChunkWeights {
  torch::Tensor weights;  // (g, T, T)
  torch::Tensor dropped;  // (g, T, T)
};

torch::Tensor drop(const torch::Tensor& w, double p, uint64_t seed, int64_t offset) {
  return p > 0 ? apply_dropout_mask(w, p, seed, offset, w.scalar_type()) : w;
}

ChunkWeights chunk_weights(const torch::Tensor& q, const torch::Tensor& k, double scale, double p, uint64_t seed,
                           int64_t offset) {
  auto weights = causal_softmax(at::bmm(q, k.transpose(1, 2)), scale);  // (g, T, T): scores, then weights
  return {weights, drop(weights, p, seed, offset)};
}

struct ChunkedAttention : public torch::autograd::Function<ChunkedAttention> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double p, int64_t chunk) {
    // The dtypes are the caller's: autocast would otherwise recast inside, and backward runs outside it.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t B = q.size(0), nh = q.size(1), T = q.size(2), hs = q.size(3), N = B * nh;
    auto q3 = q.reshape({N, T, hs}).contiguous();  // (N, T, hs)
    auto k3 = k.reshape({N, T, hs}).contiguous();  // (N, T, hs)
    auto v3 = v.reshape({N, T, hs}).contiguous();  // (N, T, hs)
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    const uint64_t seed = p > 0 ? draw_dropout_seed() : 0;
    auto y = torch::empty({N, T, hs}, v3.options());  // (N, T, hs)
    torch::Tensor kept;  // one chunk: its weights, kept for backward instead of recomputed
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
      const int64_t g = std::min(chunk, N - n0);
      auto w = chunk_weights(q3.narrow(0, n0, g), k3.narrow(0, n0, g), scale, p, seed, n0 * T * T);
      auto y_chunk = y.narrow(0, n0, g);
      at::bmm_out(y_chunk, w.dropped, v3.narrow(0, n0, g));  // (g, T, hs)
      if (g == N) kept = w.weights;
    }
    ctx->save_for_backward({q3, k3, v3, kept});
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["B"] = B;
    return y.view({B, nh, T, hs});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const auto &q3 = saved[0], &k3 = saved[1], &v3 = saved[2], &kept = saved[3];
    const double p = ctx->saved_data["p"].toDouble();
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), B = ctx->saved_data["B"].toInt();
    const int64_t N = q3.size(0), T = q3.size(1), hs = q3.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    auto dy = grads[0].reshape({N, T, hs}).to(v3.scalar_type()).contiguous();  // (N, T, hs)
    auto dq = torch::empty_like(q3), dk = torch::empty_like(k3), dv = torch::empty_like(v3);
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
      const int64_t g = std::min(chunk, N - n0), offset = n0 * T * T;
      auto q_c = q3.narrow(0, n0, g), k_c = k3.narrow(0, n0, g), v_c = v3.narrow(0, n0, g), dy_c = dy.narrow(0, n0, g);
      auto w = kept.defined() ? ChunkWeights{kept, drop(kept, p, seed, offset)}
                              : chunk_weights(q_c, k_c, scale, p, seed, offset);  // recomputed, never stored
      auto dv_c = dv.narrow(0, n0, g);
      at::bmm_out(dv_c, w.dropped.transpose(1, 2), dy_c);                               // (g, T, hs) = dropped ᵀ dy
      auto d_weights = drop(at::bmm(dy_c, v_c.transpose(1, 2)), p, seed, offset);       // (g, T, T), through the mask
      auto d_scores = causal_softmax_backward(d_weights, w.weights, scale);             // (g, T, T), scale included
      auto dq_c = dq.narrow(0, n0, g), dk_c = dk.narrow(0, n0, g);
      at::bmm_out(dq_c, d_scores, k_c);                  // (g, T, hs)
      at::bmm_out(dk_c, d_scores.transpose(1, 2), q_c);  // (g, T, hs)
    }
    const int64_t nh = N / B;
    return {dq.view({B, nh, T, hs}), dk.view({B, nh, T, hs}), dv.view({B, nh, T, hs}), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

int64_t attention_chunk_pairs(int64_t T, int64_t Tk) {
  constexpr int64_t kScoresPerChunk = 256 * 1024;  // 64K-1M measured alike at the full preset; 1 pair (64K) was slower
  return std::max<int64_t>(1, kScoresPerChunk / std::max<int64_t>(1, T * Tk));
}

torch::Tensor chunked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                double dropout_p, int64_t chunk_pairs) {
  TORCH_CHECK(chunk_pairs >= 1, "chunked_attention: chunk_pairs must be >= 1, got ", chunk_pairs);
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "chunked_attention: q, k and v must share a dtype");
  TORCH_CHECK(q.sizes() == k.sizes() && k.sizes() == v.sizes(), "chunked_attention: q, k and v must be (B, nh, T, hs) each");
  return ChunkedAttention::apply(q, k, v, dropout_p, chunk_pairs);
}

}  // namespace nanogpt::model
