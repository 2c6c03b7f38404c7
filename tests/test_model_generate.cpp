// Sampling: filters on hand-made logits, greedy decoding, determinism, the KV cache giving the
// same tokens as full recomputation, past block_size too, and bad input.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/generate.h"
#include "model/static_decoder.h"

using namespace nanogpt::model;

namespace {
GPT tiny_model(int64_t block = 8, const std::string& pos = "rope", int64_t n_layer = 2) {
  ModelConfig c;
  c.vocab_size = 13;
  c.block_size = block;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = 16;
  c.pos_encoding = pos;
  c.attention = "math";
  torch::manual_seed(0);
  GPT model(c);
  torch::NoGradGuard no_grad;  // peaked attention, so that which tokens are in the context matters
  for (auto& p : model->named_parameters())
    if (p.key().find("q_proj") != std::string::npos || p.key().find("k_proj") != std::string::npos) p.value().mul_(30);
  return model;
}

// nanoGPT's sample.py, greedy: every token is the argmax of a full forward over the last
// block_size tokens (or the last `window`, when given).
std::vector<int64_t> crop_and_recompute_greedy(GPT& model, std::vector<int64_t> seq, int64_t n, int64_t window = 0) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t block = window > 0 ? window : model->config().block_size;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(seq.size()) - block);
    auto idx = torch::tensor(std::vector<int64_t>(seq.begin() + start, seq.end())).unsqueeze(0);
    seq.push_back(model->forward(idx).first.argmax(-1).item<int64_t>());
  }
  return seq;
}
}  // namespace

TEST(Sampling, TopKKeepsOnlyTheKMostLikelyAndRenormalises) {
  auto logits = torch::tensor({1.0f, 5.0f, 3.0f, 4.0f, 2.0f});
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 2;
  o.top_p = 1.0;
  auto p = filtered_probs(logits, o);
  const double e5 = std::exp(5.0), e4 = std::exp(4.0);
  EXPECT_NEAR(p[1].item<double>(), e5 / (e5 + e4), 1e-6);
  EXPECT_NEAR(p[3].item<double>(), e4 / (e5 + e4), 1e-6);
  EXPECT_EQ(p[0].item<double>() + p[2].item<double>() + p[4].item<double>(), 0.0);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 500; ++i) {
    const int64_t t = draw_token(p, rng);
    EXPECT_TRUE(t == 1 || t == 3);
  }
}

// Sampling's loops (CPU fp32 logits, no top-p) against the tensor operations, on rows with ties at
// the k-th value and at the maximum: the same tokens kept, the same probabilities.
TEST(Sampling, TheRowLoopsGiveTheTensorPathsProbabilities) {
  torch::manual_seed(5);
  auto logits = torch::randn({3, 97}) * 3.0;
  logits[1].narrow(0, 10, 6).fill_(30.0);  // six equal largest: top-k 1 and 3 cut into the tie, and keep all six
  logits[2][7] = 20.0;
  logits[2][40] = 20.0;  // two maxima: greedy takes the first
  for (double temperature : {0.0, 0.7, 1.0, 1.6})
    for (int64_t top_k : {0, 1, 3, 12, 96, 97, 200}) {
      SamplingOptions o;
      o.temperature = temperature;
      o.top_k = top_k;
      o.top_p = 1.0;
      const auto fast = filtered_probs(logits, o), reference = filtered_probs_tensors(logits, o);
      ASSERT_EQ(fast.sizes(), reference.sizes());
      EXPECT_TRUE(torch::equal(fast == 0, reference == 0)) << "temperature " << temperature << ", top_k " << top_k;
      EXPECT_LT((fast - reference).abs().max().item<double>(), 1e-6) << "temperature " << temperature << ", top_k " << top_k;
      EXPECT_NEAR(fast.sum(-1).min().item<double>(), 1.0, 1e-5);
      // One row, as the sampler hands it over.
      EXPECT_TRUE(torch::allclose(filtered_probs(logits[1], o), reference[1], 0.0, 1e-6));
    }
  SamplingOptions greedy;
  greedy.temperature = 0.0;
  EXPECT_EQ(filtered_probs(logits, greedy)[2].argmax().item<int64_t>(), 7);
}

