// Our model -> a transformers folder (see hf_export.h).
#include "interop/hf_export.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>
#include <vector>

#include "interop/hf_tokenizer.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "data/hf_tokenizer.h"
#include "model/norm.h"
#include "model/positions.h"

namespace nanogpt::interop {
namespace {

using Json = nlohmann::ordered_json;
using Tensors = std::vector<std::pair<std::string, torch::Tensor>>;

[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument("[export] --format=hf: " + what +
                              "; --format=safetensors keeps every architecture (weights, config and vocabulary)");
}

bool every_head_own_kv(const model::ModelConfig& c) { return c.kv_heads() == c.n_head; }

// The trained parameters by our names (wte.weight, h.0.attn.q_proj.weight, ...), fp32 on the CPU.
class Params {
 public:
  explicit Params(const model::GPT& model) {
    for (const auto& item : model->named_parameters(/*recurse=*/true))
      params_.emplace(item.key(), item.value().detach().to(torch::kCPU, torch::kFloat32));
  }
  torch::Tensor operator()(const std::string& name) const {
    auto it = params_.find(name);
    if (it == params_.end()) throw std::runtime_error("[export] the model has no parameter '" + name + "'");
    return it->second;
  }
  /// The parameter, or zeros of `size` when the model has none (no biases): the target has one.
  torch::Tensor or_zeros(const std::string& name, int64_t size) const {
    auto it = params_.find(name);
    return it != params_.end() ? it->second : torch::zeros({size});
  }
  bool has(const std::string& name) const { return params_.count(name) != 0; }

 private:
  std::map<std::string, torch::Tensor> params_;
};

// --- GPT-2: Conv1D layers hold W as (in, out), ours (out, in) --------------------------------------
Tensors gpt2_tensors(const model::ModelConfig& c, const Params& p) {
  const int64_t C = c.n_embd, H = c.mlp_hidden();
  Tensors t;
  t.emplace_back("transformer.wte.weight", p("wte.weight"));
  // Sinusoidal positions are a fixed table added to the embeddings: GPT-2's learned table holding it.
  t.emplace_back("transformer.wpe.weight",
                 c.pos_encoding == "learned" ? p("wpe.weight") : model::sinusoidal_table(c.block_size, C));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string ours = fmt::format("h.{}.", i), theirs = fmt::format("transformer.h.{}.", i);
    auto a = [&](const char* name) { return ours + "attn." + name; };
    t.emplace_back(theirs + "ln_1.weight", p(ours + "ln_1.weight"));
    t.emplace_back(theirs + "ln_1.bias", p.or_zeros(ours + "ln_1.bias", C));
    t.emplace_back(theirs + "attn.c_attn.weight",
                   torch::cat({p(a("q_proj.weight")), p(a("k_proj.weight")), p(a("v_proj.weight"))}).t());  // (C, 3C)
    t.emplace_back(theirs + "attn.c_attn.bias",
                   torch::cat({p.or_zeros(a("q_proj.bias"), C), p.or_zeros(a("k_proj.bias"), C),
                               p.or_zeros(a("v_proj.bias"), C)}));  // (3C)
    t.emplace_back(theirs + "attn.c_proj.weight", p(a("c_proj.weight")).t());  // (C, C)
    t.emplace_back(theirs + "attn.c_proj.bias", p.or_zeros(a("c_proj.bias"), C));
    t.emplace_back(theirs + "ln_2.weight", p(ours + "ln_2.weight"));
    t.emplace_back(theirs + "ln_2.bias", p.or_zeros(ours + "ln_2.bias", C));
    t.emplace_back(theirs + "mlp.c_fc.weight", p(ours + "mlp.c_fc.weight").t());  // (C, H)
    t.emplace_back(theirs + "mlp.c_fc.bias", p.or_zeros(ours + "mlp.c_fc.bias", H));
    t.emplace_back(theirs + "mlp.c_proj.weight", p(ours + "mlp.c_proj.weight").t());  // (H, C)
    t.emplace_back(theirs + "mlp.c_proj.bias", p.or_zeros(ours + "mlp.c_proj.bias", C));
  }
  t.emplace_back("transformer.ln_f.weight", p("ln_f.weight"));
  t.emplace_back("transformer.ln_f.bias", p.or_zeros("ln_f.bias", C));
  if (!c.tie_embeddings) t.emplace_back("lm_head.weight", p("lm_head.weight"));
  return t;
}

Json gpt2_config(const model::ModelConfig& c, double dropout) {
  return Json{{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"vocab_size", c.vocab_size},
              {"n_positions", c.block_size},
              {"n_ctx", c.block_size},
              {"n_embd", c.n_embd},
              {"n_layer", c.n_layer},
              {"n_head", c.n_head},
              {"n_inner", c.mlp_hidden()},
              // exact (erf) "gelu", GPT-2's own tanh approximation "gelu_new" (ours gelu_tanh), or "relu2"
              {"activation_function", c.mlp == "gelu_tanh" ? std::string("gelu_new") : c.mlp},
              {"resid_pdrop", dropout},
              {"embd_pdrop", dropout},
              {"attn_pdrop", dropout},
              {"layer_norm_epsilon", c.norm_eps},
              {"initializer_range", 0.02},
              {"scale_attn_weights", true},
              {"scale_attn_by_inverse_layer_idx", false},
              {"reorder_and_upcast_attn", false},
              {"tie_word_embeddings", c.tie_embeddings}};
}

// --- Llama: our q/k/v/c_proj are its q/k/v/o_proj; our swiglu c_fc is [gate; up] ----------------
Tensors llama_tensors(const model::ModelConfig& c, const Params& p) {
  const int64_t H = c.mlp_hidden();
  Tensors t;
  t.emplace_back("model.embed_tokens.weight", p("wte.weight"));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string ours = fmt::format("h.{}.", i), theirs = fmt::format("model.layers.{}.", i);
    const std::vector<std::string> kinds = {".weight", ".bias"};
    t.emplace_back(theirs + "input_layernorm.weight", p(ours + "ln_1.weight"));
    for (const auto& [from, to] : std::vector<std::pair<const char*, const char*>>{
             {"q_proj", "q_proj"}, {"k_proj", "k_proj"}, {"v_proj", "v_proj"}, {"c_proj", "o_proj"}})
      for (const auto& kind : kinds)
        if (p.has(ours + "attn." + from + kind))
          t.emplace_back(theirs + "self_attn." + to + kind, p(ours + "attn." + from + kind));
    t.emplace_back(theirs + "post_attention_layernorm.weight", p(ours + "ln_2.weight"));
    for (const auto& kind : kinds) {
      if (!p.has(ours + "mlp.c_fc" + kind)) continue;
      auto gate_up = p(ours + "mlp.c_fc" + kind).split(H);  // (H, C) each, or (H) each; silu(gate) * up
      t.emplace_back(theirs + "mlp.gate_proj" + kind, gate_up[0]);
      t.emplace_back(theirs + "mlp.up_proj" + kind, gate_up[1]);
      t.emplace_back(theirs + "mlp.down_proj" + kind, p(ours + "mlp.c_proj" + kind));
    }
  }
  t.emplace_back("model.norm.weight", p("ln_f.weight"));
  if (!c.tie_embeddings) t.emplace_back("lm_head.weight", p("lm_head.weight"));
  return t;
}

