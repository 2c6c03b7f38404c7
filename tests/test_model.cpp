// The GPT model against independent references (a naive per-head loop, the formulas) and
// properties (causality, relative positions, cache equivalence).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>

#include "model/attention.h"
#include "runtime/device.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "model/positions.h"
#include "tensor_compare.h"

using namespace nanogpt::model;

namespace {

ModelConfig tiny(const std::string& pos = "rope", const std::string& norm = "layernorm") {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  c.pos_encoding = pos;
  c.norm = norm;
  c.attention = "math";
  return c;
}

// softmax(q kᵀ/√d) v with an explicit causal loop, one (batch, head) at a time.
torch::Tensor naive_attention(CausalSelfAttentionImpl& attn, const torch::Tensor& x, int64_t nh, int64_t nkv) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hs = C / nh;
  auto q = attn.q_proj(x), k = attn.k_proj(x), v = attn.v_proj(x);  // (B, T, nh*hs) / (B, T, nkv*hs)
  std::vector<torch::Tensor> heads;
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t g = h / (nh / nkv);  // kv head serving query head h
    std::vector<torch::Tensor> batch;
    for (int64_t b = 0; b < B; ++b) {
      auto qh = q[b].narrow(1, h * hs, hs), kh = k[b].narrow(1, g * hs, hs), vh = v[b].narrow(1, g * hs, hs);
      std::vector<torch::Tensor> rows;
      for (int64_t i = 0; i < T; ++i) {
        auto scores = (kh.narrow(0, 0, i + 1) * qh[i]).sum(1) / std::sqrt(static_cast<double>(hs));  // (i+1,)
        auto w = torch::exp(scores - scores.max());
        w = w / w.sum();
        rows.push_back((w.unsqueeze(1) * vh.narrow(0, 0, i + 1)).sum(0));  // (hs,)
      }
      batch.push_back(torch::stack(rows));  // (T, hs)
    }
    heads.push_back(torch::stack(batch));  // (B, T, hs)
  }
  return attn.c_proj(torch::cat(heads, 2));  // (B, T, C)
}

}  // namespace

// The model's Linear and Embedding (model/layers.h) against LibTorch's own layers: the same random
// fill from the same seed, the same parameter names, the same outputs; Fill::none draws nothing.
TEST(Layers, FillAsLibTorchsLayersOrNotAtAll) {
  for (bool bias : {true, false}) {
    torch::manual_seed(5);
    torch::nn::Linear theirs(torch::nn::LinearOptions(7, 3).bias(bias));
    torch::manual_seed(5);
    Linear ours(7, 3, bias);
    EXPECT_TRUE(ours->weight.equal(theirs->weight));
    EXPECT_EQ(ours->named_parameters().keys(), theirs->named_parameters().keys());
    if (bias) {
      EXPECT_TRUE(ours->bias.equal(theirs->bias));
    }
    const auto x = torch::randn({2, 4, 7});
    EXPECT_TRUE(ours(x).equal(theirs(x)));
  }
  torch::manual_seed(6);
  torch::nn::Embedding theirs(11, 4);
  torch::manual_seed(6);
  Embedding ours(11, 4);
  EXPECT_TRUE(ours->weight.equal(theirs->weight));
  EXPECT_EQ(ours->named_parameters().keys(), theirs->named_parameters().keys());
  const auto idx = torch::tensor({{3, 0, 10}, {7, 7, 1}}, torch::kLong);
  EXPECT_TRUE(ours(idx).equal(theirs(idx)));

  // Fill::none: the shapes and names, and the generator where it was.
  torch::manual_seed(9);
  const auto expected = torch::rand({4});
  torch::manual_seed(9);
  Linear bare(7, 3, true, Fill::none);
  Embedding bare_table(11, 4, Fill::none);
  EXPECT_TRUE(torch::rand({4}).equal(expected));
  EXPECT_EQ(bare->weight.sizes(), torch::IntArrayRef({3, 7}));
  EXPECT_EQ(bare->bias.sizes(), torch::IntArrayRef({3}));
  EXPECT_EQ(bare_table->weight.sizes(), torch::IntArrayRef({11, 4}));
  EXPECT_TRUE(bare->weight.requires_grad());
}

