// Beyond nanoGPT's recipe, the training side (issue 15): Muon's Newton–Schulz orthogonalisation and
// update against references written here, the warmup-stable-decay schedule, and exact resume with
// every new switch on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"
#include "train/muon.h"
#include "train/trainer.h"
#include "train_fixture.h"

using namespace nanogpt;
using namespace nanogpt::testing;

namespace {

// The same quintic Newton–Schulz iteration, in fp64, as a reference for the library's fp32/bf16.
torch::Tensor newton_schulz_reference(torch::Tensor G, int steps = 5) {
  auto X = G.to(torch::kDouble);
  const bool tall = X.size(0) > X.size(1);
  if (tall) X = X.t();
  X = X / (X.norm() + 1e-7);
  for (int i = 0; i < steps; ++i) {
    auto A = X.mm(X.t());
    X = 3.4445 * X + (-4.7750 * A + 2.0315 * A.mm(A)).mm(X);
  }
  return tall ? X.t() : X;
}

}  // namespace

// Every singular value of the result lies in a band around 1 — here measured as [0.68, 1.13] over
// random Gaussian matrices, tall, wide and square, in fp32 and in bf16 — and the singular vectors are
// G's (the result is close to U Vᵀ from an SVD).
TEST(Muon, NewtonSchulzPutsEverySingularValueInABandAroundOne) {
  torch::manual_seed(1);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{64, 16}, {16, 64}, {32, 32}, {128, 512}})
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      SCOPED_TRACE(std::to_string(shape[0]) + "x" + std::to_string(shape[1]) + (dtype == torch::kFloat ? " fp32" : " bf16"));
      auto G = torch::randn(shape);
      auto O = train::orthogonalize(G, dtype);
      ASSERT_EQ(O.sizes(), G.sizes());
      ASSERT_EQ(O.scalar_type(), torch::kFloat);
      auto sv = torch::linalg_svdvals(O.to(torch::kDouble));
      EXPECT_GE(sv.min().item<double>(), 0.6);
      EXPECT_LE(sv.max().item<double>(), 1.25);
      auto [U, S, Vh] = torch::linalg_svd(G.to(torch::kDouble), /*full_matrices=*/false);
      const double cosine = (O.to(torch::kDouble) * U.mm(Vh)).sum().item<double>() /
                            (O.to(torch::kDouble).norm().item<double>() * U.mm(Vh).norm().item<double>());
      EXPECT_GT(cosine, 0.97);  // the direction of U Vᵀ
      if (dtype == torch::kFloat) {
        EXPECT_TRUE(torch::allclose(O.to(torch::kDouble), newton_schulz_reference(G), 1e-4, 1e-5));
      }
    }
}

// Batched: each matrix of a mixed list (two shapes, tall and wide ones of the same size, a lone one)
// comes out as orthogonalize gives it alone — each normalised by its own norm, not the batch's — and
// in its own orientation; a batch (k, rows, cols) likewise.
TEST(Muon, SameShapedMatricesBatchedGiveEachOnesOwnResult) {
  torch::manual_seed(4);
  const std::vector<torch::Tensor> matrices = {torch::randn({32, 32}),      torch::randn({16, 64}) * 5,
                                               torch::randn({64, 16}),      torch::randn({32, 32}) * 0.01,
                                               torch::randn({16, 64}) * 0.3, torch::randn({8, 24})};
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(dtype == torch::kFloat ? "fp32" : "bf16");
    const auto all = train::orthogonalize_all(matrices, dtype);
    ASSERT_EQ(all.size(), matrices.size());
    const double tolerance = dtype == torch::kFloat ? 1e-5 : 2e-2;  // bf16: the batched products round elsewhere
    for (size_t i = 0; i < matrices.size(); ++i) {
      const auto alone = train::orthogonalize(matrices[i], dtype);
      ASSERT_EQ(all[i].sizes(), matrices[i].sizes()) << i;
      EXPECT_LT((all[i] - alone).abs().max().item<double>(), tolerance) << i;
    }
    const auto batch = torch::stack({matrices[0], matrices[3]});
    const auto O = train::orthogonalize(batch, dtype);
    EXPECT_LT((O[1] - train::orthogonalize(matrices[3], dtype)).abs().max().item<double>(), tolerance);
  }
}