// RoPE's base in each spelling transformers reads: 4.x a top-level rope_theta, 5.x rope_parameters.
void add_rope(Json& config, const model::ModelConfig& c) {
  config["rope_theta"] = c.rope_base;
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_base}};
  config["rope_scaling"] = nullptr;
}

Json llama_config(const model::ModelConfig& c, double dropout) {
  Json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"vocab_size", c.vocab_size},
                 {"hidden_size", c.n_embd},
                 {"intermediate_size", c.mlp_hidden()},
                 {"num_hidden_layers", c.n_layer},
                 {"num_attention_heads", c.n_head},
                 {"num_key_value_heads", c.kv_heads()},
                 {"head_dim", c.head_size()},
                 {"hidden_act", "silu"},
                 {"max_position_embeddings", c.block_size},
                 {"rms_norm_eps", c.norm_eps},
                 {"attention_bias", c.bias},
                 {"mlp_bias", c.bias},
                 {"attention_dropout", dropout},  // Llama has no embedding or residual dropout
                 {"pretraining_tp", 1},
                 {"initializer_range", 0.02},
                 {"tie_word_embeddings", c.tie_embeddings}};
  add_rope(config, c);
  return config;
}

// --- GPT-NeoX: one query_key_value matrix, its rows head by head [q_h; k_h; v_h] -------------------
torch::Tensor neox_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t n_head) {
  // q, k, v: (C, C) weights or (C) biases; rows grouped by head: (nh, hs, ...) each.
  auto by_head = [&](const torch::Tensor& x) { return x.reshape({n_head, -1, x.dim() == 2 ? x.size(1) : 1}); };
  auto qkv = torch::cat({by_head(q), by_head(k), by_head(v)}, 1);  // (nh, 3 hs, C or 1)
  return q.dim() == 2 ? qkv.reshape({-1, q.size(1)}) : qkv.reshape({-1});  // (3C, C) or (3C)
}

