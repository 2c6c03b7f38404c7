// The nanoGPT layout mapping (see nanogpt_layout.h).
#include "train/nanogpt_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "data/utf8.h"
#include "io/text.h"

namespace nanogpt::train {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kTorchCompilePrefix = "_orig_mod.";  // torch.compile's wrapper, in nanoGPT's state_dict keys

std::runtime_error import_error(const std::string& what) { return std::runtime_error(io::printable("[import] " + what)); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string shape_str(torch::IntArrayRef shape) {
  std::ostringstream o;
  o << shape;
  return o.str();
}

// TrainConfig's fields that nanoGPT's train.py has under the same name (its checkpoint's config dict).
const std::pair<const char*, int64_t TrainConfig::*> kIntKeys[] = {
    {"eval_interval", &TrainConfig::eval_interval},
    {"log_interval", &TrainConfig::log_interval},
    {"eval_iters", &TrainConfig::eval_iters},
    {"gradient_accumulation_steps", &TrainConfig::gradient_accumulation_steps},
    {"batch_size", &TrainConfig::batch_size},
    {"max_iters", &TrainConfig::max_iters},
    {"warmup_iters", &TrainConfig::warmup_iters},
    {"lr_decay_iters", &TrainConfig::lr_decay_iters}};
const std::pair<const char*, double TrainConfig::*> kNumberKeys[] = {
    {"learning_rate", &TrainConfig::learning_rate}, {"weight_decay", &TrainConfig::weight_decay},
    {"beta1", &TrainConfig::beta1},                 {"beta2", &TrainConfig::beta2},
    {"grad_clip", &TrainConfig::grad_clip},         {"min_lr", &TrainConfig::min_lr}};
const std::pair<const char*, bool TrainConfig::*> kBoolKeys[] = {{"eval_only", &TrainConfig::eval_only},
                                                                 {"always_save_checkpoint", &TrainConfig::always_save_checkpoint},
                                                                 {"decay_lr", &TrainConfig::decay_lr},
                                                                 {"compile", &TrainConfig::compile}};

}  // namespace

model::ModelConfig config_from_model_args(const Json& args) {
  if (!args.is_object()) throw import_error("the checkpoint has no model_args dict (not a nanoGPT checkpoint?)");
  const Json expected = model_args_of(model::ModelConfig{});
  for (const auto& item : args.items())
    if (!expected.contains(item.key()))
      throw import_error("model_args has '" + item.key() + "', which nanoGPT's GPTConfig lacks: a modified model.py "
                         "this importer does not know");
  auto field = [&](const char* key, bool (Json::*is_type)() const noexcept, const char* type) -> const Json& {
    if (!args.contains(key) || !(args.at(key).*is_type)())
      throw import_error(std::string("model_args '") + key + "' is missing or not " + type + " (not a nanoGPT checkpoint?)");
    return args.at(key);
  };
  model::ModelConfig m;
  m.n_layer = field("n_layer", &Json::is_number_integer, "an integer").get<int64_t>();
  m.n_head = field("n_head", &Json::is_number_integer, "an integer").get<int64_t>();
  m.n_embd = field("n_embd", &Json::is_number_integer, "an integer").get<int64_t>();
  m.block_size = field("block_size", &Json::is_number_integer, "an integer").get<int64_t>();
  m.vocab_size = field("vocab_size", &Json::is_number_integer, "an integer").get<int64_t>();
  m.bias = field("bias", &Json::is_boolean, "true or false").get<bool>();
  m.dropout = field("dropout", &Json::is_number, "a number").get<double>();
  m.n_kv_head = 0;  // nanoGPT's attention: every head has its own keys and values
  m.pos_encoding = "learned";
  m.norm = "layernorm";
  try {
    m.validate();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    throw import_error("model_args: " + what.substr(what.find("] ") + 2));
  }
  return m;
}

Json model_args_of(const model::ModelConfig& m) {
  return Json{{"n_layer", m.n_layer},       {"n_head", m.n_head}, {"n_embd", m.n_embd},  {"block_size", m.block_size},
              {"bias", m.bias},             {"vocab_size", m.vocab_size}, {"dropout", m.dropout}};
}

NanoVocab vocab_from_meta(const Json& meta, int64_t vocab_size, const std::string& meta_path) {
  const std::string where = "meta.pkl '" + meta_path + "'";
  const Json itos = meta.value("itos", Json());
  if (!itos.is_array()) {
    std::string keys;
    for (const auto& key : meta.value("keys", Json::array()))
      keys += (keys.empty() ? "'" : ", '") + (key.is_string() ? key.get<std::string>() : key.dump()) + "'";
    throw import_error(where + " has no itos (keys: " + (keys.empty() ? "none" : keys) + "), so its tokens are not "
                       "characters: a GPT-2 BPE model cannot be imported, nanogpt-cpp is character-level");
  }
  const int64_t n = static_cast<int64_t>(itos.size());
  if (n == 0) throw import_error(where + ": itos is empty");
  std::u32string chars(static_cast<size_t>(n), U'\0');
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (const Json& entry : itos) {
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_number_integer() || !entry[1].is_array())
      throw import_error(where + ": itos is not a dict of integer ids to strings");
    const int64_t id = entry[0].get<int64_t>();
    const Json& cps = entry[1];
    if (cps.size() != 1) {
      std::string text;
      for (const Json& cp : cps) {
        const auto c = static_cast<char32_t>(cp.get<uint32_t>());
        if (c <= 0x10FFFF && (c < 0xD800 || c > 0xDFFF)) data::append_utf8(text, c);
      }
      throw import_error(where + ": token " + std::to_string(id) + " is '" + text + "', " + std::to_string(cps.size()) +
                         " characters: a subword (BPE) vocabulary, and nanogpt-cpp is character-level");
    }
    const uint32_t cp = cps[0].get<uint32_t>();
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      throw import_error(where + ": token " + std::to_string(id) + " is not a Unicode character");
    if (id < 0 || id >= n || seen[static_cast<size_t>(id)])
      throw import_error(where + ": itos ids are not 0.." + std::to_string(n - 1) + ", each once (id " + std::to_string(id) + ")");
    seen[static_cast<size_t>(id)] = true;
    chars[static_cast<size_t>(id)] = static_cast<char32_t>(cp);
  }
  NanoVocab out;
  out.vocab = data::Vocab::from_chars(chars);
  if (out.vocab.size() != n) throw import_error(where + ": itos holds a character twice");
  const Json stoi = meta.value("stoi", Json());
  if (stoi.is_array()) {
    bool inverse = static_cast<int64_t>(stoi.size()) == n;
    for (const Json& entry : stoi) {
      inverse = inverse && entry.is_array() && entry.size() == 2 && entry[0].is_number_integer() && entry[1].is_array() &&
                entry[1].size() == 1 && entry[0].get<int64_t>() >= 0 && entry[0].get<int64_t>() < n &&
                chars[entry[0].get<size_t>()] == static_cast<char32_t>(entry[1][0].get<uint32_t>());
      if (!inverse) break;
    }
    if (!inverse) throw import_error(where + ": stoi is not the inverse of itos (a damaged meta.pkl?)");
  }
  if (n != vocab_size)
    throw import_error(where + " has " + std::to_string(n) + " characters but the model's vocab_size is " +
                       std::to_string(vocab_size) + " (the meta.pkl of another dataset, or a BPE model?)");
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::map<char32_t, int64_t> nano_id;
  for (int64_t id = 0; id < n; ++id) nano_id[chars[static_cast<size_t>(id)]] = id;
  for (int64_t id = 0; id < n; ++id) order[static_cast<size_t>(id)] = nano_id.at(out.vocab.char_at(id));
  out.order = torch::tensor(order, torch::kLong);
  return out;
}

