// What training recomputes in backward instead of keeping, against the plain autograd it replaces.
// The causal softmax (model/fast/causal_softmax.h) against LibTorch's softmax of the masked scores,
// forward and backward. Chunked attention (model/fast/chunked_attention.h) against the math it
// chunks: outputs and the gradients of q, k and v, with dropout (the same seed gives the same mask),
// in fp32 and bf16, for chunk sizes that do and do not divide the (batch, head) pairs (and one chunk
// that keeps its weights); and the model's `auto` rule that picks it. The MLP's activation,
// recomputed from c_fc's output (model/mlp.h), against the MLP evaluated with plain autograd. RoPE's rotation, whose backward rotates the gradient back, against
// the rotation written from its definition.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "model/fast/causal_softmax.h"
#include "model/fast/chunked_attention.h"
#include "model/fast/dropout.h"
#include "model/fast/flash_attention.h"
#include "model/gpt.h"
#include "model/mlp.h"
#include "model/positions.h"
#include "runtime/device.h"
#include "tensor_compare.h"

using namespace nanogpt::model;
using nanogpt::testing::relative_error;

namespace {

torch::Tensor causal_bias(int64_t T) {
  return torch::full({T, T}, -std::numeric_limits<float>::infinity()).triu(1);  // (T, T) 0 / -inf
}

// softmax(q kᵀ / √hs + causal) → dropout → · v, the whole tensor at once, through autograd.
torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double p) {
  const int64_t T = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  auto scores = q.matmul(k.transpose(-2, -1)) * scale + causal_bias(T).to(q.scalar_type());  // (B, nh, T, T)
  auto probs = torch::softmax(scores, -1, torch::kFloat);
  return fast_dropout(probs, p, p > 0).to(v.scalar_type()).matmul(v);  // (B, nh, T, hs)
}

}  // namespace

// Forward: every row is LibTorch's fp64 softmax of the scaled scores with keys j > i masked, rounded
// once to the dtype (bf16 and fp16: within one rounding of it, as the fp32 sum may round the other way),
// the masked keys exactly 0 and each row summing to 1. Backward: the gradient autograd takes
// through that fp64 softmax, given the same weights and upstream gradient.
TEST(CausalSoftmax, IsTheMaskedSoftmaxForwardAndBackward) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {  // fp16: the LibTorch-ops path
    for (const int64_t T : {1, 7, 64}) {  // one key; a row shorter than a vector; the presets' T
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " T=" + std::to_string(T));
      torch::manual_seed(T);
      const int64_t g = 5;
      const double scale = 0.3;
      auto scores = (torch::randn({g, T, T}) * 4).to(dtype);
      auto hidden = torch::ones({T, T}, torch::kBool).triu(1);  // (T, T) true where key j > query i
      auto s64 = scores.to(torch::kDouble).requires_grad_();
      auto expected = torch::softmax((s64 * scale).masked_fill(hidden, -INFINITY), -1);  // (g, T, T) fp64
      auto w = causal_softmax(scores, scale);
      ASSERT_EQ(w.scalar_type(), dtype);
      EXPECT_TRUE(torch::all(w.masked_select(hidden.expand({g, T, T})) == 0).item<bool>());
      const double ulp = dtype == torch::kFloat ? 1e-6 : 1.0 / 128;  // relative, per weight
      EXPECT_TRUE(torch::allclose(w.to(torch::kDouble), expected.detach(), ulp, 1e-7));
      EXPECT_LE((w.to(torch::kDouble).sum(-1) - 1).abs().max().item<double>(), dtype == torch::kFloat ? 1e-5 : 2e-2);
      if (T > 1) {  // the scale counts
        EXPECT_FALSE(torch::allclose(w, causal_softmax(scores, 2 * scale), 1e-3, 1e-3));
      }

      auto dw = torch::randn({g, T, T}).to(dtype);
      auto ds = causal_softmax_backward(dw, w, scale);
      ASSERT_EQ(ds.scalar_type(), dtype);
      // Autograd through fp64 softmax evaluated at the weights w hold: d/ds of softmax(scale s) is
      // scale * w (dw - <w, dw>), so the reference uses w itself, not the fp64 weights.
      auto w64 = w.to(torch::kDouble), dw64 = dw.to(torch::kDouble).masked_fill(hidden, 0);
      auto ref = scale * w64 * (dw64 - (w64 * dw64).sum(-1, true));
      auto ref_auto = torch::autograd::grad({expected}, {s64}, {dw.to(torch::kDouble)})[0];
      EXPECT_TRUE(torch::all(ds.masked_select(hidden.expand({g, T, T})) == 0).item<bool>());
      EXPECT_LE(relative_error(ds, ref), dtype == torch::kFloat ? 1e-5 : 1e-2);
      EXPECT_LE(relative_error(ds, ref_auto), dtype == torch::kFloat ? 1e-5 : 3e-2);  // and autograd's own
    }
  }
}