Tensors neox_tensors(const model::ModelConfig& c, const Params& p) {
  const int64_t C = c.n_embd, H = c.mlp_hidden();
  Tensors t;
  t.emplace_back("gpt_neox.embed_in.weight", p("wte.weight"));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string ours = fmt::format("h.{}.", i), theirs = fmt::format("gpt_neox.layers.{}.", i);
    auto a = [&](const char* name) { return ours + "attn." + name; };
    t.emplace_back(theirs + "input_layernorm.weight", p(ours + "ln_1.weight"));
    t.emplace_back(theirs + "input_layernorm.bias", p.or_zeros(ours + "ln_1.bias", C));
    t.emplace_back(theirs + "post_attention_layernorm.weight", p(ours + "ln_2.weight"));
    t.emplace_back(theirs + "post_attention_layernorm.bias", p.or_zeros(ours + "ln_2.bias", C));
    t.emplace_back(theirs + "attention.query_key_value.weight",
                   neox_qkv(p(a("q_proj.weight")), p(a("k_proj.weight")), p(a("v_proj.weight")), c.n_head));
    t.emplace_back(theirs + "attention.query_key_value.bias",
                   neox_qkv(p.or_zeros(a("q_proj.bias"), C), p.or_zeros(a("k_proj.bias"), C),
                            p.or_zeros(a("v_proj.bias"), C), c.n_head));
    t.emplace_back(theirs + "attention.dense.weight", p(a("c_proj.weight")));
    t.emplace_back(theirs + "attention.dense.bias", p.or_zeros(a("c_proj.bias"), C));
    t.emplace_back(theirs + "mlp.dense_h_to_4h.weight", p(ours + "mlp.c_fc.weight"));
    t.emplace_back(theirs + "mlp.dense_h_to_4h.bias", p.or_zeros(ours + "mlp.c_fc.bias", H));
    t.emplace_back(theirs + "mlp.dense_4h_to_h.weight", p(ours + "mlp.c_proj.weight"));
    t.emplace_back(theirs + "mlp.dense_4h_to_h.bias", p.or_zeros(ours + "mlp.c_proj.bias", C));
  }
  t.emplace_back("gpt_neox.final_layer_norm.weight", p("ln_f.weight"));
  t.emplace_back("gpt_neox.final_layer_norm.bias", p.or_zeros("ln_f.bias", C));
  if (!c.tie_embeddings) t.emplace_back("embed_out.weight", p("lm_head.weight"));
  return t;
}

Json neox_config(const model::ModelConfig& c, double dropout) {
  Json config = {{"architectures", {"GPTNeoXForCausalLM"}},
                 {"model_type", "gpt_neox"},
                 {"vocab_size", c.vocab_size},
                 {"hidden_size", c.n_embd},
                 {"intermediate_size", c.mlp_hidden()},
                 {"num_hidden_layers", c.n_layer},
                 {"num_attention_heads", c.n_head},
                 {"hidden_act", c.mlp == "gelu_tanh" ? std::string("gelu_new") : c.mlp},  // "gelu" is exact (erf)
                 {"max_position_embeddings", c.block_size},
                 {"layer_norm_eps", c.norm_eps},
                 {"use_parallel_residual", false},  // x + attn(ln_1(x)), then + mlp(ln_2(·)): ours
                 {"attention_bias", true},          // zeros where ours have none
                 {"attention_dropout", dropout},
                 {"hidden_dropout", dropout},
                 {"initializer_range", 0.02},
                 {"tie_word_embeddings", c.tie_embeddings},
                 // RoPE on the whole head: 4.x spells it rotary_pct / rotary_emb_base
                 {"rotary_pct", 1.0},
                 {"rotary_emb_base", c.rope_base},
                 {"partial_rotary_factor", 1.0}};
  add_rope(config, c);
  config["rope_parameters"]["partial_rotary_factor"] = 1.0;
  return config;
}

// Our sampler's defaults (nanogpt sample), and no special tokens: generation runs to max_length,
// the model's context, unless told otherwise.
Json generation_config(const model::ModelConfig& c) {
  return Json{{"do_sample", true},       {"temperature", 0.8},     {"top_k", 200},
              {"max_length", c.block_size}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr},
              {"pad_token_id", nullptr}};
}

void write_json(const std::string& path, const Json& json) {
  io::write_bytes_atomically(path, json.dump(2) + "\n", "export");
}

}  // namespace