TrainConfig train_config_from_nanogpt(const Json& config, const model::ModelConfig& model, const std::string& out_dir,
                                      std::vector<std::string>& notes) {
  TrainConfig c;
  c.model = model;
  c.out_dir = out_dir;
  c.init_from = "resume";
  if (!config.is_object()) {
    notes.push_back("the checkpoint has no config dict: the training settings in config.yaml are nanogpt-cpp's defaults");
    return c;
  }
  const TrainConfig base = c;
  const Json dataset = config.value("dataset", Json());
  if (dataset.is_string() && !dataset.get<std::string>().empty()) {
    const std::string name = dataset.get<std::string>();
    c.dataset = name.find('/') == std::string::npos ? "data/" + name : name;
  }
  auto carry = [&](const char* key, auto& field, bool ok, const char* type) {
    if (!config.contains(key)) return;
    const Json& value = config.at(key);
    if (ok)
      field = value.get<std::remove_reference_t<decltype(field)>>();
    else
      notes.push_back(std::string("config '") + key + "' (" + value.dump() + ") is not " + type + ": the default " +
                      Json(field).dump() + " is kept");
  };
  for (const auto& [key, field] : kIntKeys) carry(key, c.*field, config.value(key, Json()).is_number_integer(), "an integer");
  for (const auto& [key, field] : kNumberKeys) carry(key, c.*field, config.value(key, Json()).is_number(), "a number");
  for (const auto& [key, field] : kBoolKeys) carry(key, c.*field, config.value(key, Json()).is_boolean(), "true or false");
  try {
    c.validate();
  } catch (const std::exception& e) {
    notes.push_back(std::string("the training settings do not validate here (") + e.what() +
                    "): config.yaml has nanogpt-cpp's defaults instead");
    const std::string kept_dataset = c.dataset;
    c = base;
    c.dataset = kept_dataset;
  }
  return c;
}