// A model built to be loaded has every parameter of one built to train, and draws no random number.
TEST(Layers, AModelBuiltToBeLoadedDrawsNothing) {
  ModelConfig config = tiny("learned");  // wpe too
  config.bias = true;
  config.tie_embeddings = false;    // lm_head too
  torch::manual_seed(3);
  const auto expected = torch::rand({4});
  torch::manual_seed(3);
  GPT loaded(config, /*initialise=*/false);
  EXPECT_TRUE(torch::rand({4}).equal(expected));
  auto trained = GPT(config)->named_parameters();
  auto params = loaded->named_parameters();
  ASSERT_EQ(params.keys(), trained.keys());
  for (const auto& item : params) EXPECT_EQ(item.value().sizes(), trained[item.key()].sizes()) << item.key();
}

TEST(Attention, MatchesNaiveReferenceForwardAndGradients) {
  torch::manual_seed(0);
  for (int64_t nkv : {4, 2, 1}) {
    auto cfg = tiny();
    cfg.n_kv_head = nkv;
    CausalSelfAttention attn(cfg);
    auto x = torch::randn({2, 6, 16}, torch::requires_grad());
    auto y = attn(x, AttentionContext{});
    auto y_ref = naive_attention(*attn, x, 4, nkv);
    ASSERT_TRUE(torch::allclose(y, y_ref, 1e-5, 1e-6)) << "nkv=" << nkv;
    auto g = torch::randn_like(y);
    auto grads = torch::autograd::grad({y}, {x, attn->k_proj->weight}, {g});
    auto grads_ref = torch::autograd::grad({y_ref}, {x, attn->k_proj->weight}, {g});
    EXPECT_TRUE(torch::allclose(grads[0], grads_ref[0], 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(grads[1], grads_ref[1], 1e-5, 1e-6));
  }
}

TEST(Attention, WeightsRowsSumToOneAndAreCausal) {
  torch::manual_seed(1);
  CausalSelfAttention attn(tiny());
  torch::Tensor w;
  AttentionContext ctx;
  ctx.weights = &w;
  attn(torch::randn({1, 5, 16}), ctx);
  ASSERT_EQ(w.sizes(), torch::IntArrayRef({1, 4, 5, 5}));
  EXPECT_TRUE(torch::allclose(w.sum(-1), torch::ones({1, 4, 5})));
  EXPECT_EQ(w.triu(1).abs().max().item<float>(), 0.0f);
}

using nanogpt::testing::relative_error;

// `attention: auto` trains on the CPU in fp32 at this length with flash attention
// (model/fast/flash_attention.h; in bf16 it would be chunked, test_model_flash_attention.cpp) and
// evaluates with the fused kernels: its logits equal flash's bit for bit in training (grad on), and
// sdpa's in evaluation (no grad). Chunked attention (the math path's arithmetic with a fused causal
// softmax) trains as the math path does.
TEST(Attention, AutoTrainsWithFlashAndEvaluatesWithSdpaOnTheCpu) {
  auto cfg = tiny();
  cfg.block_size = 32;
  GPT models[5] = {GPT(nullptr), GPT(nullptr), GPT(nullptr), GPT(nullptr), GPT(nullptr)};
  const char* kinds[5] = {"auto", "chunked", "sdpa", "math", "flash"};
  for (int m = 0; m < 5; ++m) {
    cfg.attention = kinds[m];
    torch::manual_seed(5);
    models[m] = GPT(cfg);
  }
  auto idx = torch::randint(11, {2, 32});
  auto logits = [&](GPT& model, bool training) {
    model->train(training);
    if (training) return model->logits(idx).detach();
    torch::NoGradGuard no_grad;
    return model->logits(idx);
  };
  const auto auto_train = logits(models[0], true), chunked_train = logits(models[1], true),
             math_train = logits(models[3], true), flash_train = logits(models[4], true);
  const auto auto_eval = logits(models[0], false), sdpa_eval = logits(models[2], false),
             math_eval = logits(models[3], false);
  EXPECT_TRUE(torch::equal(auto_train, flash_train));
  EXPECT_FALSE(torch::equal(flash_train, chunked_train)) << "the two paths must differ in rounding for this test to tell them apart";
  EXPECT_FALSE(torch::equal(chunked_train, math_train)) << "the two paths must differ in rounding for this test to tell them apart";
  EXPECT_LE(relative_error(chunked_train, math_train), 1e-5);
  EXPECT_TRUE(torch::equal(auto_eval, sdpa_eval));
  EXPECT_FALSE(torch::equal(sdpa_eval, math_eval)) << "the two paths must differ in rounding for this test to tell them apart";
}

// The fused path (scaled_dot_product_attention) against the written-out lesson (math), forward and
// backward, in fp32 and under bf16 autocast, for multi-head and grouped-query attention, with RoPE
// and with learned positions: the logits and every parameter's gradient.
TEST(Attention, SdpaMatchesMathOutputsAndGradients) {
  struct Case {
    int64_t n_kv_head;
    const char* pos;
    bool bf16;
  };
  for (const Case c : {Case{4, "rope", false}, Case{2, "rope", false}, Case{4, "learned", false},
                       Case{1, "learned", false}, Case{4, "rope", true}, Case{2, "rope", true},
                       Case{4, "learned", true}, Case{2, "learned", true}}) {
    SCOPED_TRACE(std::string("n_kv_head=") + std::to_string(c.n_kv_head) + " pos=" + c.pos +
                 (c.bf16 ? " bf16" : " fp32"));
    auto math_cfg = tiny(c.pos);
    math_cfg.n_kv_head = c.n_kv_head;
    math_cfg.block_size = 32;
    auto sdpa_cfg = math_cfg;
    sdpa_cfg.attention = "sdpa";
    torch::manual_seed(2);
    GPT math_model(math_cfg), sdpa_model(sdpa_cfg);
    {
      torch::NoGradGuard no_grad;
      auto src = math_model->named_parameters();
      for (auto& p : sdpa_model->named_parameters()) p.value().copy_(src[p.key()]);
    }
    auto idx = torch::randint(11, {3, 32});
    auto run = [&](GPT& model) {
      model->zero_grad();
      torch::Tensor logits;
      {
        nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, c.bf16);
        logits = model->logits(idx);  // (B, T, V)
      }
      (logits.to(torch::kFloat).pow(2).mean()).backward();  // a loss that weighs every logit
      return logits;
    };
    auto logits_math = run(math_model), logits_sdpa = run(sdpa_model);
    const double tol = c.bf16 ? 2e-2 : 1e-5;
    EXPECT_LE(relative_error(logits_sdpa, logits_math), tol);
    auto grads_math = math_model->named_parameters();
    for (auto& p : sdpa_model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_LE(relative_error(p.value().grad(), grads_math[p.key()].grad()), tol) << p.key();
    }
  }
}

