// A model as a Hugging Face transformers folder: config.json, model.safetensors, generation_config.json,
// tokenizer.json and tokenizer_config.json, which AutoModelForCausalLM and AutoTokenizer load as they
// load a model from the hub (and pipeline("text-generation") runs).
//
// Each architecture goes to the one stock transformers class that computes exactly what ours does:
//   learned or sinusoidal positions + LayerNorm + gelu | relu2, every head its own keys and values
//       -> GPT2LMHeadModel (Conv1D weights, i.e. ours transposed; sinusoidal positions become its
//          learned table; zero biases where ours have none)
//   rope + RMSNorm + swiglu (grouped-query attention and biases included) -> LlamaForCausalLM
//   rope + LayerNorm + gelu | relu2, every head its own keys and values
//       -> GPTNeoXForCausalLM (sequential residual, not parallel; zero biases where ours have none)
// Anything else (qk_norm, logit_softcap, other mixes) is refused with one line saying why.
// RoPE needs no permutation: ours pairs x[i] with x[i + hs/2], as transformers' rotate_half does.
#pragma once

#include <cstdint>
#include <string>

#include "data/vocab.h"
#include "model/gpt.h"

namespace nanogpt::interop {

/// The transformers class that holds `config` exactly ("GPT2LMHeadModel", "LlamaForCausalLM",
/// "GPTNeoXForCausalLM"). Throws std::invalid_argument "[export] --format=hf: ..." naming the
/// setting that none of them holds, and pointing to --format=safetensors.
std::string hf_architecture(const model::ModelConfig& config);

/// What export_hf wrote.
struct HfExport {
  std::string architecture;  // e.g. "GPT2LMHeadModel"
  int64_t tensors = 0;       // in model.safetensors
  int64_t parameters = 0;    // values in model.safetensors
};

/// Writes `model` (fp32) and `vocab` as a transformers folder at `out`, all at once (a staging
/// folder renamed onto `out`; `out` must not exist or be empty). `dropout` is the trained model's
/// (a loaded model's own is zeroed for inference), written for fine-tuning. Throws
/// std::invalid_argument "[export] ..." for an architecture hf_architecture refuses or a vocabulary
/// that does not match the model, std::runtime_error "[export] ..." when a file cannot be written;
/// nothing is left at `out` then.
HfExport export_hf(const model::GPT& model, const data::Vocab& vocab, double dropout, const std::string& out);

}  // namespace nanogpt::interop