TEST(Sampling, TopPKeepsSmallestSetReachingP) {
  auto probs = torch::tensor({0.5, 0.05, 0.3, 0.15});
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 0;
  o.top_p = 0.75;  // 0.5 + 0.3 = 0.8 >= 0.75: keeps tokens 0 and 2
  auto p = filtered_probs(probs.log(), o);
  EXPECT_NEAR(p[0].item<double>(), 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(p[2].item<double>(), 0.3 / 0.8, 1e-6);
  EXPECT_EQ(p[1].item<double>(), 0.0);
  EXPECT_EQ(p[3].item<double>(), 0.0);
  o.top_p = 0.1;  // the most likely token is always kept
  p = filtered_probs(probs.log(), o);
  EXPECT_NEAR(p[0].item<double>(), 1.0, 1e-6);
  std::mt19937_64 rng(2);
  std::set<int64_t> seen;
  o.top_p = 0.75;
  p = filtered_probs(probs.log(), o);
  for (int i = 0; i < 500; ++i) seen.insert(draw_token(p, rng));
  EXPECT_EQ(seen, (std::set<int64_t>{0, 2}));
}

TEST(Sampling, DrawFollowsTheDistribution) {
  auto p = torch::tensor({0.2, 0.8});
  std::mt19937_64 rng(3);
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += draw_token(p, rng) == 1;
  EXPECT_NEAR(ones / 4000.0, 0.8, 0.03);
}

TEST(Sampling, TopKOneAndTemperatureZeroAreGreedy) {
  auto model = tiny_model();
  const std::vector<int64_t> prompt{1, 2, 3};
  SamplingOptions greedy;
  greedy.top_k = 1;
  std::mt19937_64 rng(4);
  auto out = generate(model, prompt, 1, 5, greedy, rng)[0];  // 8 tokens: within block_size
  EXPECT_EQ(out, crop_and_recompute_greedy(model, prompt, 5));
  SamplingOptions zero_temp;
  zero_temp.temperature = 0.0;
  EXPECT_EQ(generate(model, prompt, 1, 5, zero_temp, rng)[0], out);
}

// Past block_size, over three blocks: nanoGPT's crop-and-recompute for learned and sinusoidal
// positions, for RoPE with exact_window, without the cache, and for a one-layer RoPE model with the
// sliding cache (where sliding is exact: see generate.h).
TEST(Sampling, PastBlockSizeEqualsCropAndRecompute) {
  struct Case {
    const char* pos;
    int64_t n_layer;
    bool use_cache, exact_window;
  };
  for (const Case c : {Case{"learned", 2, true, false}, Case{"sinusoidal", 2, true, false}, Case{"rope", 2, true, true},
                       Case{"rope", 2, false, false}, Case{"learned", 2, false, false}, Case{"rope", 1, true, false}}) {
    SCOPED_TRACE(std::string(c.pos) + " n_layer=" + std::to_string(c.n_layer) + (c.use_cache ? "" : " no cache") +
                 (c.exact_window ? " exact_window" : ""));
    auto model = tiny_model(8, c.pos, c.n_layer);
    SamplingOptions greedy;
    greedy.temperature = 0.0;
    greedy.use_cache = c.use_cache;
    greedy.exact_window = c.exact_window;
    std::mt19937_64 rng(4);
    const std::vector<int64_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // longer than block_size
    EXPECT_EQ(generate(model, prompt, 1, 24, greedy, rng)[0], crop_and_recompute_greedy(model, prompt, 24));
  }
}

TEST(Sampling, SameSeedSameOutputAndCacheEqualsRecompute) {
  auto model = tiny_model();
  const std::vector<int64_t> prompt{4};
  SamplingOptions cached, uncached;
  cached.temperature = uncached.temperature = 1.0;
  cached.exact_window = true;  // a two-layer RoPE model: sample.py's logits past block_size
  uncached.use_cache = false;
  std::mt19937_64 a(5), b(5), c(5);
  auto x = generate(model, prompt, 3, 30, cached, a);  // 30 tokens > 3 x block_size
  auto y = generate(model, prompt, 3, 30, cached, b);
  auto z = generate(model, prompt, 3, 30, uncached, c);
  EXPECT_EQ(x, y);
  EXPECT_EQ(x, z);
  EXPECT_NE(x[0], x[1]);  // rows of a batch are independent samples
}

TEST(Sampling, RestoresTheModelsMode) {
  auto model = tiny_model();
  std::mt19937_64 rng(7);
  model->train();
  generate(model, {1}, 1, 3, SamplingOptions{}, rng);
  EXPECT_TRUE(model->is_training());
  model->eval();
  generate(model, {1}, 1, 3, SamplingOptions{}, rng);
  EXPECT_FALSE(model->is_training());
}

// cuDNN's attention builds a plan for every new sequence length (a decode step's length grows by
// one each token): sampling turns it off for its duration and leaves the setting as it found it.
TEST(Sampling, TurnsCudnnAttentionOffWhileSamplingAndRestoresIt) {
  auto model = tiny_model();
  auto& context = at::globalContext();
  const bool initial = context.userEnabledCuDNNSDP();
  for (const bool before : {true, false}) {
    context.setSDPUseCuDNN(before);
    std::mt19937_64 rng(7);
    std::vector<bool> during;
    generate(model, {1}, 1, 3, SamplingOptions{}, rng, [&](const std::vector<int64_t>&, const torch::Tensor&) {
      during.push_back(context.userEnabledCuDNNSDP());
      return true;
    });
    EXPECT_EQ(during, std::vector<bool>(3, false));
    EXPECT_EQ(context.userEnabledCuDNNSDP(), before);
    BeamOptions beam;
    beam.width = 2;
    beam_search(model, {1}, 3, beam, [&](const std::vector<int64_t>&) {
      during.push_back(context.userEnabledCuDNNSDP());
      return false;
    });
    EXPECT_EQ(during, std::vector<bool>(during.size(), false));
    EXPECT_GT(during.size(), 3u);
    EXPECT_EQ(context.userEnabledCuDNNSDP(), before);
  }
  context.setSDPUseCuDNN(initial);
}

TEST(Sampling, NonFiniteLogitsAreAnErrorNotAToken) {
  auto model = tiny_model();
  {
    torch::NoGradGuard no_grad;
    model->named_parameters()["ln_f.weight"].fill_(std::numeric_limits<float>::quiet_NaN());
  }
  std::mt19937_64 rng(8);
  for (const bool cache : {true, false}) {
    SamplingOptions o;
    o.use_cache = cache;
    try {
      generate(model, {1}, 1, 3, o, rng);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("non-finite logits"), std::string::npos) << e.what();
    }
  }
}

