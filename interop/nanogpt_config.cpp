// nanoGPT's dicts against ours (see nanogpt_config.h).
#include "interop/nanogpt_config.h"
#include "interop/imported_run.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <stdexcept>
#include <type_traits>

#include "data/utf8.h"
#include "io/text.h"

namespace nanogpt::interop {
namespace {

using Json = nlohmann::ordered_json;
using train::TrainConfig;

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
      throw import_error(fmt::format(
          "{}: token {} is '{}', {} characters: a subword (BPE) vocabulary, and nanogpt-cpp is character-level", where,
          id, text, cps.size()));
    }
    const uint32_t cp = cps[0].get<uint32_t>();
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      throw import_error(fmt::format("{}: token {} is not a Unicode character", where, id));
    if (id < 0 || id >= n || seen[static_cast<size_t>(id)])
      throw import_error(fmt::format("{}: itos ids are not 0..{}, each once (id {})", where, n - 1, id));
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
    throw import_error(fmt::format(
        "{} has {} characters but the model's vocab_size is {} (the meta.pkl of another dataset, or a BPE model?)",
        where, n, vocab_size));
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

}  // namespace nanogpt::interop