// The same through the KV cache (a prefix, then a chunk that sees it through an explicit mask).
TEST(Attention, SdpaMatchesMathThroughTheCache) {
  torch::manual_seed(2);
  for (int64_t nkv : {4, 2}) {
    auto math_cfg = tiny();
    math_cfg.n_kv_head = nkv;
    auto sdpa_cfg = math_cfg;
    sdpa_cfg.attention = "sdpa";
    GPT math_model(math_cfg), sdpa_model(sdpa_cfg);
    torch::NoGradGuard no_grad;
    auto src = math_model->named_parameters();
    for (auto& p : sdpa_model->named_parameters()) p.value().copy_(src[p.key()]);
    auto idx = torch::randint(11, {2, 8});
    auto cache_m = math_model->make_cache(), cache_s = sdpa_model->make_cache();
    math_model->forward_cached(idx.narrow(1, 0, 5), cache_m);
    sdpa_model->forward_cached(idx.narrow(1, 0, 5), cache_s);
    EXPECT_LE(relative_error(sdpa_model->forward_cached(idx.narrow(1, 5, 3), cache_s),
                             math_model->forward_cached(idx.narrow(1, 5, 3), cache_m)),
              1e-5);
  }
}

TEST(Attention, GroupedQueryWithAllHeadsEqualsMultiHead) {
  torch::manual_seed(3);
  auto mha_cfg = tiny(), gqa_cfg = tiny();
  gqa_cfg.n_kv_head = gqa_cfg.n_head;
  mha_cfg.n_kv_head = 0;
  CausalSelfAttention mha(mha_cfg), gqa(gqa_cfg);
  torch::NoGradGuard no_grad;
  auto src = mha->named_parameters();
  for (auto& p : gqa->named_parameters()) p.value().copy_(src[p.key()]);
  auto x = torch::randn({2, 7, 16});
  EXPECT_TRUE(torch::equal(mha(x, AttentionContext{}), gqa(x, AttentionContext{})));
}