TEST(Sampling, OptionsAreValidated) {
  auto model = tiny_model();
  std::mt19937_64 rng(9);
  for (const double t : {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    SamplingOptions o;
    o.temperature = t;
    EXPECT_THROW(o.validate(), std::invalid_argument) << t;
    EXPECT_THROW(generate(model, {1}, 1, 3, o, rng), std::invalid_argument) << t;
  }
  SamplingOptions k, p0, p2;
  k.top_k = -1;
  p0.top_p = 0.0;
  p2.top_p = 1.5;
  for (const auto& o : {k, p0, p2}) EXPECT_THROW(o.validate(), std::invalid_argument);
  EXPECT_NO_THROW(SamplingOptions{}.validate());
}

TEST(Sampling, CallbackCanStopEarly) {
  auto model = tiny_model();
  std::mt19937_64 rng(6);
  int calls = 0;
  auto out = generate(model, {1}, 1, 50, SamplingOptions{}, rng,
                      [&](const std::vector<int64_t>&, const torch::Tensor& probs) {
                        EXPECT_EQ(probs.sizes(), torch::IntArrayRef({1, 13}));  // the distribution drawn from
                        return ++calls < 5;
                      });
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(out[0].size(), 6u);
}


namespace {
// log P(continuation | prompt) of each row of `seqs` (N, P + L) under a full forward: the reference.
torch::Tensor sequence_log_probs(GPT& model, const torch::Tensor& seqs, int64_t P) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto log_probs = torch::log_softmax(model->logits(seqs).to(torch::kDouble), -1);  // (N, P + L, V)
  const int64_t L = seqs.size(1) - P;
  auto next = seqs.narrow(1, P, L).unsqueeze(-1);                                   // (N, L, 1)
  return log_probs.narrow(1, P - 1, L).gather(-1, next).squeeze(-1).sum(-1);        // (N,)
}
}  // namespace