TEST(ChunkedAttention, MatchesTheWholeMathForwardAndBackward) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const double p : {0.0, 0.25}) {
      for (const int64_t chunk : {1, 3, 4, 64}) {  // 12 pairs: one per chunk, a ragged last chunk, even, one chunk
        SCOPED_TRACE(std::string(dtype == torch::kFloat ? "fp32" : "bf16") + " p=" + std::to_string(p) +
                     " chunk=" + std::to_string(chunk));
        torch::manual_seed(1);
        const int64_t B = 3, nh = 4, T = 13, hs = 8;  // T odd: chunks start mid-way through a mask word
        auto make = [&] { return torch::randn({B, nh, T, hs}).to(dtype).requires_grad_(); };
        auto q = make(), k = make(), v = make();
        auto dy = torch::randn({B, nh, T, hs}).to(dtype);
        torch::manual_seed(7);
        auto y_ref = reference(q, k, v, p);
        auto grads_ref = torch::autograd::grad({y_ref}, {q, k, v}, {dy});
        torch::manual_seed(7);
        auto y = chunked_attention(q, k, v, p, chunk);
        auto grads = torch::autograd::grad({y}, {q, k, v}, {dy});
        const double tol = dtype == torch::kFloat ? 1e-5 : 2e-2;
        EXPECT_EQ(y.scalar_type(), dtype);
        EXPECT_LE(relative_error(y, y_ref), tol);
        for (int i = 0; i < 3; ++i) EXPECT_LE(relative_error(grads[i], grads_ref[i]), tol) << "q k v"[2 * i];
      }
    }
  }
}

TEST(ChunkedAttention, AMaskAppliedInPiecesIsTheWholeMask) {
  auto x = torch::randn({1001});
  const uint64_t seed = 42;
  auto whole = apply_dropout_mask(x, 0.3, seed, 0, torch::kFloat);
  std::vector<torch::Tensor> pieces;
  const int64_t cuts[] = {0, 5, 6, 7, 300, 999, 1001};  // pieces that start and end inside a hash word
  for (int i = 0; i + 1 < 7; ++i)
    pieces.push_back(apply_dropout_mask(x.narrow(0, cuts[i], cuts[i + 1] - cuts[i]), 0.3, seed, cuts[i], torch::kFloat));
  EXPECT_TRUE(torch::equal(torch::cat(pieces), whole));
  EXPECT_FALSE(torch::equal(apply_dropout_mask(x, 0.3, seed + 1, 0, torch::kFloat), whole));
}

// Every dtype pair the vectorised kernels handle gives what fp64 arithmetic with the same mask
// gives, rounded once to the output dtype (bf16: to nearest even).
TEST(ChunkedAttention, AMaskInEveryDtypeIsTheFp64MaskRoundedOnce) {
  const uint64_t seed = 7;
  auto x = torch::randn({3000}, torch::kDouble) * 100;
  auto kept = apply_dropout_mask(torch::ones({3000}, torch::kDouble), 0.2, seed, 3, torch::kDouble);  // 0 or 1.25
  for (const auto in : {torch::kFloat, torch::kBFloat16})
    for (const auto out : {torch::kFloat, torch::kBFloat16}) {
      auto xin = x.to(in);
      auto expected = (xin.to(torch::kDouble) * kept).to(torch::kFloat).to(out);  // fp32 products, one rounding
      EXPECT_TRUE(torch::equal(apply_dropout_mask(xin, 0.2, seed, 3, out), expected))
          << torch::toString(in) << " -> " << torch::toString(out);
    }
}

