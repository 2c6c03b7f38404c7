// export_safetensors (see safetensors_export.h): parameters in fp32 plus everything needed to run them.
#include "interop/safetensors_export.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>
#include <vector>

#include "io/safetensors.h"

namespace nanogpt::interop {

using Json = nlohmann::ordered_json;

std::string model_config_json(const model::ModelConfig& config) {
  // The checkpoint's mapping of the fields, with the head count resolved and without the
  // attention implementation (a choice of kernel, not of weights).
  Json json = model::to_json(config);
  json["n_kv_head"] = config.kv_heads();
  json.erase("attention");
  return json.dump();
}

std::string vocab_json(const data::Vocab& vocab) {
  Json chars = Json::array();  // the characters; bpe: the pieces, as a person reads them
  for (int64_t id = 0; id < vocab.size(); ++id) chars.push_back(vocab.piece(id));
  return chars.dump();
}

namespace {
model::ModelConfig trained_config(const train::LoadedModel& loaded) {
  model::ModelConfig config = loaded.model->config();
  config.dropout = loaded.meta.model_config.dropout;
  return config;
}
}  // namespace

void export_safetensors(const train::LoadedModel& loaded, const std::string& path) {
  if (!loaded.model) throw std::runtime_error("[export] no model to export (load a checkpoint first)");
  const model::ModelConfig& config = loaded.model->config();
  if (loaded.vocab.size() != config.vocab_size)
    throw std::runtime_error(fmt::format(
        "[export] vocabulary has {} characters but the model's vocab_size is {} (corrupted checkpoint?)",
        loaded.vocab.size(), config.vocab_size));

  // The head is tied to wte (one parameter, one tensor); the metadata says so.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : loaded.model->named_parameters(/*recurse=*/true))
    tensors.emplace_back(item.key(), item.value().detach().to(torch::kCPU, torch::kFloat32).contiguous());

  const std::map<std::string, std::string> metadata = {
      {"format", kExportFormat},
      {"format_version", std::to_string(kExportFormatVersion)},
      // The trained dropout: load_model zeroes the live model's for inference.
      {"config", model_config_json(trained_config(loaded))},
      // RoPE rotates the pairs (x[i], x[i + hs/2]) of each head (GPT-NeoX / LLaMA-HF style).
      {"rope_convention", "split_halves"},
      {"tied_lm_head", "wte.weight"},
      {"vocab", vocab_json(loaded.vocab)},
      {"tokenizer", loaded.vocab.serialize()},  // the whole tokenizer (char or bpe), as checkpoints hold it
      {"iter", std::to_string(loaded.meta.iter)},
      // A number, or null when the loss is not finite (JSON has no NaN).
      {"best_val_loss", Json(loaded.meta.best_val_loss).dump()},
  };
  io::write_safetensors(path, tensors, metadata);
}

}  // namespace nanogpt::interop
