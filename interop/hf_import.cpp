// A transformers folder -> our checkpoint (see hf_import.h): config.json mapped onto ModelConfig,
// each of our parameters filled from its tensor(s) in the model files, one at a time, and the
// model written as a checkpoint of weights only. The memory it takes is the model's own (fp32)
// and one tensor besides: most tensors are read straight into their parameter.
#include "interop/hf_import.h"
#include "interop/imported_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "data/vocab.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/text.h"
#include "model/gpt.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace nanogpt::interop {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

Json read_json(const std::string& path) {
  const Json j = Json::parse(io::read_file(path, "import"), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw import_error("'" + path + "' is not a JSON object");
  return j;
}

// The model's tensors by name, over model.safetensors or the shards its index names.
class Weights {
 public:
  explicit Weights(const std::string& dir) : dir_(dir) {
    const std::string index = dir + "/model.safetensors.index.json", single = dir + "/model.safetensors";
    std::map<std::string, std::string> file_of;  // tensor -> file
    if (fs::exists(index)) {
      const Json map = read_json(index).value("weight_map", Json());
      if (!map.is_object()) throw import_error("'" + index + "' has no weight_map");
      for (const auto& [name, file] : map.items()) file_of[name] = file.get<std::string>();
    } else if (!fs::exists(single)) {
      throw import_error("'" + dir + "' has neither model.safetensors nor model.safetensors.index.json" +
                         (fs::exists(dir + "/pytorch_model.bin")
                              ? std::string(" (only pytorch_model.bin: save it again with safe_serialization=True)")
                              : std::string(" (download the model's safetensors files)")));
    }
    std::set<std::string> files;
    for (const auto& [name, file] : file_of) files.insert(file);
    if (file_of.empty()) files.insert("model.safetensors");
    for (const auto& file : files) {
      auto reader = std::make_unique<io::SafeTensorsReader>(dir + "/" + file, "import");
      for (const auto& info : reader->tensors()) {
        if (!file_of.empty() && file_of.count(info.name) && file_of[info.name] != file) continue;
        where_[info.name] = {reader.get(), &info};
      }
      readers_.push_back(std::move(reader));
    }
    for (const auto& [name, file] : file_of)
      if (!where_.count(name)) throw import_error("the index names '" + name + "' in " + file + ", which lacks it");
  }

  bool has(const std::string& name) const { return where_.count(name) != 0; }
  int64_t count() const { return static_cast<int64_t>(where_.size()); }

  /// The tensor in fp32, for a parameter that takes it transposed or split; throws naming it when
  /// the files lack it.
  torch::Tensor get(const std::string& name) {
    const auto& [reader, info] = find(name);
    return reader->read(*info).to(torch::kFloat);
  }
  /// Reads the tensor straight into `dst` (a parameter, or rows of one): no copy in between when
  /// it is stored in fp32, one of its own size in bf16 or fp16. Throws naming it when the files
  /// lack it or its shape is not dst's.
  void read_into(const std::string& name, const torch::Tensor& dst) {
    const auto& [reader, info] = find(name);
    if (torch::IntArrayRef(info->shape) != dst.sizes())
      throw import_error(fmt::format("the tensor '{}' has shape [{}], but config.json's sizes make it [{}]", name,
                                     fmt::join(info->shape, ", "), fmt::join(dst.sizes(), ", ")));
    reader->read_into(*info, dst);
  }
  void skip(const std::string& name) { used_.insert(name); }

  /// A tensor no parameter took, other than buffers transformers may have saved: its name, or "".
  std::string first_unused() const {
    for (const auto& [name, entry] : where_)
      if (!used_.count(name) && !ends_with(name, ".attn.bias") && !ends_with(name, ".attn.masked_bias") &&
          !ends_with(name, ".rotary_emb.inv_freq"))
        return name;
    return "";
  }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<io::SafeTensorsReader>> readers_;
  std::map<std::string, std::pair<io::SafeTensorsReader*, const io::TensorInfo*>> where_;
  std::set<std::string> used_;

  const std::pair<io::SafeTensorsReader*, const io::TensorInfo*>& find(const std::string& name) {
    auto it = where_.find(name);
    if (it == where_.end())
      throw import_error("'" + dir_ + "' lacks the tensor '" + name + "' that config.json's model needs");
    used_.insert(name);
    return it->second;
  }
};

// --- config.json -> ModelConfig ------------------------------------------------------------------

struct Fields {
  const Json& j;
  std::string path;
  int64_t integer(const char* key) const {
    if (!j.contains(key) || !j[key].is_number_integer()) throw import_error(path + ": '" + key + "' is missing or not an integer");
    return j[key].get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t fallback) const {
    return j.contains(key) && !j[key].is_null() ? integer(key) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) throw import_error(path + ": '" + key + "' is not a number");
    return j[key].get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
  }
  std::string text_or(const char* key, const std::string& fallback) const {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
  }
  [[noreturn]] void refuse(const std::string& what) const { throw import_error(path + ": " + what + ", which this program does not implement"); }
};