TEST(Attention, GroupedQueryEqualsMultiHeadWithSharedKeyValueWeights) {
  torch::manual_seed(4);
  auto gqa_cfg = tiny();
  gqa_cfg.n_kv_head = 2;  // heads {0,1} share kv head 0, {2,3} share kv head 1
  CausalSelfAttention mha(tiny()), gqa(gqa_cfg);
  torch::NoGradGuard no_grad;
  mha->q_proj->weight.copy_(gqa->q_proj->weight);
  mha->c_proj->weight.copy_(gqa->c_proj->weight);
  const int64_t hs = 4;
  for (int64_t h = 0; h < 4; ++h) {
    mha->k_proj->weight.narrow(0, h * hs, hs).copy_(gqa->k_proj->weight.narrow(0, (h / 2) * hs, hs));
    mha->v_proj->weight.narrow(0, h * hs, hs).copy_(gqa->v_proj->weight.narrow(0, (h / 2) * hs, hs));
  }
  auto x = torch::randn({2, 7, 16});
  EXPECT_TRUE(torch::allclose(mha(x, AttentionContext{}), gqa(x, AttentionContext{}), 1e-5, 1e-6));
}

TEST(Positions, RopePreservesNormsAndDependsOnlyOnRelativeOffset) {
  torch::manual_seed(5);
  Rope rope(64, 8, 10000.0);
  auto q = torch::randn({1, 1, 1, 8}), k = torch::randn({1, 1, 1, 8});
  for (int64_t p : {0, 3, 17, 63})
    EXPECT_NEAR(rope.apply(q, p).norm().item<double>(), q.norm().item<double>(), 1e-5);
  auto score = [&](int64_t pq, int64_t pk) { return (rope.apply(q, pq) * rope.apply(k, pk)).sum().item<double>(); };
  EXPECT_NEAR(score(5, 2), score(40, 37), 1e-4);
  EXPECT_NEAR(score(9, 9), score(0, 0), 1e-4);
  EXPECT_GT(std::abs(score(5, 2) - score(5, 4)), 1e-4);  // a different offset gives a different score
}

TEST(Positions, RopeUsesSplitHalvesConvention) {
  Rope rope(16, 4, 100.0);
  auto x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 1, 4});  // (B, T, H, hs)
  auto y = rope.apply(x, 3);
  // Pairs are (x0, x2) with θ0 = 1 and (x1, x3) with θ1 = 100^(-1/2) = 0.1, at position 3.
  const double a0 = 3.0, a1 = 0.3;
  EXPECT_NEAR(y[0][0][0][0].item<double>(), 1 * std::cos(a0) - 3 * std::sin(a0), 1e-5);
  EXPECT_NEAR(y[0][0][0][2].item<double>(), 3 * std::cos(a0) + 1 * std::sin(a0), 1e-5);
  EXPECT_NEAR(y[0][0][0][1].item<double>(), 2 * std::cos(a1) - 4 * std::sin(a1), 1e-5);
  EXPECT_NEAR(y[0][0][0][3].item<double>(), 4 * std::cos(a1) + 2 * std::sin(a1), 1e-5);
}

TEST(Positions, SinusoidalTableMatchesFormula) {
  const int64_t C = 16;
  auto table = sinusoidal_table(50, C);
  for (int64_t p : {0, 1, 7, 49})
    for (int64_t i : {0, 1, 5, 7}) {
      const double angle = p / std::pow(10000.0, 2.0 * i / C);
      EXPECT_NEAR(table[p][2 * i].item<double>(), std::sin(angle), 1e-6) << p << "," << i;
      EXPECT_NEAR(table[p][2 * i + 1].item<double>(), std::cos(angle), 1e-6) << p << "," << i;
    }
}

TEST(GPT, IsCausalForEveryPositionEncodingAndNorm) {
  for (const std::string pos : {"rope", "sinusoidal", "learned"})
    for (const std::string norm : {"layernorm", "rmsnorm"}) {
      torch::manual_seed(6);
      GPT model(tiny(pos, norm));
      model->eval();
      torch::NoGradGuard no_grad;
      auto idx = torch::randint(11, {2, 8});
      auto base = model->logits(idx);
      for (int64_t t = 0; t + 1 < 8; ++t) {
        auto changed = idx.clone();
        changed.narrow(1, t + 1, 1).add_(1).remainder_(11);
        auto out = model->logits(changed);
        EXPECT_TRUE(torch::equal(out.narrow(1, 0, t + 1), base.narrow(1, 0, t + 1))) << pos << "/" << norm << " t=" << t;
        EXPECT_FALSE(torch::equal(out.narrow(1, t + 1, 1), base.narrow(1, t + 1, 1))) << pos << "/" << norm;
      }
    }
}

TEST(GPT, InitialLossIsAboutLnVocab) {
  torch::manual_seed(7);
  auto cfg = tiny();
  cfg.vocab_size = 65;
  GPT model(cfg);
  auto idx = torch::randint(65, {8, 8}), targets = torch::randint(65, {8, 8});
  const double loss = model->forward(idx, targets).second.item<double>();
  EXPECT_NEAR(loss, std::log(65.0), 0.15);
}