std::string hf_architecture(const model::ModelConfig& c) {
  // Every setting in the way, so that one try names them all.
  std::vector<std::string> reasons;
  if (c.logit_softcap > 0)
    reasons.push_back(fmt::format("logit_softcap ({}) is in none of GPT-2, Llama and GPT-NeoX (Gemma 2 caps logits, "
                                  "but its norms and embeddings differ from ours)", c.logit_softcap));
  if (c.qk_norm)
    reasons.push_back("qk_norm is in none of GPT-2, Llama and GPT-NeoX (Qwen3 normalises heads, but with the layers' "
                      "eps, 1e-5, not ours, 1e-6)");
  const bool gelu_like = c.mlp == "gelu" || c.mlp == "gelu_tanh" || c.mlp == "relu2";
  const std::string mix = fmt::format("pos_encoding={}, norm={}, mlp={}", c.pos_encoding, c.norm, c.mlp);
  auto own_kv = [&](const char* architecture) {
    if (!every_head_own_kv(c))
      reasons.push_back(fmt::format("n_kv_head={} of n_head={}: {} gives every head its own keys and values",
                                    c.kv_heads(), c.n_head, architecture));
  };
  std::string architecture;
  if (c.pos_encoding == "learned" || c.pos_encoding == "sinusoidal") {
    if (c.norm != "layernorm" || !gelu_like)
      reasons.push_back(mix + ": GPT-2, the one stock model with a position table, has LayerNorm and an ungated "
                              "MLP (norm=layernorm, mlp=gelu or relu2)");
    own_kv("GPT-2");
    architecture = "GPT2LMHeadModel";
  } else if (c.norm == "rmsnorm" && c.mlp == "swiglu") {
    architecture = "LlamaForCausalLM";
  } else if (c.norm == "layernorm" && gelu_like) {
    own_kv("GPT-NeoX");
    architecture = "GPTNeoXForCausalLM";
  } else {
    reasons.push_back(mix + ": RoPE models map to Llama (norm=rmsnorm, mlp=swiglu) or GPT-NeoX (norm=layernorm, "
                            "mlp=gelu or relu2)");
  }
  if (!reasons.empty()) {
    std::string all;
    for (const auto& reason : reasons) all += (all.empty() ? "" : "; ") + reason;
    refuse(all);
  }
  return architecture;
}

HfExport export_hf(const model::GPT& model, const data::Vocab& vocab, double dropout, const std::string& out) {
  const model::ModelConfig& c = model->config();
  HfExport result;
  if (vocab.kind() == data::TokenizerKind::Bpe)
    vocab.require_char("export", "--format=hf (its tokenizer.json maps characters, or is an imported one)",
                       "--format=safetensors keeps the bpe tokenizer");
  result.architecture = hf_architecture(c);
  // An imported tokenizer may hold fewer tokens than the model has rows (a vocabulary padded for speed).
  if (vocab.kind() == data::TokenizerKind::Hf ? vocab.size() > c.vocab_size : vocab.size() != c.vocab_size)
    throw std::invalid_argument(fmt::format(
        "[export] vocabulary has {} tokens but the model's vocab_size is {} (corrupted checkpoint?)", vocab.size(),
        c.vocab_size));

  const Params params(model);
  Tensors tensors;
  Json config;
  if (result.architecture == "GPT2LMHeadModel") {
    tensors = gpt2_tensors(c, params);
    config = gpt2_config(c, dropout);
  } else if (result.architecture == "LlamaForCausalLM") {
    tensors = llama_tensors(c, params);
    config = llama_config(c, dropout);
  } else {
    tensors = neox_tensors(c, params);
    config = neox_config(c, dropout);
  }
  for (auto& [name, tensor] : tensors) {
    tensor = tensor.contiguous();
    ++result.tensors;
    result.parameters += tensor.numel();
  }
  // No special tokens: generation ends at max_length (generation_config.json) or when told.
  config["bos_token_id"] = nullptr;
  config["eos_token_id"] = nullptr;
  config["pad_token_id"] = nullptr;
  config["use_cache"] = true;
  config["dtype"] = "float32";        // 5.x
  config["torch_dtype"] = "float32";  // 4.x

  io::StagedDir dir(out, "export");
  io::write_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
  write_json(dir / "config.json", config);
  write_json(dir / "generation_config.json", generation_config(c));
  if (const data::HfTokenizer* imported = vocab.hf_tokenizer()) {  // the imported file, byte for byte
    io::write_bytes_atomically(dir / "tokenizer.json", imported->json(), "export");
    write_json(dir / "tokenizer_config.json", hf_imported_tokenizer_config_json(*imported, c.block_size));
  } else {
    write_json(dir / "tokenizer.json", hf_tokenizer_json(vocab));
    write_json(dir / "tokenizer_config.json", hf_tokenizer_config_json(c.block_size));
  }
  dir.commit();
  return result;
}

}  // namespace nanogpt::interop