model::ModelConfig gpt2_config(const Fields& f) {
  model::ModelConfig c;
  c.vocab_size = f.integer("vocab_size");
  c.block_size = f.integer("n_positions");
  c.n_layer = f.integer("n_layer");
  c.n_head = f.integer("n_head");
  c.n_embd = f.integer("n_embd");
  c.mlp_width = f.integer_or("n_inner", 0);
  c.dropout = 0.0;  // fine-tuning sets its own
  c.bias = true;
  c.pos_encoding = "learned";
  c.norm = "layernorm";
  c.norm_eps = f.number_or("layer_norm_epsilon", 1e-5);
  const std::string act = f.text_or("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") c.mlp = "gelu_tanh";
  else if (act == "gelu") c.mlp = "gelu";
  else f.refuse("activation_function '" + act + "'");
  if (!f.boolean_or("scale_attn_weights", true)) f.refuse("scale_attn_weights false");
  if (f.boolean_or("scale_attn_by_inverse_layer_idx", false)) f.refuse("scale_attn_by_inverse_layer_idx");
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", true);
  return c;
}

model::ModelConfig llama_config(const Fields& f) {
  model::ModelConfig c;
  c.vocab_size = f.integer("vocab_size");
  c.block_size = f.integer("max_position_embeddings");
  c.n_layer = f.integer("num_hidden_layers");
  c.n_head = f.integer("num_attention_heads");
  c.n_kv_head = f.integer_or("num_key_value_heads", c.n_head);
  c.n_embd = f.integer("hidden_size");
  c.mlp_width = f.integer("intermediate_size");
  c.dropout = 0.0;
  if (c.n_head > 0 && f.integer_or("head_dim", c.n_embd / c.n_head) != c.n_embd / c.n_head)
    f.refuse(fmt::format("head_dim {} apart from hidden_size / num_attention_heads ({})", f.integer("head_dim"),
                         c.n_embd / c.n_head));
  const std::string act = f.text_or("hidden_act", "silu");
  if (act != "silu") f.refuse("hidden_act '" + act + "' (SwiGLU needs silu)");
  const bool attention_bias = f.boolean_or("attention_bias", false), mlp_bias = f.boolean_or("mlp_bias", false);
  if (attention_bias != mlp_bias) f.refuse("attention_bias without mlp_bias (or the reverse)");
  c.bias = attention_bias;
  c.pos_encoding = "rope";
  c.norm = "rmsnorm";
  c.norm_eps = f.number_or("rms_norm_eps", 1e-6);
  c.mlp = "swiglu";
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", false);
  // RoPE's base: 4.x a top-level rope_theta, 5.x rope_parameters; scaling of any kind is refused.
  c.rope_base = f.number_or("rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!f.j.contains(key) || f.j[key].is_null()) continue;
    const Json& rope = f.j[key];
    const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
    if (type != "default") f.refuse(std::string(key) + " of type '" + type + "'");
    if (rope.contains("rope_theta") && rope["rope_theta"].is_number()) c.rope_base = rope["rope_theta"].get<double>();
  }
  return c;
}

// --- the tensors ---------------------------------------------------------------------------------