TEST(GPT, HeadIsTiedToTokenEmbedding) {
  torch::manual_seed(8);
  GPT model(tiny());
  int64_t vocab_shaped = 0;
  for (auto& p : model->named_parameters()) {
    EXPECT_EQ(p.key().find("lm_head"), std::string::npos);
    if (p.value().sizes() == torch::IntArrayRef({11, 16})) ++vocab_shaped;
  }
  EXPECT_EQ(vocab_shaped, 1);
  // Changing one embedding row changes that token's logit everywhere: the head reads wte.
  auto idx = torch::randint(11, {1, 5});
  torch::NoGradGuard no_grad;
  auto before = model->logits(idx);
  auto wte = model->named_parameters()["wte.weight"];
  wte[3].mul_(2.0);
  auto after = model->logits(idx);
  EXPECT_FALSE(torch::allclose(before.select(2, 3), after.select(2, 3)));
}

TEST(GPT, ParameterCountMatchesNanoGPT) {
  ModelConfig full;  // 6 layers, 6 heads, 384, vocab 65, no bias
  full.pos_encoding = "learned";
  EXPECT_EQ(GPT(full)->num_params(), 10646784);
  full.pos_encoding = "rope";
  EXPECT_EQ(GPT(full)->num_params(), 10646784);
  full.pos_encoding = "learned";
  EXPECT_EQ(GPT(full)->num_params(false), 10646784 + 256 * 384);
}

TEST(GPT, ParameterNamesReadLikeNanoGPT) {
  auto cfg = tiny("learned");
  cfg.bias = true;
  auto names = GPT(cfg)->named_parameters();
  for (const char* name : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias", "h.1.attn.q_proj.weight",
                           "h.1.attn.k_proj.weight", "h.1.attn.v_proj.weight", "h.1.attn.c_proj.bias",
                           "h.0.mlp.c_fc.weight", "h.0.mlp.c_proj.weight", "ln_f.weight"})
    EXPECT_TRUE(names.contains(name)) << name;
}

TEST(GPT, FlopsPerTokenFollowsNanoGPT) {
  auto cfg = tiny();
  GPT model(cfg);
  const double N = model->num_params();
  EXPECT_DOUBLE_EQ(model->flops_per_token(), 6 * N + 12.0 * 2 * 4 * 4 * 8);
}

namespace {
// Multiplies the query and key projections, so that attention is peaked and the scores matter
// (N(0, 0.02) weights give near-uniform attention, which would hide a wrong key).
void sharpen_attention(GPT& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters())
    if (p.key().find("q_proj") != std::string::npos || p.key().find("k_proj") != std::string::npos) p.value().mul_(40);
}
}  // namespace

// Decoding one token at a time runs model/fast/decode_attention.cpp on the CPU (no autograd) and
// the general path with autograd on; a chunk of several tokens on top of a cache runs the general
// path with an explicit mask. All must give the full forward's logits, with GQA too.
TEST(GPT, KVCacheLogitsEqualFullForward) {
  for (const std::string pos : {"rope", "learned", "sinusoidal", "rope+gqa"})
    for (const bool fast_decode : {true, false}) {
      SCOPED_TRACE(pos + (fast_decode ? " decode_attention" : " general path"));
      torch::manual_seed(9);
      auto cfg = tiny(pos == "rope+gqa" ? "rope" : pos);
      if (pos == "rope+gqa") cfg.n_kv_head = 2;
      GPT model(cfg);
      model->eval();
      sharpen_attention(model);
      std::optional<torch::NoGradGuard> no_grad;
      if (fast_decode) no_grad.emplace();
      const int64_t block = cfg.block_size;
      auto seq = torch::randint(11, {2, block});
      auto cache = model->make_cache();
      model->forward_cached(seq.narrow(1, 0, 3), cache);                       // a prompt
      auto chunk = model->forward_cached(seq.narrow(1, 3, 2), cache);           // a chunk on top of it
      ASSERT_TRUE(torch::allclose(chunk, model->logits(seq.narrow(1, 0, 5)).select(1, 4), 1e-5, 1e-5));
      for (int64_t total = 6; total <= block; ++total) {
        auto cached = model->forward_cached(seq.narrow(1, total - 1, 1), cache);  // (B, V)
        auto full = model->logits(seq.narrow(1, 0, total)).select(1, total - 1);  // (B, V)
        ASSERT_TRUE(torch::allclose(cached, full, 1e-5, 1e-5)) << "total=" << total;
      }
      // Learned and sinusoidal tables end at block_size: one more position is refused.
      if (pos == "learned" || pos == "sinusoidal") {
        EXPECT_THROW(model->forward_cached(seq.narrow(1, 0, 1), cache), std::invalid_argument);
      }
    }
}

