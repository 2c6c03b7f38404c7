// The hand-written one-token decoder (model/fast/decoder.h) against the general path
// (GPT::forward_cached): the same logits and the same cache across the architecture's switches,
// batches of 1 and 3, past block_size with RoPE; the same tokens from generate and beam search
// either way; bad input rejected.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model/fast/decoder.h"
#include "model/generate.h"

using namespace nanogpt::model;

namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 24;  // head size 12: not a multiple of the 16-float lanes, so the tails run too
  return c;
}

// Every weight perturbed (biases and norms included, which start at 0 and 1), queries and keys
// scaled up so that attention is peaked and which positions it sees matters (×3: at ×10 the scores
// are so large that fp32 rounding in them alone moves the logits by 1e-5 relative, either path).
GPT perturbed_model(const ModelConfig& c) {
  torch::manual_seed(0);
  GPT model(c);
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    p.value().add_(torch::randn_like(p.value()) * 0.1);
    if (p.key().find("q_proj") != std::string::npos || p.key().find("k_proj") != std::string::npos) p.value().mul_(3);
  }
  model->eval();
  return model;
}

// The switches, one at a time from the default (RoPE, layernorm, no bias, gelu, MHA, tied).
std::vector<std::pair<std::string, std::function<void(ModelConfig&)>>> variants() {
  return {
      {"default", [](ModelConfig&) {}},
      {"learned", [](ModelConfig& c) { c.pos_encoding = "learned"; }},
      {"sinusoidal", [](ModelConfig& c) { c.pos_encoding = "sinusoidal"; }},
      {"rmsnorm", [](ModelConfig& c) { c.norm = "rmsnorm"; }},
      {"bias", [](ModelConfig& c) { c.bias = true; }},
      {"relu2", [](ModelConfig& c) { c.mlp = "relu2"; }},
      {"swiglu", [](ModelConfig& c) { c.mlp = "swiglu"; }},
      {"qk_norm", [](ModelConfig& c) { c.qk_norm = true; }},
      {"gqa", [](ModelConfig& c) {
         c.n_head = 4;
         c.n_kv_head = 2;
       }},
      {"untied", [](ModelConfig& c) { c.tie_embeddings = false; }},
      {"softcap", [](ModelConfig& c) { c.logit_softcap = 3.0; }},
      {"wide", [](ModelConfig& c) {  // rows in many blocks of four per thread
         c.n_embd = 128;
         c.n_head = 4;
       }},
      {"everything", [](ModelConfig& c) {
         c.bias = true;
         c.norm = "rmsnorm";
         c.mlp = "swiglu";
         c.qk_norm = true;
         c.n_head = 4;
         c.n_kv_head = 1;
         c.tie_embeddings = false;
         c.logit_softcap = 5.0;
         c.n_embd = 48;  // swiglu hidden 128
       }},
  };
}

// max |a - b| <= 1e-5 * max |b| (and a floor for all-tiny logits).
void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  const double err = (a - b).abs().max().item<double>(), scale = b.abs().max().item<double>();
  EXPECT_LE(err, 1e-5 * scale + 1e-6) << what << ": max error " << err << " for logits up to " << scale;
}

}  // namespace