// Our parameters, each filled once from the model files: read straight into it where the tensor
// is ours as it is stored (most of them, the embeddings among them), else converted and copied.
// Only the model's own memory is kept, and one tensor at a time besides it.
class Filler {
 public:
  Filler(model::GPT& gpt, Weights& weights) : weights_(weights) {
    for (auto& item : gpt->named_parameters()) params_.emplace(item.key(), item.value());
  }
  /// Reads the tensor `source` into our parameter `name`.
  void take(const std::string& name, const std::string& source) {
    weights_.read_into(source, param(name, source));
  }
  /// Copies `value` (made from `source`: transposed, split) into our parameter `name`, checking the shape.
  void set(const std::string& name, const torch::Tensor& value, const std::string& source) {
    const torch::Tensor p = param(name, source);
    if (p.sizes() != value.sizes())
      throw import_error(fmt::format("the tensor '{}' has shape [{}], but config.json's sizes make it [{}]", source,
                                     fmt::join(value.sizes(), ", "), fmt::join(p.sizes(), ", ")));
    p.copy_(value);
  }
  /// Our parameter `name`, counted as filled: the caller fills it (rows of it from several tensors).
  torch::Tensor param(const std::string& name, const std::string& source) {
    auto it = params_.find(name);
    if (it == params_.end()) throw import_error("no parameter '" + name + "' for '" + source + "' (a bug in the mapping)");
    filled_.insert(name);
    return it->second;
  }
  std::string first_unfilled() const {
    for (const auto& [name, p] : params_)
      if (!filled_.count(name)) return name;
    return "";
  }

 private:
  Weights& weights_;
  std::map<std::string, torch::Tensor> params_;
  std::set<std::string> filled_;
};

void load_gpt2(const model::ModelConfig& c, Weights& w, Filler& fill) {
  const std::string p = w.has("transformer.wte.weight") ? "transformer." : "";  // the hub's files lack the prefix
  const int64_t C = c.n_embd;
  fill.take("wte.weight", p + "wte.weight");
  fill.set("wpe.weight", w.get(p + "wpe.weight").narrow(0, 0, c.block_size), p + "wpe.weight");  // block_size may cap it
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string ours = fmt::format("h.{}.", i), theirs = fmt::format("{}h.{}.", p, i);
    for (const char* norm : {"ln_1", "ln_2"})
      for (const char* kind : {".weight", ".bias"})
        fill.take(ours + norm + kind, theirs + norm + kind);
    // Conv1D holds W as (in, out): ours transposed; c_attn's columns are [q k v].
    const auto qkv = w.get(theirs + "attn.c_attn.weight").t().split(C);  // 3 x (C, C)
    const auto qkv_bias = w.get(theirs + "attn.c_attn.bias").split(C);   // 3 x (C)
    const char* names[3] = {"q_proj", "k_proj", "v_proj"};
    for (int k = 0; k < 3; ++k) {
      fill.set(ours + "attn." + names[k] + ".weight", qkv[k], theirs + "attn.c_attn.weight");
      fill.set(ours + "attn." + names[k] + ".bias", qkv_bias[k], theirs + "attn.c_attn.bias");
    }
    for (const char* layer : {"attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
      const std::string name = std::string(layer);
      fill.set(ours + name + ".weight", w.get(theirs + name + ".weight").t(), theirs + name + ".weight");
      fill.take(ours + name + ".bias", theirs + name + ".bias");
    }
  }
  fill.take("ln_f.weight", p + "ln_f.weight");
  fill.take("ln_f.bias", p + "ln_f.bias");
  if (!c.tie_embeddings) fill.take("lm_head.weight", "lm_head.weight");
  else if (w.has("lm_head.weight")) w.skip("lm_head.weight");  // a saved copy of the tied wte
}

void load_llama(const model::ModelConfig& c, Weights& w, Filler& fill) {
  fill.take("wte.weight", "model.embed_tokens.weight");
  const std::vector<std::string> kinds = c.bias ? std::vector<std::string>{".weight", ".bias"} : std::vector<std::string>{".weight"};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string ours = fmt::format("h.{}.", i), theirs = fmt::format("model.layers.{}.", i);
    fill.take(ours + "ln_1.weight", theirs + "input_layernorm.weight");
    fill.take(ours + "ln_2.weight", theirs + "post_attention_layernorm.weight");
    // RoPE needs no permutation: transformers' rotate_half pairs x[i] with x[i + hs/2], as ours.
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"q_proj", "q_proj"}, {"k_proj", "k_proj"}, {"v_proj", "v_proj"}, {"o_proj", "c_proj"}})
      for (const auto& kind : kinds)
        fill.take(ours + "attn." + to + kind, theirs + "self_attn." + from + kind);
    for (const auto& kind : kinds) {
      // Our swiglu c_fc computes [gate; up]: silu(gate) * up.
      const torch::Tensor c_fc = fill.param(ours + "mlp.c_fc" + kind, theirs + "mlp.gate_proj" + kind);
      const int64_t width = c_fc.size(0) / 2;
      w.read_into(theirs + "mlp.gate_proj" + kind, c_fc.narrow(0, 0, width));
      w.read_into(theirs + "mlp.up_proj" + kind, c_fc.narrow(0, width, width));
      fill.take(ours + "mlp.c_proj" + kind, theirs + "mlp.down_proj" + kind);
    }
  }
  fill.take("ln_f.weight", "model.norm.weight");
  if (!c.tie_embeddings) fill.take("lm_head.weight", "lm_head.weight");
  else if (w.has("lm_head.weight")) w.skip("lm_head.weight");
}

}  // namespace