// RoPE past block_size: the cache slides (each new token overwrites the oldest) and positions keep
// counting. A score depends only on the offset between query and key, so for one layer this is
// exactly the full forward over the last block_size tokens (nanoGPT's crop and recompute), over
// three blocks, for MHA and GQA, in the fast decode kernel and the general path.
TEST(GPT, SlidingKVCacheEqualsCropAndRecomputeForOneLayer) {
  for (const int64_t nkv : {4, 2})
    for (const bool fast_decode : {true, false}) {
      SCOPED_TRACE("n_kv_head=" + std::to_string(nkv) + (fast_decode ? " decode_attention" : " general path"));
      torch::manual_seed(11);
      auto cfg = tiny("rope");
      cfg.n_layer = 1;
      cfg.n_kv_head = nkv;
      GPT model(cfg);
      model->eval();
      sharpen_attention(model);
      std::optional<torch::NoGradGuard> no_grad;
      if (fast_decode) no_grad.emplace();
      const int64_t block = cfg.block_size, steps = 3 * block;
      auto seq = torch::randint(11, {2, steps});
      auto cache = model->make_cache();
      model->forward_cached(seq.narrow(1, 0, block - 1), cache);
      for (int64_t total = block; total <= steps; ++total) {
        auto cached = model->forward_cached(seq.narrow(1, total - 1, 1), cache);  // (B, V)
        auto window = seq.narrow(1, total - block, block);                          // the last block_size tokens
        auto recomputed = model->logits(window).select(1, block - 1);               // (B, V)
        ASSERT_TRUE(torch::allclose(cached, recomputed, 1e-4, 1e-5)) << "total=" << total;
      }
      // Only one token at a time may wrap around the ring.
      EXPECT_THROW(model->forward_cached(seq.narrow(1, 0, 2), cache), std::invalid_argument);
    }
}

// Under bf16 autocast the math path's softmax runs in fp32 (as PyTorch's autocast runs softmax):
// weights come back fp32 and their rows sum to 1 at fp32 precision.
TEST(Attention, MathSoftmaxStaysFp32UnderBf16Autocast) {
  torch::manual_seed(3);
  CausalSelfAttention attn(tiny());
  attn->eval();
  torch::NoGradGuard no_grad;
  auto x = torch::randn({2, 8, 16});
  torch::Tensor weights;
  AttentionContext ctx;
  ctx.weights = &weights;
  nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
  attn(x, ctx);
  ASSERT_EQ(weights.scalar_type(), torch::kFloat);
  EXPECT_LE((weights.sum(-1) - 1).abs().max().item<double>(), 1e-6);
}

TEST(GPT, TinyModelOverfitsOneBatch) {
  torch::manual_seed(10);
  GPT model(tiny());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.0));
  auto idx = torch::randint(11, {4, 8}), targets = torch::randint(11, {4, 8});
  double loss = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    auto out = model->forward(idx, targets).second;
    out.backward();
    opt.step();
    loss = out.item<double>();
  }
  EXPECT_LT(loss, 0.1);
}