Json nanogpt_config_of(const TrainConfig& config, const model::ModelConfig& model, const std::string& out_dir) {
  std::string dataset = config.dataset;
  while (dataset.size() > 1 && dataset.back() == '/') dataset.pop_back();
  Json j = {{"out_dir", out_dir}, {"dataset", std::filesystem::path(dataset).filename().string()}};
  for (const auto& [key, field] : kIntKeys) j[key] = config.*field;
  for (const auto& [key, field] : kNumberKeys) j[key] = config.*field;
  for (const auto& [key, field] : kBoolKeys) j[key] = config.*field;
  const Json args = model_args_of(model);
  for (const auto& item : args.items())
    if (item.key() != "vocab_size") j[item.key()] = item.value();  // train.py's config has no vocab_size
  return j;
}

NanoLayout::NanoLayout(model::GPT& gpt) {
  for (const auto& item : gpt->named_parameters()) {
    Slot slot{item.key(), "transformer." + item.key(), -1, item.value().sizes().vec()};
    for (int part = 0; part < 3; ++part) {
      const std::string proj = std::string(".attn.") + "qkv"[part] + "_proj.";
      const auto at = slot.ours.find(proj);
      if (at == std::string::npos) continue;
      slot.nano = "transformer." + slot.ours.substr(0, at) + ".attn.c_attn." + slot.ours.substr(at + proj.size());
      slot.part = part;
    }
    const auto [it, fresh] = nano_shape_.emplace(slot.nano, slot.shape);
    if (fresh)
      nano_.push_back(slot.nano);
    else
      it->second[0] += slot.shape[0];  // c_attn: q, k and v stacked along the rows
    slots_.push_back(slot);
  }
}

std::vector<std::string> NanoLayout::state_dict_keys() const {
  std::vector<std::string> keys = nano_;
  keys.push_back(kNanoHead);
  return keys;
}

std::vector<std::string> NanoLayout::optimizer_order() const {
  std::vector<std::string> order;
  for (const bool decayed : {true, false})
    for (const auto& name : nano_)
      if ((nano_shape_.at(name).size() >= 2) == decayed) order.push_back(name);
  return order;
}

torch::Tensor NanoLayout::piece(const Slot& slot, const torch::Tensor& whole, const torch::Tensor& order) const {
  if (slot.part >= 0) return whole.narrow(0, slot.part * slot.shape[0], slot.shape[0]);  // nanoGPT: q, k, v = split(C)
  if (slot.nano == kNanoEmbedding && order.defined()) return whole.index_select(0, order);
  return whole;
}

template <typename Ours>
torch::Tensor NanoLayout::assemble(const std::string& nano, const Ours& ours) const {
  std::vector<torch::Tensor> parts;
  for (const auto& slot : slots_)
    if (slot.nano == nano) parts.push_back(ours(slot));
  return (parts.size() == 1 ? parts[0] : torch::cat(parts, 0)).contiguous();
}

