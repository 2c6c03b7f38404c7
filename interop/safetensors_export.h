// Export a trained model as .safetensors, so Python (numpy alone), Rust or JavaScript tools can
// read the weights, the architecture and the vocabulary without LibTorch or pickle.
#pragma once

#include <string>

#include "train/checkpoint.h"

namespace nanogpt::interop {

/// Identifies our files in the "format" metadata key; bump kExportFormatVersion on any change to
/// tensor names or metadata meaning.
constexpr const char* kExportFormat = "nanogpt-cpp";
constexpr int kExportFormatVersion = 1;

/// The architecture as a JSON object string: vocab_size, block_size, n_layer, n_head, n_kv_head
/// (resolved: never 0), n_embd, bias, pos_encoding, rope_base, norm, dropout.
std::string model_config_json(const model::ModelConfig& config);

/// The vocabulary as a JSON array string of UTF-8 characters, index = token id.
std::string vocab_json(const data::Vocab& vocab);

/// Writes every named parameter of `loaded.model` (fp32, contiguous, LibTorch names such as
/// "wte.weight", "h.0.attn.q_proj.weight") to `path` atomically, with metadata: format,
/// format_version, config, rope_convention ("split_halves"), tied_lm_head ("wte.weight"), vocab,
/// iter, best_val_loss. Throws std::runtime_error "[export] ..." on failure.
void export_safetensors(const train::LoadedModel& loaded, const std::string& path);

}  // namespace nanogpt::interop