TEST(BeamSearch, WidthOneIsGreedy) {
  for (const char* pos : {"rope", "learned"}) {
    auto model = tiny_model(8, pos);
    const std::vector<int64_t> prompt{1, 2, 3};
    SamplingOptions greedy;
    greedy.temperature = 0.0;
    std::mt19937_64 rng(1);
    BeamOptions one;
    one.width = 1;
    auto beams = beam_search(model, prompt, 20, one);  // past block_size
    ASSERT_EQ(beams.size(), 1u);
    EXPECT_EQ(beams[0].tokens, generate(model, prompt, 1, 20, greedy, rng)[0]) << pos;
    EXPECT_EQ(beams[0].generated, 20);
  }
}

// Three new tokens from a vocabulary of 13: all 2,197 continuations can be scored. A beam as wide as
// the number of two-token prefixes keeps every one of them, so it must find the most probable
// continuation; narrower beams must never end below greedy decoding. Reported log-probabilities are
// the reference's.
TEST(BeamSearch, FindsTheBruteForceBestAndNeverLosesToGreedy) {
  for (const uint64_t seed : {0, 1, 2, 3}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto model = tiny_model(8, "rope");
    {
      torch::NoGradGuard no_grad;
      torch::manual_seed(seed);
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.3);  // a different, peaked model per seed
    }
    const std::vector<int64_t> prompt{5, 1};
    const int64_t P = 2, L = 3, V = 13;
    auto all = torch::empty({V * V * V, P + L}, torch::kLong);  // every continuation
    for (int64_t i = 0; i < V * V * V; ++i) {
      all[i][0] = 5;
      all[i][1] = 1;
      all[i][2] = i / (V * V);
      all[i][3] = i / V % V;
      all[i][4] = i % V;
    }
    auto scores = sequence_log_probs(model, all, P);  // (V³,)
    const int64_t best = scores.argmax().item<int64_t>();

    BeamOptions wide;
    wide.width = V * V;
    auto beams = beam_search(model, prompt, L, wide);
    ASSERT_FALSE(beams.empty());
    EXPECT_EQ(beams[0].tokens, std::vector<int64_t>(all[best].data_ptr<int64_t>(), all[best].data_ptr<int64_t>() + P + L));
    EXPECT_NEAR(beams[0].log_prob, scores[best].item<double>(), 1e-5);
    for (size_t i = 1; i < beams.size(); ++i) EXPECT_LE(beams[i].log_prob, beams[i - 1].log_prob);  // best first

    SamplingOptions greedy;
    greedy.temperature = 0.0;
    std::mt19937_64 rng(1);
    auto g = generate(model, prompt, 1, L, greedy, rng)[0];
    const double greedy_lp =
        sequence_log_probs(model, torch::tensor(g).unsqueeze(0), P).item<double>();
    for (const int64_t width : {2, 3, 5}) {
      BeamOptions o;
      o.width = width;
      auto b = beam_search(model, prompt, L, o);
      EXPECT_GE(b[0].log_prob, greedy_lp - 1e-5) << "width " << width;  // fp32 log-softmax against the fp64 reference
      EXPECT_NEAR(b[0].log_prob, sequence_log_probs(model, torch::tensor(b[0].tokens).unsqueeze(0), P).item<double>(), 1e-5);
    }
  }
}