void NanoLayout::load_weights(model::GPT& gpt, const std::map<std::string, torch::Tensor>& tensors,
                              const torch::Tensor& order) const {
  std::map<std::string, torch::Tensor> nano;
  for (const auto& [name, tensor] : tensors) {
    if (name.rfind("model:", 0) != 0) continue;
    std::string key = name.substr(std::strlen("model:"));
    if (key.rfind(kTorchCompilePrefix, 0) == 0) key = key.substr(std::strlen(kTorchCompilePrefix));
    if (ends_with(key, ".attn.bias") && !nano_shape_.count(key)) continue;  // the causal mask of the non-flash path
    nano[key] = tensor;
  }
  for (const auto& [key, tensor] : nano) {
    const auto shape = nano_shape_.find(key == kNanoHead ? kNanoEmbedding : key);
    if (shape == nano_shape_.end())
      throw import_error("the checkpoint has '" + key + "', which this model_args does not make (a modified model.py?)");
    if (tensor.sizes() != torch::IntArrayRef(shape->second))
      throw import_error("'" + key + "' has shape " + shape_str(tensor.sizes()) + ", model_args implies " +
                         shape_str(shape->second));
    if (!tensor.is_floating_point()) throw import_error("'" + key + "' is not floating point");
  }
  for (const auto& key : nano_)
    if (!nano.count(key)) throw import_error("the checkpoint lacks '" + key + "' (model_args bias is " +
                                             (nano_shape_.count("transformer.ln_f.bias") ? "true" : "false") + ")");
  if (nano.count(kNanoHead) && !torch::equal(nano.at(kNanoHead), nano.at(kNanoEmbedding)))
    throw import_error("lm_head.weight differs from transformer.wte.weight: an untied output head, which nanoGPT's "
                       "model.py and nanogpt-cpp do not have");
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& item : gpt->named_parameters()) {
    const Slot& slot = slots_[i++];
    item.value().copy_(piece(slot, nano.at(slot.nano), order));
  }
}

void NanoLayout::save_weights(model::GPT& gpt, std::vector<std::pair<std::string, torch::Tensor>>& tensors) const {
  std::map<std::string, torch::Tensor> ours;
  for (const auto& item : gpt->named_parameters()) ours[item.key()] = item.value().detach().to(torch::kCPU, torch::kFloat);
  for (const auto& key : nano_)
    tensors.emplace_back("model:" + key, assemble(key, [&](const Slot& slot) { return ours.at(slot.ours); }));
}

