// Training: LR schedule, decay groups, checkpoints, exact resume, signals, guards.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <memory>

#include "data/prepare.h"
#include "data/token_file.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/lr_schedule.h"
#include "train/run_id.h"
#include "train/step.h"
#include "train/trainer.h"
#include "train_fixture.h"

using namespace nanogpt;
using namespace nanogpt::testing;

TEST(LrSchedule, WarmupCosineAndFloorValues) {
  train::LrSchedule s{1e-3, 1e-4, 100, 5000, true};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-3 * 1 / 101);         // first warmup step
  EXPECT_DOUBLE_EQ(s.at(99), 1e-3 * 100 / 101);      // last warmup step
  EXPECT_DOUBLE_EQ(s.at(100), 1e-3);                 // end of warmup: peak
  EXPECT_NEAR(s.at(2550), 1e-4 + 0.5 * 9e-4, 1e-15); // middle of the cosine: halfway
  EXPECT_NEAR(s.at(5000), 1e-4, 1e-15);              // end of decay
  EXPECT_DOUBLE_EQ(s.at(7000), 1e-4);                // beyond: floor
  for (int64_t t = 100; t < 5000; ++t) EXPECT_LE(s.at(t + 1), s.at(t));
  train::LrSchedule constant{1e-3, 1e-4, 100, 5000, false};
  EXPECT_DOUBLE_EQ(constant.at(0), 1e-3);
  EXPECT_DOUBLE_EQ(constant.at(9999), 1e-3);
}

TEST(AdamW, DecayGroupsHoldMatricesOnlyInModelOrder) {
  model::ModelConfig c;
  c.vocab_size = 10;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.bias = true;
  c.pos_encoding = "learned";
  model::GPT gpt(c);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& p : gpt->named_parameters()) named.emplace_back(p.key(), p.value());
  train::FlatAdamW opt(named, {});
  std::vector<std::string> expect_decay, expect_no_decay;
  for (auto& [name, p] : named) (p.dim() >= 2 ? expect_decay : expect_no_decay).push_back(name);
  EXPECT_EQ(opt.decay_names(), expect_decay);
  EXPECT_EQ(opt.no_decay_names(), expect_no_decay);
  EXPECT_EQ(opt.decay_names().front(), "wte.weight");
  for (auto& n : opt.no_decay_names()) EXPECT_TRUE(n.find("bias") != std::string::npos || n.find("ln_") != std::string::npos) << n;
  EXPECT_EQ(opt.decay_numel() + opt.no_decay_numel(), gpt->num_params(false));
}

TEST(AdamW, MatchesLibTorchAdamW) {
  torch::manual_seed(0);
  auto a = torch::randn({5, 3}, torch::requires_grad()), b = torch::randn({3}, torch::requires_grad());
  auto a2 = a.detach().clone().requires_grad_(), b2 = b.detach().clone().requires_grad_();
  train::FlatAdamW ours({{"a", a}, {"b", b}}, {0.1, 0.9, 0.95, 1e-8});
  torch::optim::AdamW ref_decay({a2}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1));
  torch::optim::AdamW ref_plain({b2}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.0));
  for (int step = 0; step < 5; ++step) {
    auto x = torch::randn({4, 5});
    ((x.matmul(a) + b).pow(2).sum()).backward();
    ((x.matmul(a2) + b2).pow(2).sum()).backward();
    ours.step(1e-2);
    ours.zero_grad();
    ref_decay.step();
    ref_plain.step();
    ref_decay.zero_grad();
    ref_plain.zero_grad();
  }
  EXPECT_TRUE(torch::allclose(a, a2, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(b, b2, 1e-5, 1e-6));
}

TEST(AdamW, ClipsTheGlobalNorm) {
  auto a = torch::zeros({2, 2}, torch::requires_grad()), b = torch::zeros({2}, torch::requires_grad());
  train::FlatAdamW opt({{"a", a}, {"b", b}}, {});
  (a * torch::full({2, 2}, 3.0)).sum().backward();  // grad 3 everywhere
  (b * torch::full({2}, 4.0)).sum().backward();     // grad 4 everywhere
  const double norm = opt.clip_grad_norm(1.0).item<double>();
  EXPECT_NEAR(norm, std::sqrt(4 * 9.0 + 2 * 16.0), 1e-5);
  const double after = std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  EXPECT_NEAR(after, 1.0, 1e-5);
}

