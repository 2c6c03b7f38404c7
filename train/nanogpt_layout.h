// The one mapping between nanoGPT's checkpoint layout and ours, both ways (train/nanogpt_bridge.h
// moves the files). nanoGPT's names are ours under "transformer." with q_proj/k_proj/v_proj as
// the three row blocks of c_attn; lm_head.weight is wte's; AdamW keeps two moments per nanoGPT
// parameter (ids: the decayed >= 2-D weights in model order, then the rest), FlatAdamW the same
// moments flattened into two groups in our parameter order.
#pragma once

#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/vocab.h"
#include "model/config.h"
#include "model/gpt.h"
#include "train/adamw.h"
#include "train/config.h"

namespace nanogpt::train {

constexpr const char* kNanoEmbedding = "transformer.wte.weight";
constexpr const char* kNanoHead = "lm_head.weight";  // tied: the same tensor as kNanoEmbedding

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
TrainConfig train_config_from_nanogpt(const nlohmann::ordered_json& config, const model::ModelConfig& model,
                                      const std::string& out_dir, std::vector<std::string>& notes);
/// The reverse: the shared keys, the architecture's, dataset (the folder's name: sample.py reads
/// data/<dataset>/meta.pkl) and out_dir.
nlohmann::ordered_json nanogpt_config_of(const TrainConfig& config, const model::ModelConfig& model,
                                         const std::string& out_dir);

/// Where each of a model's parameters lives in nanoGPT's state_dict.
class NanoLayout {
 public:
  explicit NanoLayout(model::GPT& gpt);

  /// nanoGPT's state_dict keys in its order, lm_head.weight last.
  std::vector<std::string> state_dict_keys() const;

  /// Copies nanoGPT's tensors ("model:<key>", "_orig_mod." prefixes allowed) into `gpt`, rows of the
  /// embedding in `order`. Checks every tensor first: a missing, misshapen or unexpected one, or an
  /// lm_head that differs from wte, throws "[import] ..." and leaves `gpt` as it was.
  void load_weights(model::GPT& gpt, const std::map<std::string, torch::Tensor>& tensors,
                    const torch::Tensor& order) const;
  /// Appends gpt's weights as nanoGPT's ("model:<key>", fp32, lm_head left to `tied`).
  void save_weights(model::GPT& gpt, std::vector<std::pair<std::string, torch::Tensor>>& tensors) const;

  /// Loads AdamW's state (the script's {"param_groups", "steps"} and "optimizer:<id>:<moment>"
  /// tensors) into `optimizer`. Returns false, with the reason in `notes`, when there is none or it
  /// is not two AdamW groups over nanoGPT's parameters; the optimizer then starts fresh.
  bool load_moments(FlatAdamW& optimizer, const nlohmann::ordered_json& state,
                    const std::map<std::string, torch::Tensor>& tensors, const torch::Tensor& order,
                    std::vector<std::string>& notes) const;
  /// Appends the optimizer's moments as nanoGPT's ("optimizer:<id>:exp_avg", ...) and returns
  /// {"param_groups", "steps"} for them (lr, betas, weight_decay from `config`).
  nlohmann::ordered_json save_moments(const FlatAdamW& optimizer, const TrainConfig& config,
                                      std::vector<std::pair<std::string, torch::Tensor>>& tensors) const;

 private:
  // One of our parameters: all of nanoGPT's `nano`, or for q/k/v the `part`-th block of its rows.
  struct Slot {
    std::string ours, nano;
    int part = -1;  // -1: the whole tensor; 0, 1, 2: q, k, v
    std::vector<int64_t> shape;
  };
  // Our parameter's part of nanoGPT's tensor `whole` (its rows reordered to ours for the embedding).
  torch::Tensor piece(const Slot& slot, const torch::Tensor& whole, const torch::Tensor& order) const;
  // nanoGPT's tensor `nano` assembled from `ours(slot)` of each of its slots.
  template <typename Ours>
  torch::Tensor assemble(const std::string& nano, const Ours& ours) const;
  // nanoGPT's AdamW ids: its parameters with >= 2 dims (decayed), then the rest, in its order.
  std::vector<std::string> optimizer_order() const;

  std::vector<Slot> slots_;                                // ours, in our parameter order
  std::vector<std::string> nano_;                          // nanoGPT's parameters, in its order
  std::map<std::string, std::vector<int64_t>> nano_shape_;
};

}  // namespace nanogpt::train
