// Fused CPU RoPE rotation (see rope.h). Legend: B batch, T positions, H heads, hs head size,
// h = hs / 2; tables cos2 = [cos, cos], sin2 = [-sin, sin] per position.
#include "model/fast/rope.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>


namespace nanogpt::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The H head rows of one position: in + head * in_h -> out + head * out_h. Compiled for each
// instruction set (simd.h) per direction and dtype.
#define NANOGPT_ROPE_HEADS(name, backward, T)                                                                     \
  NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, name, (const T* in, int64_t in_h, T* out, int64_t out_h, const float* c, \
                 const float* s, int64_t H, int64_t h), (in, in_h, out, out_h, c, s, H, h), {                        \
    for (int64_t head = 0; head < H; ++head) rope_rotate_row<backward>(in + head * in_h, out + head * out_h, c, s, h); \
  })
NANOGPT_ROPE_HEADS(forward_f32, false, float)
NANOGPT_ROPE_HEADS(backward_f32, true, float)
NANOGPT_ROPE_HEADS(forward_bf16, false, uint16_t)
NANOGPT_ROPE_HEADS(backward_bf16, true, uint16_t)
#undef NANOGPT_ROPE_HEADS

void heads(bool backward, const float* in, int64_t in_h, float* out, int64_t out_h, const float* c, const float* s,
           int64_t H, int64_t h) {
  (backward ? backward_f32 : forward_f32)(in, in_h, out, out_h, c, s, H, h);
}
void heads(bool backward, const uint16_t* in, int64_t in_h, uint16_t* out, int64_t out_h, const float* c,
           const float* s, int64_t H, int64_t h) {
  (backward ? backward_bf16 : forward_bf16)(in, in_h, out, out_h, c, s, H, h);
}

// Every (b, t) position: its heads at in + b * in_b + t * in_t (+ head * in_h), out likewise (strides
// in elements); the tables' row for position start + t.
template <class T>
void rotate_all(bool backward, const T* in, int64_t in_b, int64_t in_t, int64_t in_h, T* out, int64_t out_b,
                int64_t out_t, int64_t out_h, const float* cos2, const float* sin2, int64_t B, int64_t Tn, int64_t H,
                int64_t hs, int64_t start) {
  at::parallel_for(0, B * Tn, std::max<int64_t>(1, 16384 / (H * hs)), [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / Tn, t = bt % Tn;
      heads(backward, in + b * in_b + t * in_t, in_h, out + b * out_b + t * out_t, out_h, cos2 + (start + t) * hs,
            sin2 + (start + t) * hs, H, hs / 2);
    }
  });
}

// in -> out, both (B, T, H, hs) views with packed heads (any B, T and head strides), fp32 or bf16 (as
// raw 16-bit words).
void rotate(bool backward, const torch::Tensor& in, const torch::Tensor& out, const torch::Tensor& cos2,
            const torch::Tensor& sin2, int64_t start) {
  const int64_t B = in.size(0), Tn = in.size(1), H = in.size(2), hs = in.size(3);
  if (in.numel() == 0) return;
  const auto args = [&](auto* in_ptr, auto* out_ptr) {
    rotate_all(backward, in_ptr, in.stride(0), in.stride(1), in.stride(2), out_ptr, out.stride(0), out.stride(1),
               out.stride(2), cos2.data_ptr<float>(), sin2.data_ptr<float>(), B, Tn, H, hs, start);
  };
  if (in.scalar_type() == torch::kFloat) args(in.data_ptr<float>(), out.data_ptr<float>());
  else args(bits(in.data_ptr<c10::BFloat16>()), bits(out.data_ptr<c10::BFloat16>()));
}

// A (B, T, H, hs) tensor whose rows of hs values are packed: what rotate_all walks.
bool rows_packed(const torch::Tensor& x) { return x.dim() == 4 && x.stride(3) == 1; }

struct RopeRotate : public torch::autograd::Function<RopeRotate> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos2,
                               const torch::Tensor& sin2, int64_t start, int64_t n_first) {
    const int64_t B = x.size(0), Tn = x.size(1), H = x.size(2), hs = x.size(3);
    auto first = torch::empty({B, n_first, Tn, hs}, x.options());       // (B, n_first, T, hs)
    auto second = torch::empty({B, H - n_first, Tn, hs}, x.options());  // (B, H - n_first, T, hs)
    rotate(false, x.narrow(2, 0, n_first), first.transpose(1, 2), cos2, sin2, start);
    rotate(false, x.narrow(2, n_first, H - n_first), second.transpose(1, 2), cos2, sin2, start);
    ctx->save_for_backward({cos2, sin2});  // table rows, not activations
    ctx->saved_data["start"] = start;
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["heads"] = H;
    ctx->saved_data["n_first"] = n_first;
    return {first, second};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t start = ctx->saved_data["start"].toInt();
    const auto& ref = grads[0].defined() ? grads[0] : grads[1];
    const int64_t B = ref.size(0), Tn = ref.size(2), hs = ref.size(3);
    const int64_t H = ctx->saved_data["heads"].toInt(), split = ctx->saved_data["n_first"].toInt();
    // A missing gradient (an output that reached no loss) is zero: its heads of dx stay zero.
    const auto options = ref.options().dtype(dtype);
    auto dx = grads[0].defined() && grads[1].defined() ? torch::empty({B, Tn, H, hs}, options)
                                                        : torch::zeros({B, Tn, H, hs}, options);  // (B, T, H, hs)
    for (int part = 0; part < 2; ++part) {
      if (!grads[part].defined()) continue;
      auto dy = grads[part].to(dtype).transpose(1, 2);  // (B, T, heads, hs)
      if (!rows_packed(dy)) dy = dy.contiguous();
      rotate(true, dy, part == 0 ? dx.narrow(2, 0, split) : dx.narrow(2, split, H - split), saved[0], saved[1], start);
    }
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool rope_rotate_applies(const torch::Tensor& x) {
  return x.device().is_cpu() && (x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16) &&
         x.layout() == torch::kStrided && rows_packed(x) && x.size(3) % 2 == 0;
}

std::pair<torch::Tensor, torch::Tensor> rope_rotate_split(const torch::Tensor& x, const torch::Tensor& cos2,
                                                          const torch::Tensor& sin2, int64_t start, int64_t n_first) {
  if (!rope_rotate_applies(x))
    throw std::invalid_argument("[model] rope_rotate_split needs a CPU fp32/bf16 (B, T, H, hs) tensor with packed rows");
  if (n_first < 0 || n_first > x.size(2))
    throw std::invalid_argument(fmt::format("[model] rope_rotate_split: {} first heads of {}", n_first, x.size(2)));
  if (cos2.scalar_type() != torch::kFloat || !cos2.is_contiguous() || !sin2.is_contiguous() ||
      cos2.size(-1) != x.size(3) || cos2.size(0) < start + x.size(1))
    throw std::invalid_argument(fmt::format("[model] rope_rotate_split: tables of {} positions x {} for positions {}..{} x {}",
                                            cos2.size(0), cos2.size(-1), start, start + x.size(1) - 1, x.size(3)));
  auto out = RopeRotate::apply(x, cos2, sin2, start, n_first);
  return {out[0], out[1]};
}

}  // namespace nanogpt::model