TEST(BeamSearch, FinishedBeamsStopAndLengthNormalisationRanksPerToken) {
  auto model = tiny_model();
  BeamOptions o;
  o.width = 3;
  // A beam is finished as soon as it emits token 0: finished beams are shorter than the rest.
  auto finished = [](const std::vector<int64_t>& tokens) { return tokens.back() == 0; };
  auto beams = beam_search(model, {1}, 12, o, finished);
  ASSERT_FALSE(beams.empty());
  for (const auto& b : beams) {
    const auto zero = std::find(b.tokens.begin() + 1, b.tokens.end(), 0);
    EXPECT_TRUE(zero == b.tokens.end() || zero == b.tokens.end() - 1);  // nothing after the finishing token
    EXPECT_EQ(static_cast<int64_t>(b.tokens.size()), 1 + b.generated);
  }
  o.length_normalize = true;
  auto normalised = beam_search(model, {1}, 12, o, finished);
  for (size_t i = 1; i < normalised.size(); ++i) EXPECT_LE(normalised[i].score(true), normalised[i - 1].score(true));
  BeamOptions zero;
  zero.width = 0;
  EXPECT_THROW(beam_search(model, {1}, 3, zero), std::invalid_argument);
}

// ---- The static KV cache and the device-side step (model/static_decoder.h), on the CPU ----

namespace {
GPT static_test_model(const std::string& pos, int64_t n_head, int64_t n_kv_head, bool modern = false) {
  ModelConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = n_head;
  c.n_kv_head = n_kv_head;
  c.n_embd = 16;
  c.pos_encoding = pos;
  c.attention = "math";
  if (modern) {  // every switch the step reads beyond nanoGPT's recipe
    c.qk_norm = true;
    c.norm = "rmsnorm";
    c.mlp = "swiglu";
    c.tie_embeddings = false;
    c.logit_softcap = 5.0;
    c.bias = false;
  } else {
    c.bias = true;
  }
  torch::manual_seed(0);
  GPT model(c);
  torch::NoGradGuard no_grad;  // peaked attention, as tiny_model: which tokens are in the context matters
  for (auto& p : model->named_parameters())
    if (p.key().find("q_proj") != std::string::npos || p.key().find("k_proj") != std::string::npos) p.value().mul_(30);
  return model;
}
}  // namespace

// Greedy text through the static cache equals generate()'s general path (the lesson's model, no
// hand-written decoder), in fp32: prompts of one token, a few, and longer than block_size; the RoPE
// window sliding and exact; learned and sinusoidal positions recomputing their window; grouped-query
// heads; the modern switches; a batch of 3.
TEST(StaticDecode, GreedyTextEqualsGenerate) {
  struct Case {
    const char* pos;
    int64_t n_head, n_kv_head;
    bool modern, exact_window;
  };
  for (const Case c : {Case{"rope", 2, 2, false, false}, Case{"rope", 4, 2, false, false}, Case{"rope", 4, 1, true, false},
                       Case{"rope", 4, 2, false, true}, Case{"learned", 2, 2, false, false},
                       Case{"sinusoidal", 4, 2, true, false}})
    for (const std::vector<int64_t>& prompt :
         {std::vector<int64_t>{4}, std::vector<int64_t>{1, 2, 3}, std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}}) {
      SCOPED_TRACE(fmt::format("{} nh={} nkv={}{}{} prompt of {}", c.pos, c.n_head, c.n_kv_head, c.modern ? " modern" : "",
                               c.exact_window ? " exact_window" : "", prompt.size()));
      auto model = static_test_model(c.pos, c.n_head, c.n_kv_head, c.modern);
      SamplingOptions greedy;
      greedy.temperature = 0.0;
      greedy.exact_window = c.exact_window;
      greedy.fast_decoder = false;
      std::mt19937_64 rng(1);
      auto expected = generate(model, prompt, 3, 20, greedy, rng);  // 20 new tokens: past block_size (8)
      StaticDecoder decoder(model, 3, torch::kFloat, c.exact_window);
      auto got = generate_static(decoder, prompt, 3, 20, greedy);
      EXPECT_EQ(got, expected);
    }
}

