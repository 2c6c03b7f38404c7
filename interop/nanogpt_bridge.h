// The nanoGPT bridge: a nanoGPT checkpoint (ckpt.pt + meta.pkl) becomes one of ours, and one of
// ours becomes a nanoGPT checkpoint that its sample.py and train.py load unchanged.
//
// The pickles are read and written by scripts/nanogpt_bridge.py under the project's Python (torch's
// weights-only loading for ckpt.pt, a data-only unpickler for meta.pkl: no code from a file runs),
// which converts them to and from a neutral safetensors file. Everything else happens here, in one
// mapping: nanoGPT's names (transformer.h.0.attn.c_attn.weight) against ours (h.0.attn.q_proj.weight:
// c_attn's rows are q, k, v), the tied lm_head, torch.compile's "_orig_mod." prefix, AdamW's
// per-parameter moments against FlatAdamW's two flat groups, meta.pkl's itos against our sorted
// vocabulary, and nanoGPT's model_args and config dict against ModelConfig and TrainConfig.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace nanogpt::interop {

/// How to run scripts/nanogpt_bridge.py: a Python with torch and safetensors, and the script.
struct PythonBridge {
  std::string python;  // executable, a path or a name looked up in PATH
  std::string script;  // scripts/nanogpt_bridge.py

  /// $NANOGPT_PYTHON when set, else `built_python` (the Python the build was configured with,
  /// scripts/env.sh's environment), else python3; the script under `source_dir`.
  static PythonBridge find(const std::string& built_python, const std::string& source_dir);
};

/// What an import wrote and carried over.
struct ImportReport {
  std::string checkpoint;          // out_dir/ckpt_last.safetensors
  std::string config;              // out_dir/config.yaml: the training config, for --init_from=resume
  model::ModelConfig model_config;
  int64_t iter = 0;                // nanoGPT's iter_num
  bool optimizer = false;          // AdamW's moments and step carried over
  std::vector<std::string> notes;  // what did not carry over from this checkpoint, one line each
};

/// Imports nanoGPT's `ckpt_pt` with the vocabulary of `meta_pkl` ("" = none given) into `out_dir`,
/// which must not exist or be empty: out_dir/ckpt_last.safetensors (weights, the AdamW state when
/// the checkpoint has it, iter_num, best_val_loss) and out_dir/config.yaml (model_args and the
/// config dict's keys that TrainConfig shares). All or nothing: the folder is built beside out_dir
/// and renamed onto it. Throws std::runtime_error "[import] ..." with a hint: no meta.pkl or a
/// subword vocabulary (GPT-2 BPE), a model nanoGPT's model.py would not build, Python or torch
/// missing, an unreadable or foreign file.
ImportReport import_nanogpt(const std::string& ckpt_pt, const std::string& meta_pkl, const std::string& out_dir,
                            const PythonBridge& bridge);

/// The first feature of `config` that nanoGPT's model.py lacks ("RoPE (pos_encoding rope)"), or ""
/// when nanoGPT can express the model: learned positions, LayerNorm, n_kv_head = n_head. (GELU and
/// the tied head are all this project has.)
std::string nanogpt_lacks(const model::ModelConfig& config);

/// Exports our `checkpoint` file to `out_dir` (must not exist or be empty) as nanoGPT's ckpt.pt
/// (model, optimizer, model_args, iter_num, best_val_loss, config with dataset = the dataset
/// folder's name) and meta.pkl (vocab_size, itos, stoi). All or nothing, like the import. Throws
/// std::runtime_error "[export] nanoGPT has no <feature> ..." for a model it cannot express.
/// Returns that dataset name: nanoGPT's sample.py reads the vocabulary from data/<it>/meta.pkl.
std::string export_nanogpt(const std::string& checkpoint, const std::string& out_dir, const PythonBridge& bridge);

}  // namespace nanogpt::interop
