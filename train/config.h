// TrainConfig: one flat set of keys, named as in nanoGPT's train.py, read from YAML and overridden
// from the command line exactly like nanoGPT (`--max_iters=100 --device=cpu`). YAML lives only here.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace nanogpt::train {

struct TrainConfig {
  // I/O
  std::string out_dir = "out";               // checkpoints, metrics.csv, train.log, config.yaml
  int64_t eval_interval = 2000;              // evaluate (and write ckpt_last.safetensors) every N iters
  int64_t log_interval = 1;                  // one [train] line every N iters
  int64_t eval_iters = 200;                  // batches averaged per split at each evaluation
  bool eval_only = false;                    // evaluate once and exit
  bool always_save_checkpoint = true;        // true: ckpt_best.safetensors at every eval (nanoGPT's ckpt.pt); false: only when val improves
  std::string init_from = "scratch";         // scratch | resume
  int64_t checkpoint_interval = 0;           // also save ckpt_last every this many iterations; 0 = at evaluations only
  double checkpoint_minutes = 0;             // also save ckpt_last when this many minutes passed since the last save; 0 = off
  bool checkpoint_async = true;              // write checkpoints on a background thread from a snapshot; false: on the training thread
  // data
  std::string dataset = "data/shakespeare_char";  // folder with input.txt, or train/val/meta.bin; NAME = data/NAME
  double val_fraction = 0.1;                 // last fraction of the characters held out for val
  bool verify_data = false;                  // read every token of train.bin/val.bin at start-up (small ones always)
  std::string tokenizer = "char";            // char | bpe (SentencePiece subwords): how input.txt is tokenized
  int64_t vocab_size = 0;                    // bpe: pieces to learn (e.g. 2048); 0 with char
  int64_t gradient_accumulation_steps = 1;   // micro-batches per optimizer step
  int64_t batch_size = 12;                   // sequences per micro-batch
  // model: the architecture, in one struct (model/config.h); its keys are flat in YAML, as in nanoGPT
  model::ModelConfig model = default_model();
  // AdamW
  double learning_rate = 6e-4;               // max learning rate
  int64_t max_iters = 600000;                // total optimizer steps
  double weight_decay = 1e-1;                // on >= 2-D weights only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double grad_clip = 1.0;                    // clip the global grad norm at this value; 0 = off
  std::string optimizer = "adamw";           // adamw | muon (Muon for the blocks' matrices, AdamW for the rest)
  double muon_learning_rate = 0.02;          // Muon's peak learning rate (follows the same schedule)
  double muon_momentum = 0.95;               // Muon's (Nesterov) momentum
  // learning rate schedule
  bool decay_lr = true;                      // warmup + decay; false = constant learning_rate
  std::string lr_schedule = "cosine";        // cosine (nanoGPT) | wsd (warmup, stable, then a linear decay)
  int64_t warmup_iters = 2000;
  int64_t lr_decay_iters = 600000;           // ~ max_iters per Chinchilla
  double min_lr = 6e-5;                      // ~ learning_rate / 10
  double decay_frac = 0.2;                   // wsd: the decay takes the last decay_frac of lr_decay_iters
  // system
  std::string device = "auto";               // auto | cpu | cuda | cuda:N
  std::string dtype = "float32";             // auto | float32 | bfloat16 | float16 (autocast, fp32 master weights; float16 with loss scaling)
  int64_t seed = 1337;
  int64_t num_threads = 0;                   // intra-op threads; 0 = all cores
  bool tf32 = true;                          // CUDA: float32 products on TF32 tensor cores (nanoGPT's default); no effect on the CPU
  std::string cuda_graphs = "auto";          // auto (on for one process on CUDA) | true | false: each step replayed as CUDA graphs
  bool compile = false;                      // accepted for nanoGPT compatibility; no effect here
  bool plot = true;                          // redraw out_dir/loss.png at every evaluation
  // data parallel (torchrun; train/distributed.h)
  std::string backend = "auto";              // auto (gloo on CPU, nccl on CUDA) | gloo | nccl
  int64_t ddp_timeout = 60;                  // seconds: a lost or stuck rank stops the others within this
  double ddp_bucket_mb = 1.0;                // gradient all-reduce buckets (MB) overlapping the backward pass; 0 = one all-reduce after it

  /// nanoGPT's train.py defaults for the architecture: GPT-2 small (12 layers, 12 heads, 768 wide,
  /// block 1024), with this project's RoPE and pre-norm choices.
  static model::ModelConfig default_model();
  /// The autocast dtype of `dtype`: kBFloat16, kHalf, or kFloat (no autocast). Resolve "auto" first
  /// (runtime::resolve_training_dtype, once the device is known).
  torch::ScalarType autocast_dtype() const;
  /// Takes the architecture from a checkpoint's config (resume forces it); dropout stays this
  /// config's (a training knob, not part of the weights).
  void set_architecture(const model::ModelConfig& m);

  /// Throws std::invalid_argument "[config] <key> (<value>) must ...: hint" on impossible values.
  void validate() const;
};

/// Parses YAML text. Unknown keys and wrong types throw "[config] <source>: unknown key 'x' ..." /
/// "[config] <source>: key 'max_iters' expects an integer, got 'abc'". Keys not given keep defaults;
/// an empty document (or only comments) means all defaults; a non-mapping or nested value throws.
/// Integers reject 1.5 and 1e3; numbers accept 1e-3 and integers; bools are true/false or True/False.
TrainConfig parse_config(const std::string& yaml_text, const std::string& source = "config");

/// Reads and parses a YAML file. Throws "[config] cannot read 'path': ..." when missing.
TrainConfig load_config(const std::string& path);

/// Applies nanoGPT-style overrides, each "--key=value" (the value parsed as YAML scalar for the key's
/// type). Malformed ("--max_iters", "--=3", "max_iters=3") or unknown keys throw naming the argument.
void apply_overrides(TrainConfig& config, const std::vector<std::string>& overrides);

/// The whole config as YAML, every key, in declaration order (parse_config(to_yaml(c)) == c).
std::string to_yaml(const TrainConfig& config);

/// The list of known keys in declaration order (for help and docs).
std::vector<std::string> config_keys();

/// One key as documented by `nanogpt train --help` and docs/configuration.md.
struct ConfigKey {
  std::string name;
  std::string type;           // int | float | bool | string
  std::string default_value;  // as to_yaml writes it: nanoGPT's train.py defaults, unless a config says otherwise
  std::string range;          // the values validate() accepts, e.g. ">= 1", "auto | cpu | cuda | cuda:N"
  std::string nanogpt_name;   // the name in nanoGPT's train.py; empty when nanoGPT has no such key
  std::string description;    // one line
  std::string group;          // I/O, data, model, AdamW, learning rate schedule, system, data parallel
};

/// Every key, in declaration order, from the one key table.
std::vector<ConfigKey> config_key_table();

}  // namespace nanogpt::train
