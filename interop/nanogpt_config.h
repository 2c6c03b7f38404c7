// nanoGPT's dicts against ours, both ways (interop/nanogpt_bridge.h moves the files): model_args
// against ModelConfig, meta.pkl's itos against our sorted vocabulary, train.py's config dict
// against TrainConfig.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/vocab.h"
#include "model/config.h"
#include "train/config.h"

namespace nanogpt::interop {

/// model_args (n_layer, n_head, n_embd, block_size, bias, vocab_size, dropout) as our config:
/// learned positions, LayerNorm, multi-head attention. Throws "[import] model_args ..." on a
/// missing, mistyped or unknown key (a modified model.py) or a model that does not validate.
model::ModelConfig config_from_model_args(const nlohmann::ordered_json& model_args);
/// The reverse, for an exportable config (see nanogpt_lacks).
nlohmann::ordered_json model_args_of(const model::ModelConfig& config);

/// meta.pkl's vocabulary as ours, with `order`: (V,) int64, our token id -> nanoGPT's. Ours is
/// sorted by code point; nanoGPT's prepare.py sorts too, so `order` is usually the identity.
struct NanoVocab {
  data::Vocab vocab;
  torch::Tensor order;
};
/// `meta`: the bridge script's {"keys", "vocab_size", "itos", "stoi"}. Throws "[import] ..." for
/// a subword vocabulary (no itos, or tokens of several characters: GPT-2 BPE), gaps, duplicates,
/// an stoi that is not itos's inverse, or a size other than the model's `vocab_size`.
NanoVocab vocab_from_meta(const nlohmann::ordered_json& meta, int64_t vocab_size, const std::string& meta_path);

/// nanoGPT's config dict as our TrainConfig: the architecture from `model`, out_dir, init_from
/// resume, dataset "data/<its dataset>", and every key the two share (learning_rate, max_iters,
/// batch_size, ...). A key of the wrong type, or a config that does not validate here, is left at
/// our default and explained in `notes`.
train::TrainConfig train_config_from_nanogpt(const nlohmann::ordered_json& config, const model::ModelConfig& model,
                                             const std::string& out_dir, std::vector<std::string>& notes);
/// The reverse: the shared keys, the architecture's, dataset (the folder's name: sample.py reads
/// data/<dataset>/meta.pkl) and out_dir.
nlohmann::ordered_json nanogpt_config_of(const train::TrainConfig& config, const model::ModelConfig& model,
                                         const std::string& out_dir);

}  // namespace nanogpt::interop