TEST(AdamW, NoGradForwardSeesTheUpdatedWeights) {
  // Regression: evaluation (NoGrad) once used a fused-weight cache keyed on parameter versions,
  // which the flat optimizer's in-place updates do not bump; eval losses went stale.
  torch::manual_seed(0);
  model::ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  model::GPT gpt(c);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& p : gpt->named_parameters()) named.emplace_back(p.key(), p.value());
  train::FlatAdamW opt(named, {});
  auto x = torch::randint(11, {2, 8}), y = torch::randint(11, {2, 8});
  for (int step = 0; step < 3; ++step) {
    {
      torch::NoGradGuard no_grad;
      gpt->forward(x, y);  // an evaluation between steps
    }
    gpt->forward(x, y).second.backward();
    opt.step(1e-2);
    opt.zero_grad();
  }
  const double with_grad = gpt->forward(x, y).second.item<double>();
  torch::NoGradGuard no_grad;
  EXPECT_DOUBLE_EQ(gpt->forward(x, y).second.item<double>(), with_grad);
}

TEST(Train, LossFallsOnATinyRun) {
  TempDir dir("loss_falls");
  auto c = tiny_config(dir.path);
  c.max_iters = 60;
  c.eval_interval = 60;
  c.model.dropout = 0.0;
  train::Trainer trainer(c, /*quiet=*/true);
  const double before = trainer.estimate_loss("train");
  auto result = trainer.run();
  EXPECT_EQ(result.iter, 60);
  EXPECT_LT(result.last_val_loss, before - 0.5);
  EXPECT_NEAR(before, std::log(trainer.model()->config().vocab_size), 0.3);
}

TEST(Train, CheckpointRoundTripRestoresEverything) {
  TempDir dir("ckpt_roundtrip");
  auto c = tiny_config(dir.path);
  c.max_iters = 10;
  train::Trainer trainer(c, true);
  trainer.run();
  const std::string path = c.out_dir + "/" + train::kLastCheckpoint;
  auto meta = train::read_checkpoint_meta(path);
  EXPECT_EQ(meta.iter, 10);
  EXPECT_EQ(meta.format_version, train::kCheckpointFormatVersion);
  EXPECT_EQ(meta.model_config.n_embd, 32);
  EXPECT_TRUE(meta.eval_done);
  EXPECT_FALSE(meta.sampler_state.empty());
  EXPECT_NE(meta.config_yaml.find("max_iters: 10"), std::string::npos);
  auto loaded = train::load_model(path);
  auto src = trainer.model()->named_parameters();
  for (auto& p : loaded.model->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), src[p.key()])) << p.key();
  EXPECT_EQ(loaded.vocab, meta.vocab);
}

TEST(Train, ResumeIsBitwiseExact) {
  TempDir dir("exact_resume");
  auto full = tiny_config(dir.path + "/full");
  train::Trainer(full, true).run();
  auto half = tiny_config(dir.path + "/half");
  half.max_iters = 10;
  train::Trainer(half, true).run();
  half.max_iters = 20;
  half.init_from = "resume";
  auto result = train::Trainer(half, true).run();
  EXPECT_EQ(result.iter, 20);
  auto a = train_losses(full.out_dir + "/metrics.csv"), b = train_losses(half.out_dir + "/metrics.csv");
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
}

// A run writes its id to out_dir/run_id and into its checkpoints; --init_from=resume goes on as the
// same run; a new run in the same out_dir is another.
TEST(Train, ARunsCheckpointsCarryItsIdAndAResumeKeepsIt) {
  TempDir dir("run_id");
  auto c = tiny_config(dir.path);
  c.max_iters = 10;
  train::Trainer(c, true).run();
  const std::string last = c.out_dir + "/" + train::kLastCheckpoint, best = c.out_dir + "/" + train::kBestCheckpoint;
  const std::string id = train::read_run_id(c.out_dir).id;
  EXPECT_EQ(id.size(), 16u) << id;
  EXPECT_EQ(train::read_checkpoint_meta(last).run_id, id);
  EXPECT_EQ(train::read_checkpoint_meta(best).run_id, id);
  c.init_from = "resume";
  c.max_iters = 20;
  train::Trainer(c, true).run();
  EXPECT_EQ(train::read_run_id(c.out_dir).id, id);
  EXPECT_EQ(train::read_checkpoint_meta(last).run_id, id);
  c.init_from = "scratch";
  train::Trainer(c, true).run();
  EXPECT_NE(train::read_run_id(c.out_dir).id, id);
  EXPECT_EQ(train::read_checkpoint_meta(last).run_id, train::read_run_id(c.out_dir).id);
}

TEST(Train, ResumingPastLrDecayItersSaysWhichRateItUses) {
  TempDir dir("resume_past_decay");
  auto c = tiny_config(dir.path);
  c.max_iters = 10;
  c.lr_decay_iters = 8;
  train::Trainer(c, true).run();
  c.init_from = "resume";
  c.max_iters = 14;  // extending the run without raising lr_decay_iters
  train::Trainer(c, true).run();
  const std::string log = read_text(c.out_dir + "/train.log");
  EXPECT_NE(log.find("resuming at iter 10, at or past lr_decay_iters (8): every step from here runs at min_lr 0.0003"),
            std::string::npos)
      << log;
  // Within the schedule, a resume says nothing of it.
  TempDir within("resume_within_decay");
  auto w = tiny_config(within.path);
  w.max_iters = 10;
  train::Trainer(w, true).run();
  w.init_from = "resume";
  w.max_iters = 20;
  train::Trainer(w, true).run();
  EXPECT_EQ(read_text(w.out_dir + "/train.log").find("lr_decay_iters"), std::string::npos);
}