bool NanoLayout::load_moments(FlatAdamW& optimizer, const Json& state, const std::map<std::string, torch::Tensor>& tensors,
                              const torch::Tensor& order, std::vector<std::string>& notes) const {
  auto skip = [&](const std::string& why) {
    notes.push_back("AdamW state not carried over (" + why + "): the optimizer starts afresh");
    return false;
  };
  if (!state.is_object()) return skip("the checkpoint has none");
  const Json groups = state.value("param_groups", Json());
  const Json steps = state.value("steps", Json());
  if (!groups.is_array() || groups.size() != 2 || !steps.is_object())
    return skip("expected nanoGPT's two parameter groups (decayed weights, the rest)");
  const std::vector<std::string> names = optimizer_order();
  const size_t decayed = static_cast<size_t>(std::count_if(
      names.begin(), names.end(), [&](const std::string& name) { return nano_shape_.at(name).size() >= 2; }));
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> moments;  // nanoGPT's parameter -> (m, v)
  std::optional<double> step;
  size_t next = 0;
  for (size_t g = 0; g < 2; ++g) {
    const Json params = groups[g].is_object() ? groups[g].value("params", Json()) : Json();
    if (!params.is_array() || params.size() != (g == 0 ? decayed : names.size() - decayed))
      return skip("its parameter groups are not the decayed weights and the rest of this model_args");
    for (const Json& id : params) {
      if (!id.is_number_integer()) return skip("a parameter id is not an integer");
      const std::string& name = names[next++];
      const std::string pid = id.dump();
      const auto m = tensors.find("optimizer:" + pid + ":exp_avg"), v = tensors.find("optimizer:" + pid + ":exp_avg_sq");
      if (m == tensors.end() || v == tensors.end()) return skip("parameter " + pid + " has no exp_avg and exp_avg_sq");
      const torch::IntArrayRef shape(nano_shape_.at(name));
      if (m->second.sizes() != shape || v->second.sizes() != shape || !m->second.is_floating_point() ||
          !v->second.is_floating_point())
        return skip("the moments of parameter " + pid + " have shape " + shape_str(m->second.sizes()) + ", " + name +
                    " has " + shape_str(shape));
      const Json count = steps.value(pid, Json());
      if (!count.is_number() || (step && *step != count.get<double>()))
        return skip("the parameters do not share one step count");
      step = count.get<double>();
      moments[name] = {m->second.to(torch::kFloat), v->second.to(torch::kFloat)};
    }
  }
  if (!step || *step < 0 || *step != std::floor(*step)) return skip("the step count is not a whole number");

  std::map<std::string, const Slot*> slot_of;
  for (const auto& slot : slots_) slot_of[slot.ours] = &slot;
  auto flat = [&](const std::vector<std::string>& ours, bool second) {
    std::vector<torch::Tensor> parts;
    for (const auto& name : ours) {
      const Slot& slot = *slot_of.at(name);
      const auto& [m, v] = moments.at(slot.nano);
      parts.push_back(piece(slot, second ? v : m, order).reshape({-1}));
    }
    return parts.empty() ? torch::zeros({0}) : torch::cat(parts);
  };
  optimizer.load_state({{"step", torch::tensor(static_cast<int64_t>(*step))},
                        {"exp_avg.decay", flat(optimizer.decay_names(), false)},
                        {"exp_avg_sq.decay", flat(optimizer.decay_names(), true)},
                        {"exp_avg.no_decay", flat(optimizer.no_decay_names(), false)},
                        {"exp_avg_sq.no_decay", flat(optimizer.no_decay_names(), true)}});
  return true;
}

Json NanoLayout::save_moments(const FlatAdamW& optimizer, const TrainConfig& config,
                              std::vector<std::pair<std::string, torch::Tensor>>& tensors) const {
  std::map<std::string, torch::Tensor> flat;
  for (const auto& [name, tensor] : optimizer.state()) flat[name] = tensor.to(torch::kCPU, torch::kFloat);
  std::map<std::string, const Slot*> slot_of;
  for (const auto& slot : slots_) slot_of[slot.ours] = &slot;
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> ours;  // our parameter -> (m, v), shaped
  for (const auto& [names, group] : {std::pair{&optimizer.decay_names(), "decay"}, {&optimizer.no_decay_names(), "no_decay"}}) {
    int64_t offset = 0;
    for (const auto& name : *names) {
      const auto& shape = slot_of.at(name)->shape;
      const int64_t n = c10::multiply_integers(shape);
      ours[name] = {flat.at(std::string("exp_avg.") + group).narrow(0, offset, n).view(shape),
                    flat.at(std::string("exp_avg_sq.") + group).narrow(0, offset, n).view(shape)};
      offset += n;
    }
  }
  const std::vector<std::string> names = optimizer_order();
  Json decayed = Json::array(), rest = Json::array(), steps = Json::object();
  for (size_t id = 0; id < names.size(); ++id) {
    const std::string pid = std::to_string(id);
    tensors.emplace_back("optimizer:" + pid + ":exp_avg", assemble(names[id], [&](const Slot& s) { return ours.at(s.ours).first; }));
    tensors.emplace_back("optimizer:" + pid + ":exp_avg_sq", assemble(names[id], [&](const Slot& s) { return ours.at(s.ours).second; }));
    steps[pid] = optimizer.steps();
    (nano_shape_.at(names[id]).size() >= 2 ? decayed : rest).push_back(id);
  }
  auto group = [&](const Json& params, double weight_decay) {
    return Json{{"params", params}, {"lr", config.learning_rate}, {"betas", Json::array({config.beta1, config.beta2})},
                {"eps", FlatAdamW::Options{}.eps}, {"weight_decay", weight_decay}};
  };
  return Json{{"param_groups", Json::array({group(decayed, config.weight_decay), group(rest, 0.0)})}, {"steps", steps}};
}

}  // namespace nanogpt::train