// max_context N: every step's logits are those of a window of the last N tokens (within fp32
// rounding), and its greedy token their argmax. With learned or sinusoidal positions, or RoPE's exact
// window, the reference is sample.py's recompute of the last N tokens (a full forward, no cache);
// with RoPE's sliding window it is the general path of the same weights in a model whose block_size
// is N (its KV cache slides at N). Prompts shorter and longer than N, 20 new tokens past it, two
// slots; and the logits are not block_size's window's (the window is really applied).
TEST(StaticDecode, MaxContextIsTheWindow) {
  struct Case {
    const char* pos;
    int64_t n_head, n_kv_head;
    bool modern, exact_window;
  };
  for (const Case c : {Case{"rope", 4, 2, false, false}, Case{"rope", 4, 1, true, false}, Case{"rope", 4, 2, false, true},
                       Case{"learned", 2, 2, false, false}, Case{"sinusoidal", 4, 2, true, false}})
    for (const int64_t N : {1, 3, 5})
      for (const std::vector<int64_t>& prompt : {std::vector<int64_t>{4, 9}, std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}}) {
        SCOPED_TRACE(fmt::format("{} nh={} nkv={}{}{} max_context {} prompt of {}", c.pos, c.n_head, c.n_kv_head,
                                 c.modern ? " modern" : "", c.exact_window ? " exact_window" : "", N, prompt.size()));
        auto model = static_test_model(c.pos, c.n_head, c.n_kv_head, c.modern);
        const bool sliding = std::string(c.pos) == "rope" && !c.exact_window;
        ModelConfig shorter = model->config();
        shorter.block_size = N;
        GPT windowed(shorter);  // the same weights, block_size N (RoPE: no table among the weights)
        c10::InferenceMode inference;
        auto from = model->named_parameters();
        if (sliding)
          for (auto& p : windowed->named_parameters()) p.value().copy_(from[p.key()]);
        windowed->eval();
        model->eval();
        auto last = [](const std::vector<int64_t>& seq, int64_t n) {  // (1, <= n): the last n tokens
          const int64_t begin = std::max<int64_t>(0, static_cast<int64_t>(seq.size()) - n);
          return torch::tensor(std::vector<int64_t>(seq.begin() + begin, seq.end()), torch::kLong).view({1, -1});
        };
        KVCache slid;
        auto reference = [&](const std::vector<int64_t>& seq) -> torch::Tensor {  // (V,)
          if (!sliding) return model->forward(last(seq, N)).first.view({-1});
          if (slid.k.empty()) {
            slid = windowed->make_cache();
            return windowed->forward_cached(last(seq, N), slid)[0];
          }
          return windowed->forward_cached(last(seq, 1), slid)[0];
        };
        SamplingOptions greedy;
        greedy.temperature = 0.0;
        StaticDecoder decoder(model, 2, torch::kFloat, c.exact_window, N);
        EXPECT_EQ(decoder.window(), N);
        std::vector<int64_t> seq = prompt;
        for (int64_t s = 0; s < 2; ++s) {
          decoder.set_options(s, greedy);
          decoder.start(s, seq);
        }
        int64_t other_than_block_size = 0;
        for (int step = 0; step < 20; ++step) {
          for (int64_t s = 0; s < 2; ++s)
            if (decoder.needs_restart(s)) decoder.start(s, seq);
          const auto tokens = decoder.step(2);
          const auto logits = decoder.logits(2);
          const auto expected = reference(seq);
          for (int64_t s = 0; s < 2; ++s) {
            EXPECT_TRUE(torch::allclose(logits[s], expected, 1e-5, 1e-5))
                << "step " << step << ": " << (logits[s] - expected).abs().max().item<float>();
            EXPECT_EQ(tokens[s], expected.argmax().item<int64_t>()) << "step " << step;
          }
          const auto whole_block = model->forward(last(seq, 8)).first.view({-1});
          if ((whole_block - expected).abs().max().item<float>() > 1e-3) ++other_than_block_size;
          seq.push_back(tokens[0]);
        }
        EXPECT_GT(other_than_block_size, 0) << "a window of " << N << " gave block_size's logits at every step";
      }
}

