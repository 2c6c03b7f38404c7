// Checkpoints: one file with the model, the optimizer, the step, the best val loss, the effective
// config (YAML), the vocabulary, every RNG/sampler state needed to continue exactly, and a format
// version. Written atomically; read with validation (a mismatch names the tensor).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "data/vocab.h"
#include "model/config.h"
#include "model/gpt.h"

namespace nanogpt::train {

constexpr int64_t kCheckpointFormatVersion = 1;
constexpr const char* kLastCheckpoint = "ckpt_last.pt";  // every evaluation and on Ctrl-C: resume reads it
constexpr const char* kBestCheckpoint = "ckpt_best.pt";  // best val loss so far: sampling reads it

/// Everything but the model weights and optimizer tensors.
struct CheckpointMeta {
  int64_t format_version = kCheckpointFormatVersion;
  int64_t iter = 0;                  // optimizer steps completed
  double best_val_loss = 1e9;
  std::string config_yaml;           // effective TrainConfig (train/config.h to_yaml)
  model::ModelConfig model_config;
  data::Vocab vocab;
  std::string sampler_state;         // data::BatchSampler::state()
  torch::Tensor torch_rng_state;     // CPU default generator state (dropout)
};

/// A model ready for inference, loaded from a checkpoint.
struct LoadedModel {
  model::GPT model{nullptr};
  data::Vocab vocab;
  CheckpointMeta meta;
  std::string path;
};

/// `path` may be a checkpoint file or an out_dir (then ckpt_best.pt, else ckpt_last.pt).
/// Throws "[ckpt] no checkpoint in 'dir' (...)" when there is none.
std::string resolve_checkpoint(const std::string& path);

/// Loads a model for inference (eval mode) on `device`. Throws "[ckpt] ..." on a missing, empty,
/// truncated, foreign or mismatched file; never crashes.
LoadedModel load_model(const std::string& path, torch::Device device = torch::kCPU);

}  // namespace nanogpt::train