// `auto` trains on the CPU with chunked attention: in chunks where a layer's weights outgrow one
// (T = 256: 2 × 4 pairs of 64K scores, 4 pairs per chunk, recomputed in backward) and in one chunk
// whose weights are kept below that (T = 16); chunked and math models agree on the logits and every
// parameter's gradient with dropout on, with grouped-query heads.
TEST(ChunkedAttention, AutoTrainsWithChunkedAttentionAndMatchesMath) {
  for (const int64_t T : {256, 16}) {
    ModelConfig cfg;
    cfg.vocab_size = 11;
    cfg.block_size = T;
    cfg.n_layer = 2;
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    cfg.n_embd = 32;
    cfg.dropout = 0.1;
    if (T == 256) {
      ASSERT_LT(attention_chunk_pairs(T, T), 2 * cfg.n_head);
    } else {
      ASSERT_GE(attention_chunk_pairs(T, T), 2 * cfg.n_head);
    }
    GPT models[3] = {GPT(nullptr), GPT(nullptr), GPT(nullptr)};
    const char* kinds[3] = {"auto", "chunked", "math"};
    for (int m = 0; m < 3; ++m) {
      cfg.attention = kinds[m];
      torch::manual_seed(5);
      models[m] = GPT(cfg);
    }
    auto idx = torch::randint(11, {2, T});
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + " T=" + std::to_string(T));
      torch::Tensor logits[3];
      for (int m = 0; m < 3; ++m) {
        models[m]->train();
        models[m]->zero_grad();
        torch::manual_seed(9);  // the same dropout masks in all three
        {
          nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
          logits[m] = models[m]->logits(idx);
        }
        logits[m].to(torch::kFloat).pow(2).mean().backward();
      }
      if (!flash_attention_trains(T, bf16 ? torch::kBFloat16 : torch::kFloat)) {  // else auto trains with flash attention (test_model_flash_attention.cpp)
        EXPECT_TRUE(torch::equal(logits[0], logits[1])) << "auto must have taken the chunked path";
      }
      const double tol = bf16 ? 2e-2 : 1e-5;
      EXPECT_LE(relative_error(logits[1], logits[2]), tol);
      auto math_params = models[2]->named_parameters();
      for (auto& p : models[1]->named_parameters())
        EXPECT_LE(relative_error(p.value().grad(), math_params[p.key()].grad()), tol) << p.key();
    }
  }
}

// In training the MLP keeps c_fc's output and recomputes the activation in backward (for an
// activation of kRecomputeMinValues values); in eval mode (grad still on) it runs plain autograd.
// Same output and gradients, for every activation.
TEST(MlpRecompute, MatchesPlainAutogradForEveryActivation) {
  for (const char* kind : {"gelu", "relu2", "swiglu"}) {
    for (const bool bf16 : {false, true}) {
      for (const bool bias : {false, true}) {
        SCOPED_TRACE(std::string(kind) + (bf16 ? " bf16" : " fp32") + (bias ? " bias" : ""));
        ModelConfig cfg;
        cfg.n_embd = 24;
        cfg.mlp = kind;
        cfg.bias = bias;
        torch::manual_seed(3);
        MLP mlp(cfg);
        const int64_t fc_out = std::string(kind) == "swiglu" ? 2 * cfg.mlp_hidden() : cfg.mlp_hidden();
        const int64_t tokens = MLPImpl::kRecomputeMinValues / fc_out + 1;  // just large enough to recompute
        auto x = torch::randn({1, tokens, 24});
        auto run = [&](bool training) {
          mlp->train(training);
          mlp->zero_grad();
          auto xx = x.clone().requires_grad_(true);
          torch::Tensor y;
          {
            nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
            y = mlp(xx);
          }
          (y.to(torch::kFloat) * torch::linspace(-1, 1, 24)).pow(2).sum().backward();
          std::vector<torch::Tensor> out = {y.detach(), xx.grad()};
          for (auto& p : mlp->parameters()) out.push_back(p.grad().clone());
          return out;
        };
        auto recomputed = run(true), plain = run(false);
        ASSERT_EQ(recomputed.size(), plain.size());
        EXPECT_EQ(recomputed[0].scalar_type(), plain[0].scalar_type());
        const double tol = bf16 ? 1e-2 : 1e-6;
        for (size_t i = 0; i < plain.size(); ++i) EXPECT_LE(relative_error(recomputed[i], plain[i]), tol) << i;
      }
    }
  }
}

namespace {

// RoPE from its definition in fp64: the pairs (i, i + hs/2) of x (B, T, H, hs) turned by
// pos · 10000^(-2i/hs) for positions start .. start + T - 1. Differentiable.
torch::Tensor rope_by_definition(const torch::Tensor& x, int64_t start) {
  const int64_t T = x.size(1), hs = x.size(3);
  auto i = torch::arange(hs / 2, torch::kDouble);
  auto angle = torch::arange(start, start + T, torch::kDouble).view({T, 1, 1}) * torch::pow(10000.0, -2.0 * i / hs);
  auto x1 = x.narrow(-1, 0, hs / 2), x2 = x.narrow(-1, hs / 2, hs / 2);
  return torch::cat({x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()}, -1);
}

}  // namespace