HfImport import_hf(const std::string& dir, const std::string& out_dir, int64_t block_size) {
  const std::string config_path = dir + "/config.json";
  if (!fs::is_regular_file(config_path))
    throw import_error("'" + dir + "' has no config.json (give a folder as `hf download` writes it)");
  const Json config = read_json(config_path);
  const Fields fields{config, config_path};
  HfImport result;
  const Json archs = config.value("architectures", Json::array());
  result.architecture = archs.is_array() && !archs.empty() && archs[0].is_string() ? archs[0].get<std::string>()
                                                                                    : config.value("model_type", std::string("?"));
  model::ModelConfig c;
  if (result.architecture == "GPT2LMHeadModel") c = gpt2_config(fields);
  else if (result.architecture == "LlamaForCausalLM") c = llama_config(fields);
  else
    throw import_error(config_path + ": architecture '" + result.architecture +
                       "' is not one this program imports (GPT2LMHeadModel, LlamaForCausalLM)");
  if (block_size > 0) c.block_size = std::min(c.block_size, block_size);
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw import_error(config_path + ": " + e.what());
  }

  const std::string tokenizer_path = dir + "/tokenizer.json";
  if (!fs::is_regular_file(tokenizer_path))
    throw import_error("'" + dir + "' has no tokenizer.json (the fast tokenizer's file, which this program reads)");
  data::Vocab vocab = data::Vocab::from_hf_tokenizer(io::read_file(tokenizer_path, "import"));
  result.tokenizer_size = vocab.size();
  if (vocab.size() > c.vocab_size)
    throw import_error(fmt::format("tokenizer.json has {} tokens, more than the model's vocab_size {}", vocab.size(),
                                   c.vocab_size));
  // A padded vocabulary (rows no token maps to) would import, and then every command would refuse
  // the folder: say so here, once.
  if (vocab.size() < c.vocab_size)
    throw import_error(fmt::format("tokenizer.json has {} tokens but the model's vocab_size is {}: a vocabulary padded "
                                   "with rows no token names is not supported (the tokenizer must name every row)",
                                   vocab.size(), c.vocab_size));

  Weights weights(dir);
  result.tensors = weights.count();
  model::GPT gpt(c, /*initialise=*/false);  // memory the filling touches, tensor by tensor
  {
    torch::NoGradGuard no_grad;  // the parameters are written in place
    Filler fill(gpt, weights);
    if (result.architecture == "GPT2LMHeadModel") load_gpt2(c, weights, fill);
    else load_llama(c, weights, fill);
    if (const auto missing = fill.first_unfilled(); !missing.empty())
      throw import_error("nothing in '" + dir + "' fills our parameter '" + missing + "' (a bug in the mapping)");
  }
  if (const auto extra = weights.first_unused(); !extra.empty())
    throw import_error("'" + dir + "' holds the tensor '" + extra + "', which " + result.architecture +
                       " as this program reads it has no place for (a variant it does not import)");
  result.parameters = gpt->num_params(/*non_embedding=*/false);

  train::TrainConfig train_config;
  train_config.set_architecture(c);
  train_config.out_dir = out_dir;
  train::CheckpointMeta meta;
  meta.config_yaml = train::to_yaml(train_config);
  meta.model_config = c;
  meta.vocab = vocab;
  fresh_generators(meta, static_cast<uint64_t>(train_config.seed));

  // No optimizer state: AdamW's moments would be zeros twice the model's size, in memory and on
  // disk; `train --init_from=resume` starts them afresh.
  io::StagedDir staged(out_dir, "import");
  write_checkpoint_folder(staged, gpt, /*optimizer=*/nullptr, meta, "import");
  staged.commit();
  result.checkpoint = out_dir + "/" + train::kLastCheckpoint;
  result.config = out_dir + "/config.yaml";
  result.model_config = c;
  return result;
}

}  // namespace nanogpt::interop
