// A Hugging Face transformers folder (config.json, model.safetensors or a sharded index,
// tokenizer.json) as one of our checkpoints, ready for `nanogpt sample`, `serve`, `attention`,
// `export` and `train --init_from=resume` (or a fine-tune: `train --init_from=OUT`).
//
// Two architectures, each mapped onto ours exactly:
//   GPT2LMHeadModel: learned positions, LayerNorm with biases, GELU's tanh approximation, a tied head;
//       its Conv1D weights are ours transposed, its c_attn is [q; k; v] side by side.
//   LlamaForCausalLM: RoPE with the config's theta (rotate-half pairs, as ours), RMSNorm with its eps,
//       SwiGLU of intermediate_size ([gate; up] is our c_fc), grouped-query attention, tied or not.
// Anything else (another architecture, rope scaling, a head_dim apart from hidden / heads, a
// missing or unexpected tensor, a tokenizer step we do not run) is refused in one line naming it.
// Tensors are read one at a time (any of F32, BF16, F16) and converted to fp32 into the model,
// most straight into their parameter's memory: importing takes the fp32 model's size and one
// tensor besides. The folder holds the weights without optimizer state (a resume starts AdamW's
// moments afresh).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace nanogpt::interop {

/// What import_hf wrote.
struct HfImport {
  std::string architecture;      // "GPT2LMHeadModel" | "LlamaForCausalLM"
  std::string checkpoint;        // out_dir/ckpt_last.safetensors
  std::string config;            // out_dir/config.yaml
  model::ModelConfig model_config;
  int64_t tensors = 0;           // read from the model files
  int64_t parameters = 0;        // the model's values
  int64_t tokenizer_size = 0;    // tokens of tokenizer.json
};

/// Imports the transformers folder `dir` into `out_dir` (which must not exist or be empty; all or
/// nothing). block_size > 0 caps the context (a Llama 3 config allows 131072 positions; ours keeps a
/// table of block_size rows). Throws std::runtime_error "[import] ..." naming what it refuses.
HfImport import_hf(const std::string& dir, const std::string& out_dir, int64_t block_size = 0);

}  // namespace nanogpt::interop
