// ModelConfig: the architecture's rules (every impossible combination named with its values and a
// hint) and its one JSON mapping, used by checkpoints and exports alike.
#include "model/config.h"

#include <cmath>
#include <stdexcept>

namespace nanogpt::model {
namespace {

using Json = nlohmann::ordered_json;

// "key (value) rule", the same words TrainConfig::validate reports under its own tag.
void check(bool ok, const std::string& key, const std::string& value, const std::string& rule) {
  if (!ok) throw std::invalid_argument("[model] " + key + " (" + value + ") " + rule);
}

std::string text(int64_t v) { return std::to_string(v); }
std::string text(double v) { return Json(v).dump(); }  // shortest round trip: 1.0, 0.01, -0.1

}  // namespace

void ModelConfig::validate() const {
  // Each rule is written as what must hold, so NaN (settable in code) fails too.
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", vocab_size}, {"block_size", block_size}, {"n_layer", n_layer}, {"n_head", n_head}, {"n_embd", n_embd}};
  for (const auto& [key, value] : sizes) check(value >= 1, key, text(value), "must be >= 1");
  check(n_kv_head >= 0, "n_kv_head", text(n_kv_head), "must be >= 0 (0 means n_head: plain multi-head attention)");
  check(n_embd % n_head == 0, "n_embd", text(n_embd), "must be divisible by n_head (" + text(n_head) + ")");
  check(n_head % kv_heads() == 0, "n_head", text(n_head),
        "must be divisible by n_kv_head (" + text(kv_heads()) + "): each key/value head serves a whole group of query heads");
  check(pos_encoding == "rope" || pos_encoding == "sinusoidal" || pos_encoding == "learned", "pos_encoding", pos_encoding,
        "must be rope, sinusoidal or learned");
  check(pos_encoding != "rope" || head_size() % 2 == 0, "n_embd / n_head", text(head_size()),
        "must be even with pos_encoding rope: RoPE rotates channel pairs (change n_head, or use pos_encoding learned)");
  check(pos_encoding != "rope" || rope_base > 1, "rope_base", text(rope_base), "must be > 1 with pos_encoding rope (10000 is usual)");
  check(pos_encoding != "sinusoidal" || n_embd % 2 == 0, "n_embd", text(n_embd),
        "must be even with pos_encoding sinusoidal: sin and cos fill channel pairs");
  check(norm == "layernorm" || norm == "rmsnorm", "norm", norm, "must be layernorm or rmsnorm");
  check(attention == "math" || attention == "sdpa" || attention == "chunked" || attention == "flash" ||
            attention == "auto",
        "attention", attention, "must be math, sdpa, chunked, flash or auto");
  check(mlp == "gelu" || mlp == "gelu_tanh" || mlp == "relu2" || mlp == "swiglu", "mlp", mlp,
        "must be gelu, gelu_tanh, relu2 or swiglu");
  check(norm_eps > 0 && norm_eps < 1, "norm_eps", text(norm_eps), "must be in (0, 1) (1e-5 is usual)");
  check(mlp_width >= 0, "mlp_width", text(mlp_width), "must be >= 0 (0 = 4 n_embd, or 8 n_embd / 3 for swiglu)");
  check(logit_softcap >= 0 && std::isfinite(logit_softcap), "logit_softcap", text(logit_softcap),
        "must be a number >= 0 (0 = off; 15 to 30 is usual)");
  check(dropout >= 0 && dropout < 1, "dropout", text(dropout), "must be in [0, 1): e.g. 0.0 for tiny runs, 0.2 for shakespeare_char");
}

nlohmann::ordered_json to_json(const ModelConfig& m) {
  return Json{{"vocab_size", m.vocab_size}, {"block_size", m.block_size}, {"n_layer", m.n_layer},
              {"n_head", m.n_head},         {"n_kv_head", m.n_kv_head},   {"n_embd", m.n_embd},
              {"dropout", m.dropout},       {"bias", m.bias},             {"pos_encoding", m.pos_encoding},
              {"rope_base", m.rope_base},   {"norm", m.norm},             {"attention", m.attention},
              {"qk_norm", m.qk_norm},       {"mlp", m.mlp},               {"tie_embeddings", m.tie_embeddings},
              {"logit_softcap", m.logit_softcap}, {"norm_eps", m.norm_eps},   {"mlp_width", m.mlp_width}};
}

ModelConfig model_config_from_json(const nlohmann::ordered_json& j) {
  if (!j.is_object()) throw std::invalid_argument("[model] the model config is not a JSON object");
  auto field = [&](const char* key, bool (Json::*is_type)() const noexcept, const char* type) -> const Json& {
    if (!j.contains(key)) throw std::invalid_argument(std::string("[model] model config lacks '") + key + "'");
    const Json& v = j.at(key);
    if (!(v.*is_type)()) throw std::invalid_argument(std::string("[model] model config '") + key + "' is not " + type);
    return v;
  };
  auto integer = [&](const char* key) {
    const Json& v = field(key, &Json::is_number_integer, "an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)
      throw std::invalid_argument(std::string("[model] model config '") + key + "' is out of range");
    return v.get<int64_t>();
  };
  auto number = [&](const char* key) { return field(key, &Json::is_number, "a number").get<double>(); };
  auto string = [&](const char* key) { return field(key, &Json::is_string, "a string").get<std::string>(); };
  ModelConfig m;
  m.vocab_size = integer("vocab_size");
  m.block_size = integer("block_size");
  m.n_layer = integer("n_layer");
  m.n_head = integer("n_head");
  m.n_kv_head = integer("n_kv_head");
  m.n_embd = integer("n_embd");
  m.dropout = number("dropout");
  m.bias = field("bias", &Json::is_boolean, "true or false").get<bool>();
  m.pos_encoding = string("pos_encoding");
  m.rope_base = number("rope_base");
  m.norm = string("norm");
  m.attention = string("attention");
  if (j.contains("qk_norm")) m.qk_norm = field("qk_norm", &Json::is_boolean, "true or false").get<bool>();
  if (j.contains("mlp")) m.mlp = string("mlp");
  if (j.contains("tie_embeddings")) m.tie_embeddings = field("tie_embeddings", &Json::is_boolean, "true or false").get<bool>();
  if (j.contains("logit_softcap")) m.logit_softcap = number("logit_softcap");
  if (j.contains("norm_eps")) m.norm_eps = number("norm_eps");
  if (j.contains("mlp_width")) m.mlp_width = integer("mlp_width");
  return m;
}

}  // namespace nanogpt::model
