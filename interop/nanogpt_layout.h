// The one mapping between nanoGPT's tensors and ours, both ways (interop/nanogpt_bridge.h moves the
// files; interop/nanogpt_config.h maps the dicts). nanoGPT's names are ours under "transformer." with
// q_proj/k_proj/v_proj as the three row blocks of c_attn; lm_head.weight is wte's; AdamW keeps two
// moments per nanoGPT parameter (ids: the decayed >= 2-D weights in model order, then the rest),
// FlatAdamW the same moments flattened into two groups in our parameter order.
#pragma once

#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "train/adamw.h"
#include "train/config.h"

namespace nanogpt::interop {

constexpr const char* kNanoEmbedding = "transformer.wte.weight";
constexpr const char* kNanoHead = "lm_head.weight";  // tied: the same tensor as kNanoEmbedding

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
  bool load_moments(train::FlatAdamW& optimizer, const nlohmann::ordered_json& state,
                    const std::map<std::string, torch::Tensor>& tensors, const torch::Tensor& order,
                    std::vector<std::string>& notes) const;
  /// Appends the optimizer's moments as nanoGPT's ("optimizer:<id>:exp_avg", ...) and returns
  /// {"param_groups", "steps"} for them (lr, betas, weight_decay from `config`).
  nlohmann::ordered_json save_moments(const train::FlatAdamW& optimizer, const train::TrainConfig& config,
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

}  // namespace nanogpt::interop