// One step of the optimizer with Muon on: the blocks' matrices move by
// lr · muon_lr_scale · sqrt(max(1, rows/cols)) · NS((1-β) g + β m), with m = (1-β) g after one step
// from zero; everything else is AdamW's first step: θ (1 - lr wd) - lr g / (|g| + ε).
TEST(Muon, OneStepMatchesTheReference) {
  model::ModelConfig cfg;
  cfg.vocab_size = 11;
  cfg.block_size = 8;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  torch::manual_seed(2);
  model::GPT gpt(cfg);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& p : gpt->named_parameters()) named.emplace_back(p.key(), p.value());
  train::FlatAdamW::Options o;
  o.muon = true;
  o.muon_lr_scale = 20.0;
  o.muon_momentum = 0.9;
  o.muon_dtype = torch::kFloat;
  o.weight_decay = 0.1;
  train::FlatAdamW opt(named, o);
  ASSERT_EQ(opt.muon_names().size(), 2u * 6u);  // q, k, v, c_proj, c_fc, mlp.c_proj per block
  for (const auto& n : opt.muon_names()) EXPECT_EQ(n.rfind("h.", 0), 0u) << n;
  for (const auto& n : opt.decay_names()) EXPECT_NE(n.rfind("h.", 0), 0u) << n;  // wte only: embeddings stay AdamW
  std::map<std::string, torch::Tensor> before, grads;
  torch::manual_seed(3);
  for (auto& [name, p] : named) {
    before[name] = p.detach().clone();
    grads[name] = torch::randn_like(p);
    p.mutable_grad().copy_(grads[name]);
  }
  const double lr = 1e-3;
  opt.step(lr);
  std::set<std::string> muon(opt.muon_names().begin(), opt.muon_names().end());
  for (auto& [name, p] : named) {
    const auto g = grads[name].to(torch::kDouble);
    torch::Tensor expected;
    if (muon.count(name)) {
      const double beta = 0.9, scale = std::sqrt(std::max(1.0, double(p.size(0)) / double(p.size(1))));
      const auto m = (1 - beta) * g;
      expected = before[name].to(torch::kDouble) - lr * 20.0 * scale * newton_schulz_reference((1 - beta) * g + beta * m);
    } else {
      const double wd = p.dim() >= 2 ? 0.1 : 0.0;
      expected = before[name].to(torch::kDouble) * (1 - lr * wd) - lr * g / (g.abs() + 1e-8);
    }
    EXPECT_TRUE(torch::allclose(p.detach().to(torch::kDouble), expected, 1e-5, 1e-6)) << name;
  }
  // The momentum is part of the state to checkpoint.
  bool has_momentum = false;
  for (const auto& [name, t] : opt.state()) has_momentum |= name == "momentum.muon" && t.numel() == opt.muon_numel();
  EXPECT_TRUE(has_momentum);
}

TEST(LrSchedule, WarmupStableDecay) {
  train::LrSchedule s{1e-3, 1e-4, 100, 1000, true, /*wsd=*/true, /*decay_frac=*/0.2};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-3 * 1 / 101);  // the same warmup
  EXPECT_DOUBLE_EQ(s.at(100), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(800), 1e-3);          // stable until the last 20%
  EXPECT_NEAR(s.at(900), 1e-3 + 0.5 * (1e-4 - 1e-3), 1e-15);  // linear: halfway down at 90%
  EXPECT_NEAR(s.at(1000), 1e-4, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(5000), 1e-4);
  for (int64_t t = 100; t < 1000; ++t) EXPECT_LE(s.at(t + 1), s.at(t));
}

// Every new switch at once, resumed halfway: the same losses, bit for bit, as an uninterrupted run;
// and a Muon checkpoint refuses to resume as AdamW with a line that says so.
TEST(TrainModern, ResumeIsBitwiseExactWithEverySwitch) {
  TempDir dir("modern_resume");
  auto modern = [&](const std::string& sub) {
    auto c = tiny_config(dir.path + "/" + sub);
    c.optimizer = "muon";
    c.muon_learning_rate = 0.02;
    c.lr_schedule = "wsd";
    c.model.qk_norm = true;
    c.model.mlp = "relu2";
    c.model.tie_embeddings = false;
    c.model.logit_softcap = 15.0;
    c.model.norm = "rmsnorm";
    return c;
  };
  auto full = modern("full");
  train::Trainer(full, true).run();
  auto half = modern("half");
  half.max_iters = 10;
  train::Trainer(half, true).run();
  half.max_iters = 20;
  half.init_from = "resume";
  EXPECT_EQ(train::Trainer(half, true).run().iter, 20);
  auto a = train_losses(full.out_dir + "/metrics.csv"), b = train_losses(half.out_dir + "/metrics.csv");
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);

  auto as_adamw = modern("half");
  as_adamw.optimizer = "adamw";
  as_adamw.init_from = "resume";
  as_adamw.max_iters = 30;
  try {
    train::Trainer(as_adamw, true).run();
    ADD_FAILURE() << "resumed a Muon checkpoint with AdamW";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer: muon"), std::string::npos) << e.what();
  }
}