// RoPE from its definition through autograd in fp64, against Rope::apply, whose backward keeps
// nothing and rotates the gradient back.
TEST(RopeRecompute, GradientIsTheInverseRotation) {
  const int64_t B = 2, T = 7, H = 3, hs = 8, start = 5;
  torch::manual_seed(4);
  auto x = torch::randn({B, T, H, hs}, torch::kDouble).requires_grad_(true);
  auto dy = torch::randn({B, T, H, hs}, torch::kDouble);
  auto ref = rope_by_definition(x, start);
  auto dx_ref = torch::autograd::grad({ref}, {x}, {dy})[0];
  Rope rope(16, hs, 10000.0);
  auto xf = x.detach().to(torch::kFloat).requires_grad_(true);
  auto y = rope.apply(xf, start);
  auto dx = torch::autograd::grad({y}, {xf}, {dy.to(torch::kFloat)})[0];
  EXPECT_LE(relative_error(y, ref), 1e-6);
  EXPECT_LE(relative_error(dx, dx_ref), 1e-6);
}

// The fused CPU rotation as attention calls it (Rope::apply_split): x a slice of a wider projection
// (its rows strided), queries and keys returned apart in (B, heads, T, hs), fp32 and bf16, against
// the definition in fp64; the gradient with both outputs used and with the keys unused.
TEST(RopeRecompute, SplitRotationOfAStridedSliceMatchesTheDefinition) {
  const int64_t B = 2, T = 6, H = 5, n_q = 3, hs = 12, start = 3;
  torch::manual_seed(5);
  auto wide = torch::randn({B, T, H * hs + 7}, torch::kDouble);  // a projection wider than q and k
  auto dq = torch::randn({B, n_q, T, hs}, torch::kDouble), dk = torch::randn({B, H - n_q, T, hs}, torch::kDouble);
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const double tol = dtype == torch::kFloat ? 1e-6 : 1e-2;
    for (bool keys_used : {true, false}) {
      auto x = wide.narrow(-1, 0, H * hs).view({B, T, H, hs}).to(dtype).to(torch::kDouble).requires_grad_(true);
      auto ref = rope_by_definition(x, start);
      auto ref_q = ref.narrow(2, 0, n_q).transpose(1, 2), ref_k = ref.narrow(2, n_q, H - n_q).transpose(1, 2);
      auto ref_loss = (ref_q * dq).sum() + (keys_used ? (ref_k * dk).sum() : torch::zeros({}, torch::kDouble));
      auto dx_ref = torch::autograd::grad({ref_loss}, {x})[0];

      auto wide_in = wide.to(dtype).requires_grad_(true);
      auto xin = wide_in.narrow(-1, 0, H * hs).view({B, T, H, hs});  // rows strided by H * hs + 7
      Rope rope(4, hs, 10000.0);  // tables grow to cover start + T
      auto [q, k] = rope.apply_split(xin, start, n_q);
      ASSERT_EQ(q.sizes(), torch::IntArrayRef({B, n_q, T, hs}));
      ASSERT_EQ(k.sizes(), torch::IntArrayRef({B, H - n_q, T, hs}));
      EXPECT_TRUE(q.is_contiguous() && k.is_contiguous());
      EXPECT_EQ(q.scalar_type(), dtype);
      EXPECT_LE(relative_error(q.to(torch::kDouble), ref_q), tol) << dtype;
      EXPECT_LE(relative_error(k.to(torch::kDouble), ref_k), tol) << dtype;
      auto loss = (q.to(torch::kDouble) * dq).sum() + (keys_used ? (k.to(torch::kDouble) * dk).sum() : torch::zeros({}, torch::kDouble));
      auto dwide = torch::autograd::grad({loss}, {wide_in})[0];
      EXPECT_LE(relative_error(dwide.narrow(-1, 0, H * hs).reshape({B, T, H, hs}).to(torch::kDouble), dx_ref), tol)
          << dtype << " keys used " << keys_used;
      EXPECT_EQ(dwide.narrow(-1, H * hs, 7).abs().sum().item<double>(), 0.0);  // the columns past q and k
    }
  }
}
