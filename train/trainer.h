// The training loop: nanoGPT's train.py as a library. Build a Trainer from a validated config,
// call run(); it prepares the data when needed, trains with AdamW under the LR schedule,
// evaluates, logs, checkpoints, and resumes exactly.
#pragma once

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "data/batch_sampler.h"
#include "data/vocab.h"
#include "model/gpt.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/config.h"
#include "train/device_batch.h"
#include "train/distributed.h"
#include "train/grad_scaler.h"
#include "train/graphed_step.h"
#include "train/lr_schedule.h"

namespace nanogpt::train {

struct TrainResult {
  int exit_code = 0;        // 0 done, 130 stopped by SIGINT, 143 by SIGTERM
  int64_t iter = 0;         // optimizer steps completed
  double best_val_loss = 0; // best val loss seen
  double last_val_loss = 0; // val loss at the final evaluation
  double median_ms = 0;     // median step time (ms) after the warm-up steps; on CUDA, of the steps that log
  double peak_gpu_allocated_mb = 0;  // CUDA: the most memory tensors held at once (0 on the CPU)
};

class Trainer {
 public:
  /// Sets up everything; `quiet` keeps the console silent (tests). Throws on bad config, missing
  /// data, unwritable out_dir, resume without a checkpoint, a CUDA device that is not there, etc.
  explicit Trainer(TrainConfig config, bool quiet = false);

  /// Trains until max_iters (or a stop signal); returns what happened. With eval_only, evaluates
  /// the model as loaded (a resumed checkpoint, or the initial weights) once and returns: no step,
  /// no checkpoint, no metrics row.
  TrainResult run();

  /// Mean loss over eval_iters batches of a split ("train" or "val"), in eval mode, no grad.
  double estimate_loss(const std::string& split);

  /// Called after every optimizer step with the number of steps completed, before the loop checks
  /// for a stop signal (tests raise SIGINT at an exact step with it).
  void set_step_hook(std::function<void(int64_t iter)> hook) { step_hook_ = std::move(hook); }

  const TrainConfig& config() const { return config_; }
  model::GPT& model() { return model_; }

 private:
  TrainResult run_loop();
  /// Estimates the train and val losses and logs the [eval] line; returns {train, val}.
  std::pair<double, double> evaluate();
  /// One line for an out-of-memory error: what ran out, the sizes that matter, what to change.
  std::string out_of_memory_message() const;
  /// Saves the state at iter_ to each of `paths` (ckpt_last, and ckpt_best at an evaluation), in
  /// the background when checkpoint_async is on (writer_).
  void save(const std::vector<std::string>& paths, bool eval_done);
  void log_start();
  bool is_main() const { return rank_ == 0; }  // rank 0 logs and writes; the others only compute
  /// This process's next micro-batch of the step (data parallel: skips the other ranks' ones), with
  /// the dropout generator seeded for it, so a micro-batch is the same whichever rank runs it.
  std::pair<torch::Tensor, torch::Tensor> next_micro_batch();
  /// Sums the step's loss over the ranks, and agrees on a stop signal (0 = none): a signal seen by any
  /// rank stops every rank after the same step.
  std::pair<double, int> reduce_step(const torch::Tensor& loss_sum);
  /// Why the checkpoint at `path` cannot carry on run `run_id` ("" when out_dir names no run of this
  /// launch) after torchrun restarted the workers (none there, unreadable, another run's); "" when it can.
  std::string restart_checkpoint_mismatch(const std::string& path, const std::string& run_id) const;

  TrainConfig config_;
  torch::Device device_{torch::kCPU};
  torch::ScalarType amp_dtype_ = torch::kFloat;  // autocast dtype; kFloat = none
  std::unique_ptr<GradScaler> scaler_;           // float16 only
  std::shared_ptr<spdlog::logger> log_;
  data::Vocab vocab_;
  double val_tokens_per_char_ = 1.0;  // of the val split: the eval line's bits per character
  torch::Tensor train_tokens_, val_tokens_;
  std::unique_ptr<data::BatchSampler> sampler_;
  std::unique_ptr<DeviceBatch> batch_;  // every micro-batch lands in these buffers
  model::GPT model_{nullptr};
  std::unique_ptr<FlatAdamW> optimizer_;
  std::unique_ptr<GraphedStep> graphed_;  // cuda_graphs on: the step as CUDA graphs
  std::unique_ptr<CheckpointWriter> writer_;  // rank 0's, while run() trains
  LrSchedule schedule_;
  int64_t iter_ = 0;
  double best_val_loss_ = 1e9;
  bool resumed_eval_done_ = false;
  std::string restart_note_;  // what a restarted worker group does, logged once the logger exists
  std::string run_id_;        // this run's (train/run_id.h), kept in its checkpoints
  double peak_flops_ = 0;
  std::function<void(int64_t)> step_hook_;
  // data parallel (torchrun): rank 0 of 1 when launched alone
  LaunchEnv launch_;
  int64_t rank_ = 0, world_ = 1;
  int64_t local_micro_steps_ = 1;  // gradient_accumulation_steps / world size
  int64_t micro_ = 0;              // this process's micro-batches drawn in the current step
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<GradientAllReduce> grad_reduce_;
};

}  // namespace nanogpt::train