// The static cache's buffers are as long as asked: N positions a slot, block_size by default; a
// length of 0 is block_size, a negative one or one past block_size is refused (so is the decoder's).
TEST(StaticDecode, TheCacheIsAllocatedForMaxContextPositions) {
  auto model = static_test_model("rope", 4, 2);
  const auto& config = model->config();
  StaticKVCache three(config, 2, torch::TensorOptions(), 3), full(config, 2, torch::TensorOptions());
  ASSERT_EQ(three.k.size(), 2u);
  for (size_t l = 0; l < three.k.size(); ++l) {
    EXPECT_EQ(three.k[l].sizes(), (std::vector<int64_t>{2, 2, 3, 4}));
    EXPECT_EQ(three.v[l].sizes(), (std::vector<int64_t>{2, 2, 3, 4}));
    EXPECT_EQ(full.k[l].size(2), 8);
  }
  EXPECT_EQ(three.length(), 3);
  EXPECT_EQ(StaticDecoder(model, 1, torch::kFloat, false).window(), 8);
  for (const int64_t bad : {-1, 9}) {
    EXPECT_THROW(StaticKVCache(config, 1, torch::TensorOptions(), bad), std::invalid_argument) << bad;
    try {
      StaticDecoder decoder(model, 1, torch::kFloat, false, bad);
      ADD_FAILURE() << "max_context " << bad << " was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("max_context ({}) must be in [1, block_size] = [1, 8]", bad)),
                std::string::npos)
          << e.what();
    }
  }
}

// Sequences of different lengths side by side in the slots, one entering later and one moved to
// another slot: every step's logits equal the general path's for that sequence alone (its own KV
// cache, forward_cached one token at a time), within fp32 rounding.
TEST(StaticDecode, SlotsOfDifferentLengthsGiveEachSequencesOwnLogits) {
  auto model = static_test_model("rope", 4, 2);
  c10::InferenceMode inference;
  SamplingOptions greedy;
  greedy.temperature = 0.0;
  std::vector<std::vector<int64_t>> seqs = {{1}, {2, 3, 4, 5}, {6, 7, 8, 9, 10, 11, 12, 1, 2, 3}};
  std::vector<torch::Tensor> expected_logits(3);
  std::vector<KVCache> caches(3);
  auto reference = [&](int64_t i) {  // the general path's next logits for sequence i, alone
    auto& s = seqs[i];
    auto& cache = caches[i];
    if (cache.k.empty()) {
      const int64_t begin = std::max<int64_t>(0, static_cast<int64_t>(s.size()) - 8);
      auto window = torch::tensor(std::vector<int64_t>(s.begin() + begin, s.end()), torch::kLong).view({1, -1});
      cache = model->make_cache();
      return model->forward_cached(window, cache)[0];
    }
    return model->forward_cached(torch::tensor({s.back()}, torch::kLong).view({1, 1}), cache)[0];
  };
  StaticDecoder decoder(model, 3, torch::kFloat, /*exact_window=*/false);
  for (int64_t i = 0; i < 2; ++i) {
    decoder.set_options(i, greedy);
    decoder.start(i, seqs[i]);
  }
  std::vector<int64_t> slot_of = {0, 1, -1};
  int64_t live = 2;
  for (int step = 0; step < 14; ++step) {
    if (step == 3) {  // the third sequence enters
      decoder.set_options(2, greedy);
      decoder.start(2, seqs[2]);
      slot_of[2] = 2;
      live = 3;
    }
    if (step == 7) {  // the first leaves; the third moves into its slot
      decoder.move(2, 0);
      slot_of = {-1, 1, 0};
      live = 2;
    }
    auto tokens = decoder.step(live);
    auto logits = decoder.logits(live);
    for (int64_t i = 0; i < 3; ++i) {
      if (slot_of[i] < 0) continue;
      auto expected = reference(i);
      EXPECT_TRUE(torch::allclose(logits[slot_of[i]], expected, 1e-5, 1e-5))
          << "sequence " << i << " step " << step << ": " << (logits[slot_of[i]] - expected).abs().max().item<float>();
      EXPECT_EQ(tokens[slot_of[i]], expected.argmax().item<int64_t>());
      seqs[i].push_back(tokens[slot_of[i]]);
    }
  }
}