TEST(Decoder, LogitsAndCacheEqualTheGeneralPathAcrossTheSwitches) {
  c10::InferenceMode inference;
  for (const auto& [name, tweak] : variants()) {
    ModelConfig c = tiny_config();
    tweak(c);
    // ctest runs with one thread; here the decoder gets two (its first 16 steps alternate in pairs
    // between one thread and both, so every variant runs both ways: rows and kv heads split
    // between the threads of one parallel region, and everything on one).
    const int threads = 2;
    GPT model = perturbed_model(c);
    ASSERT_TRUE(decoder_supports(*model)) << name;
    Decoder decoder(*model);
    const bool slides = c.pos_encoding == "rope";
    for (int64_t B : {1, 3}) {
      torch::manual_seed(B);
      const int64_t prompt = 3, steps = slides ? 3 * c.block_size : c.block_size - prompt;  // RoPE: well past block_size
      auto tokens = torch::randint(c.vocab_size, {B, prompt + steps}, torch::kLong);  // (B, prompt + steps)
      KVCache general = model->make_cache(), fast = model->make_cache(), mixed = model->make_cache();
      for (auto* cache : {&general, &fast, &mixed}) model->forward_cached(tokens.narrow(1, 0, prompt), *cache);
      for (int64_t s = 0; s < steps; ++s) {
        const std::string what = name + ", B " + std::to_string(B) + ", position " + std::to_string(prompt + s);
        auto next = tokens.select(1, prompt + s);                        // (B,)
        auto want = model->forward_cached(next.unsqueeze(1), general);  // (B, V)
        at::set_num_threads(threads);
        auto got = decoder.step(next, fast);  // (B, V)
        // A cache filled by either path goes on with the other.
        auto alternating = s % 2 ? decoder.step(next, mixed) : model->forward_cached(next.unsqueeze(1), mixed);
        at::set_num_threads(1);
        ASSERT_EQ(got.sizes(), want.sizes()) << what;
        expect_close(got, want, what);
        expect_close(alternating, want, what + " (alternating)");
        ASSERT_EQ(fast.length(), general.length()) << what;
      }
      for (int64_t l = 0; l < c.n_layer; ++l) {
        expect_close(fast.k[l], general.k[l], name + " keys");
        expect_close(fast.v[l], general.v[l], name + " values");
      }
    }
  }
}

TEST(Decoder, GenerateAndBeamSearchGiveTheSameTokensEitherWay) {
  for (const std::string pos : {"rope", "learned"}) {
    ModelConfig c = tiny_config();
    c.pos_encoding = pos;
    c.bias = true;
    GPT model = perturbed_model(c);
    SamplingOptions fast, general;
    fast.temperature = general.temperature = 1.0;
    fast.top_k = general.top_k = 8;
    fast.top_p = general.top_p = 0.95;
    general.fast_decoder = false;
    for (int64_t B : {1, 3}) {
      std::mt19937_64 a(7), b(7);
      // 30 new tokens: past block_size (sliding with RoPE, re-filled windows with learned positions)
      EXPECT_EQ(generate(model, {1, 2}, B, 30, fast, a), generate(model, {1, 2}, B, 30, general, b)) << pos << " B " << B;
    }
    BeamOptions wide, wide_general;
    wide.width = wide_general.width = 3;
    wide_general.fast_decoder = false;
    auto x = beam_search(model, {1}, 12, wide), y = beam_search(model, {1}, 12, wide_general);
    ASSERT_EQ(x.size(), y.size()) << pos;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].tokens, y[i].tokens) << pos << " beam " << i;
      EXPECT_NEAR(x[i].log_prob, y[i].log_prob, 1e-4) << pos << " beam " << i;
    }
  }
}

TEST(Decoder, RejectsBadInputAndModelsItCannotRun) {
  torch::NoGradGuard no_grad;
  ModelConfig c = tiny_config();
  c.pos_encoding = "learned";
  GPT model = perturbed_model(c);
  Decoder decoder(*model);
  KVCache cache = model->make_cache();
  model->forward_cached(torch::tensor({{1, 2}}, torch::kLong), cache);
  EXPECT_THROW(decoder.step(torch::tensor({13}, torch::kLong), cache), std::invalid_argument);  // vocab is 0..12
  EXPECT_THROW(decoder.step(torch::tensor({-1}, torch::kLong), cache), std::invalid_argument);
  EXPECT_THROW(decoder.step(torch::tensor({1.0f}), cache), std::invalid_argument);
  EXPECT_THROW(decoder.step(torch::tensor({1, 2}, torch::kLong), cache), std::invalid_argument);  // the cache holds B = 1
  for (int64_t s = 2; s < c.block_size; ++s) decoder.step(torch::tensor({1}, torch::kLong), cache);
  EXPECT_THROW(decoder.step(torch::tensor({1}, torch::kLong), cache), std::invalid_argument);  // learned positions end
  EXPECT_EQ(cache.length(), c.block_size);

  model->train();
  EXPECT_FALSE(decoder_supports(*model));
  EXPECT_THROW(Decoder{*model}, std::invalid_argument);
  model->eval();
  model->to(torch::kDouble);
  EXPECT_FALSE(decoder_supports(*model));
}
