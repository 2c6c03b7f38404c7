// Checkpoints: one safetensors file (io/safetensors.h) with the model, the optimizer, the step,
// the best val loss, the effective config (YAML), the model config, the vocabulary, every
// RNG/sampler state needed to continue exactly, and a format version. Python opens it with
// safetensors.numpy.load_file. Written atomically; read with validation (a mismatch names the tensor).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "data/vocab.h"
#include "model/config.h"
#include "model/gpt.h"

namespace nanogpt::train {

/// 1: a LibTorch archive (zip of pickles), up to this change; 2: safetensors.
constexpr int64_t kCheckpointFormatVersion = 2;
/// The "format" metadata value that marks a safetensors file as one of our checkpoints.
constexpr const char* kCheckpointFormat = "nanogpt-cpp checkpoint";
constexpr const char* kLastCheckpoint = "ckpt_last.safetensors";  // every evaluation and on Ctrl-C: resume reads it
constexpr const char* kBestCheckpoint = "ckpt_best.safetensors";  // best val loss so far: sampling reads it

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
  torch::Tensor cuda_rng_state;      // CUDA default generator state, when trained on CUDA
  bool eval_done = false;            // the evaluation at `iter` already ran (resume skips it)
  double loss_scale = 1.0;           // float16: the GradScaler's scale (train/grad_scaler.h); 1 otherwise
  int64_t loss_scale_growth = 0;     // float16: good steps in a row since the scale last changed
  int64_t world_size = 1;            // processes that trained it (torchrun); any number can resume it
  std::string run_id;                // the run that wrote it (train/run_id.h); "" before run ids
  bool optimizer_state = true;       // the file holds optimizer state; false: weights only (an imported
                                     // model), and a resume starts the optimizer afresh
};

/// A model ready for inference, loaded from a checkpoint.
struct LoadedModel {
  model::GPT model{nullptr};
  data::Vocab vocab;
  CheckpointMeta meta;
  std::string path;
};

class FlatAdamW;

/// What a checkpoint file holds, in file order: named tensors and string metadata.
struct CheckpointContent {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::string> metadata;
};

/// The checkpoint of `model`, `optimizer` and `meta`. The tensors are the live parameters and
/// optimizer state, not copies: write them before the next step, or copy them first (a snapshot:
/// train/checkpoint_writer.h).
CheckpointContent checkpoint_content(model::GPT& model, const FlatAdamW& optimizer, const CheckpointMeta& meta);
/// The checkpoint of `model` and `meta` without optimizer state (an imported model, which has none
/// worth a file: its moments would be zeros twice the model's size). load_checkpoint leaves an
/// optimizer as it was built for it (zero moments, step 0) and reads meta.optimizer_state false.
CheckpointContent checkpoint_content(model::GPT& model, const CheckpointMeta& meta);

/// Writes `content` to `path` atomically (temporary file, fsync, rename). `after_tensor(k)`, when
/// given, is called after the first k tensors' bytes are written. Throws "[ckpt] cannot write ...".
void write_checkpoint(const std::string& path, const CheckpointContent& content,
                      const std::function<void(size_t)>& after_tensor = nullptr);

/// Writes a training checkpoint atomically (temporary file, fsync, rename): a crash at any moment
/// leaves either the previous file or the complete new one. Throws "[ckpt] cannot write ...".
void save_checkpoint(const std::string& path, model::GPT& model, const FlatAdamW& optimizer, const CheckpointMeta& meta);
/// The same without optimizer state (see checkpoint_content above).
void save_checkpoint(const std::string& path, model::GPT& model, const CheckpointMeta& meta);

/// Reads and validates a checkpoint's metadata only: the header and the RNG states, never the
/// weights or the optimizer state.
CheckpointMeta read_checkpoint_meta(const std::string& path);

/// Loads weights into `model` and state into `optimizer` (either may be null) and returns the meta.
/// Every tensor is checked against the model built from the config; a mismatch names the tensor.
/// A file without optimizer state (meta.optimizer_state false) leaves `optimizer` untouched.
CheckpointMeta load_checkpoint(const std::string& path, model::GPT* model, FlatAdamW* optimizer);

/// `path` may be a checkpoint file or an out_dir (then ckpt_best.safetensors, else ckpt_last.safetensors).
/// Throws "[ckpt] no checkpoint in 'dir' (...)" when there is none.
std::string resolve_checkpoint(const std::string& path);

/// Loads a model for inference (eval mode) on `device`. Throws "[ckpt] ..." on a missing, empty,
/// truncated, foreign or mismatched file, and on a format-1 checkpoint (a LibTorch archive);
/// never crashes.
LoadedModel load_model(const std::string& path, torch::Device device = torch::kCPU);

}  // namespace nanogpt::train