// The row-wise filters give filtered_probs_tensors' distribution for each row's own options: the
// same tokens kept (ties at the k-th value and at the top-p cut included), the same probabilities.
TEST(StaticDecode, RowFiltersGiveEachRowsFilteredProbs) {
  torch::manual_seed(5);
  auto logits = torch::randn({7, 41}) * 3.0;
  logits[1].narrow(0, 10, 6).fill_(30.0);  // six equal largest
  logits[2][7] = 20.0;
  logits[2][30] = 20.0;  // two maxima: greedy takes the first
  struct Row {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  const std::vector<Row> rows = {{1.0, 0, 1.0}, {0.7, 3, 1.0}, {0.0, 0, 1.0}, {1.3, 12, 0.9},
                                 {0.8, 0, 0.5}, {1.0, 41, 0.2}, {2.0, 200, 0.999}};
  RowOptions options(8, torch::kCPU);
  for (size_t r = 0; r < rows.size(); ++r) options.set(static_cast<int64_t>(r), rows[r].temperature, rows[r].top_k, rows[r].top_p);
  auto got = filtered_probs_rows(logits, options);
  for (size_t r = 0; r < rows.size(); ++r) {
    SamplingOptions o;
    o.temperature = rows[r].temperature;
    o.top_k = rows[r].top_k;
    o.top_p = rows[r].top_p;
    auto expected = filtered_probs_tensors(logits[static_cast<int64_t>(r)], o);
    EXPECT_TRUE(torch::equal(got[static_cast<int64_t>(r)] > 0, expected > 0)) << "row " << r << ": the tokens kept";
    EXPECT_TRUE(torch::allclose(got[static_cast<int64_t>(r)], expected, 1e-6, 1e-7)) << "row " << r;
  }
}

// The exponential race draws each token with its probability: zero-probability tokens never, the
// others within 4.5 standard deviations of p n over 40,000 draws (every row at once, a seeded
// generator); the same seed draws the same tokens.
TEST(StaticDecode, TheExponentialRaceDrawsFromTheDistribution) {
  auto probs = torch::tensor({0.0, 0.5, 0.0, 0.3, 0.15, 0.05, 0.0}, torch::kFloat).unsqueeze(0).repeat({40000, 1});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto drawn = draw_rows(probs, gen);
  auto counts = torch::bincount(drawn, {}, 7).to(torch::kDouble);
  for (int64_t i = 0; i < 7; ++i) {
    const double p = probs[0][i].item<double>(), n = 40000.0;
    if (p == 0.0) EXPECT_EQ(counts[i].item<double>(), 0.0) << "token " << i;
    else EXPECT_NEAR(counts[i].item<double>(), p * n, 4.5 * std::sqrt(n * p * (1 - p))) << "token " << i;
  }
  EXPECT_TRUE(torch::equal(draw_rows(probs, at::make_generator<at::CPUGeneratorImpl>(11)), drawn));
  EXPECT_FALSE(torch::equal(draw_rows(probs, at::make_generator<at::CPUGeneratorImpl>(12)), drawn));
}

// Sampled through the static decoder: the callback sees every token, a seeded generator repeats
// itself, and every drawn token had a non-zero probability under top-k.
TEST(StaticDecode, SampledTokensComeFromTheFilteredDistribution) {
  auto model = static_test_model("rope", 2, 2);
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 3;
  auto run = [&](uint64_t seed, std::vector<std::vector<int64_t>>* seen) {
    StaticDecoder decoder(model, 2, torch::kFloat, false, 0, at::make_generator<at::CPUGeneratorImpl>(seed));
    return generate_static(
        decoder, {1, 2}, 2, 25, o,
        [&](const std::vector<int64_t>& tokens, const torch::Tensor& probs) {
          for (size_t b = 0; b < tokens.size(); ++b) EXPECT_GT(probs[b][tokens[b]].item<float>(), 0.0f);
          EXPECT_EQ((probs > 0).sum(-1).max().item<int64_t>(), 3);
          if (seen) seen->push_back(tokens);
          return true;
        },
        /*with_probs=*/true);
  };
  std::vector<std::vector<int64_t>> seen;
  auto a = run(3, &seen), b = run(3, nullptr);
  EXPECT_EQ(a, b);
  ASSERT_EQ(seen.size(), 25u);
  for (size_t t = 0; t < seen.size(); ++t) EXPECT_EQ(seen[t][0], a[0][2 + t]);
  EXPECT_NE(a[0], a[1]);
}
