// export_safetensors (see export.h): parameters in fp32 plus everything needed to run them.
#include "train/export.h"

#include <cmath>
#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

#include "train/json.h"
#include "train/safetensors.h"

namespace nanogpt::train {

std::string model_config_json(const model::ModelConfig& config) {
  auto integer = [](int64_t v) { return std::to_string(v); };
  std::string json = "{";
  json += "\"vocab_size\":" + integer(config.vocab_size);
  json += ",\"block_size\":" + integer(config.block_size);
  json += ",\"n_layer\":" + integer(config.n_layer);
  json += ",\"n_head\":" + integer(config.n_head);
  json += ",\"n_kv_head\":" + integer(config.kv_heads());
  json += ",\"n_embd\":" + integer(config.n_embd);
  json += std::string(",\"bias\":") + (config.bias ? "true" : "false");
  json += ",\"pos_encoding\":" + json::quote(config.pos_encoding);
  json += ",\"rope_base\":" + json::number(config.rope_base);
  json += ",\"norm\":" + json::quote(config.norm);
  json += ",\"dropout\":" + json::number(config.dropout);
  return json + "}";
}

std::string vocab_json(const data::Vocab& vocab) {
  std::string json = "[";
  for (int64_t id = 0; id < vocab.size(); ++id) {
    if (id) json += ',';
    json += json::quote(vocab.decode_one(id));
  }
  return json + "]";
}

void export_safetensors(const LoadedModel& loaded, const std::string& path) {
  if (!loaded.model) throw std::runtime_error("[export] no model to export (load a checkpoint first)");
  const model::ModelConfig& config = loaded.model->config();
  if (loaded.vocab.size() != config.vocab_size)
    throw std::runtime_error("[export] vocabulary has " + std::to_string(loaded.vocab.size()) +
                             " characters but the model's vocab_size is " + std::to_string(config.vocab_size) +
                             " (corrupted checkpoint?)");

  // The head is tied to wte (one parameter, one tensor); the metadata says so.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : loaded.model->named_parameters(/*recurse=*/true))
    tensors.emplace_back(item.key(), item.value().detach().to(torch::kCPU, torch::kFloat32).contiguous());

  const std::map<std::string, std::string> metadata = {
      {"format", kExportFormat},
      {"format_version", std::to_string(kExportFormatVersion)},
      {"config", model_config_json(config)},
      // RoPE rotates the pairs (x[i], x[i + hs/2]) of each head (GPT-NeoX / LLaMA-HF style).
      {"rope_convention", "split_halves"},
      {"tied_lm_head", "wte.weight"},
      {"vocab", vocab_json(loaded.vocab)},
      {"iter", std::to_string(loaded.meta.iter)},
      {"best_val_loss", std::isfinite(loaded.meta.best_val_loss) ? json::number(loaded.meta.best_val_loss)
                                                                  : std::to_string(loaded.meta.best_val_loss)},
  };
  write_safetensors(path, tensors, metadata);
}

}  // namespace nanogpt::train