// SIGINT during step 7, raised by the step hook so that nothing depends on timing: the step
// finishes, the checkpoint is saved at exactly iter 7, the exit code is 130, and resuming gives the
// uninterrupted run's losses.
TEST(Train, SigintFinishesTheStepSavesAndResumesExactly) {
  TempDir dir("sigint");
  auto full = tiny_config(dir.path + "/full");
  full.eval_interval = 1000;
  train::Trainer(full, true).run();
  auto stopped = tiny_config(dir.path + "/stopped");
  stopped.eval_interval = 1000;
  train::Trainer trainer(stopped, true);
  trainer.set_step_hook([](int64_t iter) {
    if (iter == 7) std::raise(SIGINT);
  });
  auto result = trainer.run();
  EXPECT_EQ(result.exit_code, 130);
  EXPECT_EQ(result.iter, 7);
  auto meta = train::read_checkpoint_meta(stopped.out_dir + "/" + train::kLastCheckpoint);
  EXPECT_EQ(meta.iter, 7);
  EXPECT_FALSE(meta.eval_done);
  stopped.init_from = "resume";
  EXPECT_EQ(train::Trainer(stopped, true).run().iter, 20);
  EXPECT_EQ(train_losses(full.out_dir + "/metrics.csv"), train_losses(stopped.out_dir + "/metrics.csv"));
}

// eval_only with init_from=resume evaluates the checkpoint as it is and exits: no step (the live
// weights and iteration are the checkpoint's), nothing in out_dir rewritten, and the val loss is
// the one training measured on the same weights at the same iteration.
TEST(Train, EvalOnlyResumeEvaluatesTheCheckpointAsItIs) {
  TempDir dir("eval_only");
  auto c = tiny_config(dir.path);
  c.max_iters = 10;
  const auto trained = train::Trainer(c, true).run();  // evaluates at iter 10, then saves
  const std::string ckpt = c.out_dir + "/" + train::kLastCheckpoint;
  std::vector<std::string> files = {ckpt, c.out_dir + "/" + train::kBestCheckpoint, c.out_dir + "/metrics.csv",
                                    c.out_dir + "/config.yaml"};
  std::vector<std::string> before;
  for (const auto& f : files) before.push_back(read_text(f));
  c.init_from = "resume";
  c.eval_only = true;
  c.max_iters = 20;  // a run that could continue, and must not
  train::Trainer evaluator(c, true);
  const auto result = evaluator.run();
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.iter, 10);
  EXPECT_EQ(result.last_val_loss, trained.last_val_loss);
  for (size_t i = 0; i < files.size(); ++i) EXPECT_EQ(read_text(files[i]), before[i]) << files[i];
  auto loaded = train::load_model(ckpt);
  auto live = evaluator.model()->named_parameters();
  for (auto& p : loaded.model->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), live[p.key()])) << p.key();
}

// Evaluation runs in eval mode: with dropout 0.3 the estimate is the same at every call and equals
// that of the same weights without dropout.
TEST(Train, EvaluationRunsWithoutDropout) {
  TempDir dir("eval_no_dropout");
  auto c = tiny_config(dir.path);
  c.model.dropout = 0.3;
  train::Trainer with_dropout(c, true);
  c.model.dropout = 0.0;
  c.out_dir = dir.path + "/out_no_dropout";
  train::Trainer without_dropout(c, true);
  auto same = without_dropout.model()->named_parameters();
  for (auto& p : with_dropout.model()->named_parameters()) ASSERT_TRUE(torch::equal(p.value(), same[p.key()])) << p.key();
  const double val = with_dropout.estimate_loss("val");
  EXPECT_EQ(with_dropout.estimate_loss("val"), val);
  EXPECT_EQ(without_dropout.estimate_loss("val"), val);
  EXPECT_EQ(with_dropout.estimate_loss("train"), without_dropout.estimate_loss("train"));
  EXPECT_TRUE(with_dropout.model()->is_training());  // back in training mode for the next step
}