// One JSON mapping (checkpoints and exports): every field survives, a missing one is named.
TEST(ModelConfig, JsonRoundTripKeepsEveryField) {
  ModelConfig m;
  m.vocab_size = 7443;
  m.block_size = 48;
  m.n_layer = 3;
  m.n_head = 6;
  m.n_kv_head = 2;
  m.n_embd = 96;
  m.dropout = 0.1;
  m.bias = true;
  m.pos_encoding = "sinusoidal";
  m.rope_base = 500000.0;
  m.norm = "rmsnorm";
  m.attention = "math";
  m.qk_norm = true;
  m.mlp = "swiglu";
  m.tie_embeddings = false;
  m.logit_softcap = 15.0;
  const auto back = model_config_from_json(nlohmann::ordered_json::parse(to_json(m).dump()));
  EXPECT_EQ(to_json(back), to_json(m));
  EXPECT_EQ(back.dropout, 0.1);  // bit for bit
  EXPECT_EQ(back.n_kv_head, 2);
  EXPECT_EQ(back.attention, "math");
  // Files written before the switches beyond nanoGPT's recipe lack them: the defaults apply.
  auto before = to_json(m);
  for (const char* key : {"qk_norm", "mlp", "tie_embeddings", "logit_softcap"}) before.erase(key);
  const auto old_file = model_config_from_json(before);
  EXPECT_FALSE(old_file.qk_norm);
  EXPECT_EQ(old_file.mlp, "gelu");
  EXPECT_TRUE(old_file.tie_embeddings);
  EXPECT_EQ(old_file.logit_softcap, 0.0);
  auto missing = to_json(m);
  missing.erase("n_head");
  try {
    model_config_from_json(missing);
    ADD_FAILURE() << "no error for a missing field";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lacks 'n_head'"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, RejectsImpossibleCombinationsNamingValues) {
  auto expect_error = [](ModelConfig c, const std::string& needle) {
    try {
      c.validate();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto c = tiny();
  c.n_head = 5;
  expect_error(c, "n_embd (16) must be divisible by n_head (5)");
  c = tiny();
  c.n_kv_head = 3;
  expect_error(c, "n_head (4) must be divisible by n_kv_head (3)");
  c = tiny();
  c.n_embd = 12;
  c.n_head = 4;  // head size 3
  expect_error(c, "n_embd / n_head (3) must be even with pos_encoding rope");
  c = tiny();
  c.pos_encoding = "alibi";
  expect_error(c, "alibi");
  c = tiny();
  c.attention = "fast";
  expect_error(c, "attention (fast) must be math, sdpa, chunked, flash or auto");
  c = tiny();
  c.mlp = "geglu";
  expect_error(c, "mlp (geglu) must be gelu, gelu_tanh, relu2 or swiglu");
  c = tiny();
  c.logit_softcap = -1;
  expect_error(c, "logit_softcap (-1.0) must be a number >= 0");
}

// The switches beyond nanoGPT's recipe (issue 15), each alone, with RoPE and learned positions, MHA
// and GQA: the model stays causal, and the KV cache (the fast decode kernel and the general path)
// gives the full forward's logits.
namespace {
struct Switch {
  const char* name;
  void (*apply)(ModelConfig&);
};
const Switch kSwitches[] = {
    {"qk_norm", [](ModelConfig& c) { c.qk_norm = true; }},
    {"relu2", [](ModelConfig& c) { c.mlp = "relu2"; }},
    {"swiglu", [](ModelConfig& c) { c.mlp = "swiglu"; }},
    {"untied", [](ModelConfig& c) { c.tie_embeddings = false; }},
    {"softcap", [](ModelConfig& c) { c.logit_softcap = 2.0; }},
    {"all+rmsnorm", [](ModelConfig& c) {
       c.qk_norm = true;
       c.mlp = "relu2";
       c.tie_embeddings = false;
       c.logit_softcap = 2.0;
       c.norm = "rmsnorm";
     }},
};
}  // namespace

TEST(ModernSwitches, CausalAndCacheEqualsFullForward) {
  for (const auto& sw : kSwitches)
    for (const std::string pos : {"rope", "learned"})
      for (const int64_t nkv : {4, 2})
        for (const bool fast_decode : {true, false}) {
          SCOPED_TRACE(std::string(sw.name) + " " + pos + " n_kv_head=" + std::to_string(nkv) +
                       (fast_decode ? " decode_attention" : " general path"));
          auto cfg = tiny(pos);
          cfg.n_kv_head = nkv;
          sw.apply(cfg);
          torch::manual_seed(12);
          GPT model(cfg);
          model->eval();
          sharpen_attention(model);
          std::optional<torch::NoGradGuard> no_grad;
          if (fast_decode) no_grad.emplace();
          auto idx = torch::randint(11, {2, 8});
          auto full = model->logits(idx);  // (B, T, V)
          auto changed = idx.clone();
          changed.narrow(1, 5, 1).add_(1).remainder_(11);
          auto out = model->logits(changed);
          EXPECT_TRUE(torch::allclose(out.narrow(1, 0, 5), full.narrow(1, 0, 5), 0, 0)) << "a later token changed earlier logits";
          EXPECT_FALSE(torch::equal(out.narrow(1, 5, 1), full.narrow(1, 5, 1)));
          auto cache = model->make_cache();
          auto first = model->forward_cached(idx.narrow(1, 0, 3), cache);
          ASSERT_TRUE(torch::allclose(first, full.select(1, 2), 1e-5, 1e-5));
          for (int64_t t = 3; t < 8; ++t)
            ASSERT_TRUE(torch::allclose(model->forward_cached(idx.narrow(1, t, 1), cache), full.select(1, t), 1e-5, 1e-5))
                << "t=" << t;
        }
}

TEST(ModernSwitches, SoftCapBoundsTheLogitsAndLeavesSmallOnesAlmostAlone) {
  auto cfg = tiny();
  torch::manual_seed(13);
  GPT plain(cfg);
  cfg.logit_softcap = 3.0;
  GPT capped(cfg);
  torch::NoGradGuard no_grad;
  for (auto& p : capped->named_parameters()) p.value().copy_(plain->named_parameters()[p.key()]);
  auto idx = torch::randint(11, {2, 8});
  auto small_plain = plain->logits(idx), small_capped = capped->logits(idx);
  EXPECT_TRUE(torch::allclose(small_capped, 3.0 * torch::tanh(small_plain / 3.0), 1e-5, 1e-6));
  EXPECT_LE((small_capped - small_plain).abs().max().item<double>(), 1e-2);  // init logits are ~0.1: tanh ≈ identity
  for (auto& p : capped->parameters()) p.mul_(20);  // huge logits
  EXPECT_LE(capped->logits(idx).abs().max().item<double>(), 3.0);
}

TEST(ModernSwitches, UntiedHeadIsItsOwnParameterAndSwigluKeepsTheParameterCount) {
  auto cfg = tiny();
  cfg.n_embd = 48;
  cfg.n_head = 4;
  GPT tied(cfg);
  auto untied_cfg = cfg;
  untied_cfg.tie_embeddings = false;
  GPT untied(untied_cfg);
  const auto names = untied->named_parameters();
  ASSERT_TRUE(names.contains("lm_head.weight"));
  EXPECT_EQ(untied->num_params() - tied->num_params(), cfg.vocab_size * cfg.n_embd);
  EXPECT_NE(names["lm_head.weight"].data_ptr(), names["wte.weight"].data_ptr());
  auto swiglu_cfg = cfg;
  swiglu_cfg.mlp = "swiglu";
  GPT swiglu(swiglu_cfg);
  EXPECT_EQ(swiglu_cfg.mlp_hidden(), 128);  // 8 * 48 / 3
  const double ratio = static_cast<double>(swiglu->num_params()) / static_cast<double>(tied->num_params());
  EXPECT_NEAR(ratio, 1.0, 0.02);
}

TEST(Dropout, DropsAboutPScalesTheRestAndIsSeeded) {
  auto x = torch::ones({1000, 100});
  torch::manual_seed(11);
  auto y = nanogpt::model::fast_dropout(x, 0.2, true);
  const double dropped = (y == 0).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(dropped, 0.2, 0.01);
  EXPECT_TRUE(torch::allclose(y.masked_select(y != 0), torch::full({1}, 1.25)));
  torch::manual_seed(11);
  EXPECT_TRUE(torch::equal(nanogpt::model::fast_dropout(x, 0.2, true), y));      // same seed, same mask
  EXPECT_FALSE(torch::equal(nanogpt::model::fast_dropout(x, 0.2, true), y));     // the generator moved on
  EXPECT_TRUE(torch::equal(nanogpt::model::fast_dropout(x, 0.2, false), x));     // eval: identity
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  torch::manual_seed(11);
  EXPECT_TRUE(torch::equal(nanogpt::model::fast_dropout(x, 0.2, true), y));      // independent of threads
  torch::set_num_threads(threads);
}

TEST(Dropout, GradientIsTheMask) {
  auto x = torch::randn({64, 33}, torch::requires_grad());
  auto y = nanogpt::model::fast_dropout(x, 0.5, true);
  y.sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), (y != 0).to(torch::kFloat) * 2.0));
  auto bf = nanogpt::model::fast_dropout(torch::ones({100}, torch::kBFloat16), 0.5, true);
  EXPECT_EQ(bf.scalar_type(), torch::kBFloat16);
}

TEST(Attention, FollowsInPlaceWeightUpdatesWithoutGrad) {
  torch::manual_seed(12);
  CausalSelfAttention attn(tiny());
  auto x = torch::randn({1, 4, 16});
  torch::NoGradGuard no_grad;
  auto before = attn(x, AttentionContext{});
  attn->k_proj->weight.mul_(0.5);  // an in-place update, as the optimizer makes
  auto after = attn(x, AttentionContext{});
  EXPECT_FALSE(torch::allclose(before, after));
  EXPECT_TRUE(torch::allclose(after, naive_attention(*attn, x, 4, 4), 1e-5, 1e-6));
}