// A train.bin holding an id past the vocabulary (made from another text, say) is one clear error
// when the trainer loads it, not an index error inside the embedding at the first step.
TEST(Train, TokenFileWithIdsPastTheVocabularyIsOneClearError) {
  TempDir dir("bad_tokens");
  auto c = tiny_config(dir.path);
  train::Trainer(c, true);  // prepares the dataset
  const int64_t V = data::read_meta(c.dataset).vocab.size();
  const std::string path = c.dataset + "/train.bin";
  const auto tokens = data::read_token_file(path, V);
  std::vector<int64_t> ids(tokens.data_ptr<int32_t>(), tokens.data_ptr<int32_t>() + tokens.numel());
  ids[5] = V + 2;
  data::write_token_file(path, ids, V + 3);  // the same size: the dataset still counts as prepared
  try {
    train::Trainer t(c, true);
    ADD_FAILURE() << "no error for a token file with an id past the vocabulary";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    const std::string expected = fmt::format("'{}': token {} at index 5 is outside the vocabulary (vocab_size {})", path, V + 2, V);
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_NE(message.find("nanogpt prepare"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

// k micro-batches of gradient accumulation are one step on the k-times batch: each micro-batch
// loss is scaled by 1/k, so the gradients add up to those of the mean over all k * B rows.
TEST(TrainStep, GradientAccumulationEqualsOneLargerBatch) {
  const model::ModelConfig config = tiny_model_config();
  const int64_t k = 4, B = 3;
  torch::manual_seed(5);
  const auto x = torch::randint(11, {k * B, 8}), y = torch::randint(11, {k * B, 8});
  const auto make = [&] {
    torch::manual_seed(0);
    model::GPT gpt(config);
    return std::make_pair(gpt, std::make_unique<train::FlatAdamW>(*gpt, train::FlatAdamW::Options{}));
  };
  auto [accumulated, accumulated_opt] = make();
  auto [whole, whole_opt] = make();
  train::StepOptions micro_steps;
  micro_steps.gradient_accumulation_steps = k;
  int64_t micro = 0;
  const auto next_micro_batch = [&] {
    const int64_t start = B * micro++;
    return std::make_pair(x.narrow(0, start, B), y.narrow(0, start, B));
  };
  const double lr = 1e-3;
  const double accumulated_loss = train::train_step(accumulated, *accumulated_opt, next_micro_batch, lr, micro_steps).item<double>();
  const double whole_loss = train::train_step(whole, *whole_opt, [&] { return std::make_pair(x, y); }, lr, {}).item<double>();
  EXPECT_EQ(micro, k);
  EXPECT_NEAR(accumulated_loss / k, whole_loss, 1e-6);
  // The first moments are 0.1 * gradient: the gradients agree to 1e-6 / 0.1.
  const auto a_state = accumulated_opt->state(), w_state = whole_opt->state();
  for (size_t i = 0; i < a_state.size(); ++i) {
    const double diff = (a_state[i].second.to(torch::kDouble) - w_state[i].second.to(torch::kDouble)).abs().max().item<double>();
    EXPECT_LE(diff, a_state[i].first.rfind("exp_avg.", 0) == 0 ? 1e-7 : 1e-6) << a_state[i].first;
  }
  auto w_params = whole->named_parameters();
  for (auto& p : accumulated->named_parameters())
    EXPECT_LE((p.value() - w_params[p.key()]).abs().max().item<double>(), 1e-6) << p.key();
}

TEST(Train, NonFiniteLossStopsAndKeepsTheCheckpoint) {
  TempDir dir("nonfinite");
  auto c = tiny_config(dir.path);
  c.max_iters = 10;
  train::Trainer(c, true).run();
  const std::string path = c.out_dir + "/" + train::kLastCheckpoint;
  const std::string before = read_text(path);
  c.init_from = "resume";
  c.max_iters = 40;
  c.learning_rate = 1e30;  // diverges at once
  c.min_lr = 1e29;
  c.grad_clip = 0.0;
  try {
    train::Trainer(c, true).run();
    ADD_FAILURE() << "no error on a diverging run";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_text(path), before);
}

TEST(Train, BadSetupsAreClearErrors) {
  TempDir dir("bad_setup");
  auto expect_error = [](train::TrainConfig c, const std::string& needle) {
    try {
      train::Trainer t(c, true);
      ADD_FAILURE() << "no error, expected: " << needle;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto c = tiny_config(dir.path);
  c.init_from = "resume";
  expect_error(c, "no checkpoint");
  c = tiny_config(dir.path);
  c.dataset = dir.path + "/nowhere";
  expect_error(c, "has no input.txt");
  c = tiny_config(dir.path);
  c.model.block_size = 5000;  // the val split (2000 chars) cannot hold one window
  expect_error(c, "block_size");
  if (!torch::cuda::is_available()) {
    c = tiny_config(dir.path);
    c.device = "cuda";
    expect_error(c, "no CUDA GPU is available");
  }
  c = tiny_config(dir.path);
  std::ofstream(dir.path + "/a_file") << "x";
  c.out_dir = dir.path + "/a_file/out";
  expect_error(c, "out_dir");
}
