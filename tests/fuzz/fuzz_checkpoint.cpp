// Fuzz target (c3): checkpoint reading, as `nanogpt sample` (load_model) and a resume
// (read_checkpoint_meta, then load_checkpoint into a model built from the stored config) do it.
//
// Input layout: one selector byte, then
//  - even selector: the raw bytes of a checkpoint file (safetensors, a format-1 zip, or anything);
//  - odd selector: a recipe, read with FuzzedDataProvider, for a well-formed safetensors file
//    whose metadata entries and tensors are each present or missing, of the right or the wrong
//    type, with plausible or arbitrary values (configs, vocabularies, weight shapes and dtypes,
//    optimizer state). Mutating raw bytes exercises the safetensors reader; the recipe reaches
//    the checkpoint's own validation behind it.
// Properties, beyond "no crash, no UB, no runaway allocation": every failure is a one-line
// "[ckpt] ..." (or "[data] ..." for the sampler state) error; a success returns a model whose
// config validates and whose vocabulary matches.
#include <fuzzer/FuzzedDataProvider.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/batch_sampler.h"
#include "data/vocab.h"
#include "model/gpt.h"
#include "tests/fuzz/fuzz_common.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "io/safetensors.h"

using namespace nanogpt;
using nanogpt::fuzz::expect_clear_error;
using nanogpt::fuzz::finding;
using Json = nlohmann::ordered_json;
using Tensors = std::vector<std::pair<std::string, torch::Tensor>>;
using Metadata = std::map<std::string, std::string>;

namespace {

// True about once in n draws. Exhausted input (zeros) reads as false: the usual, valid choice.
bool rare(FuzzedDataProvider& fdp, int n) { return fdp.ConsumeIntegralInRange<int>(0, n - 1) == n - 1; }

// Mostly a value in [lo, hi]; sometimes any int64 (huge, negative, zero).
int64_t pick_int(FuzzedDataProvider& fdp, int64_t lo, int64_t hi) {
  if (rare(fdp, 8)) return fdp.ConsumeIntegral<int64_t>();
  return fdp.ConsumeIntegralInRange<int64_t>(lo, hi);
}

double pick_double(FuzzedDataProvider& fdp, double usual) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 5)) {
    case 4: return fdp.ConsumeFloatingPoint<double>();  // anything, inf and nan included
    case 5: return fdp.ConsumeProbability<double>();
    default: return usual;
  }
}

std::string pick_string(FuzzedDataProvider& fdp, std::initializer_list<const char*> usual) {
  const int i = fdp.ConsumeIntegralInRange<int>(0, static_cast<int>(usual.size()));
  if (i == static_cast<int>(usual.size())) return fdp.ConsumeRandomLengthString(16);
  return usual.begin()[i];
}

// A JSON value for a metadata field: the good one, or (rarely) missing (null: dropped), a value of
// another type, or text that is not JSON.
Json pick_value(FuzzedDataProvider& fdp, const Json& good) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 31)) {
    case 28: return nullptr;
    case 29: return fdp.ConsumeRandomLengthString(8);
    case 30: return fdp.ConsumeIntegral<int64_t>();
    case 31: return fdp.ConsumeFloatingPoint<double>();
    default: return good;
  }
}

// Sets metadata `key` to `good` unless the recipe leaves it out or stores something else.
void put(FuzzedDataProvider& fdp, Metadata& meta, const std::string& key, const std::string& good) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 31)) {
    case 30: return;
    case 31: meta[key] = fdp.ConsumeRandomLengthString(12); return;
    default: meta[key] = good; return;
  }
}

// A tensor like `t`, or (per the recipe) missing, reshaped, of another dtype, or with NaNs.
void put_tensor(FuzzedDataProvider& fdp, Tensors& tensors, const std::string& key, const torch::Tensor& t) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 23)) {
    case 17: return;
    case 18: tensors.emplace_back(key, torch::zeros({fdp.ConsumeIntegralInRange<int64_t>(0, 8), fdp.ConsumeIntegralInRange<int64_t>(0, 3)})); return;
    case 19: tensors.emplace_back(key, t.to(torch::kInt32)); return;
    case 20: tensors.emplace_back(key, t.to(torch::kDouble)); return;
    case 21: tensors.emplace_back(key, t.reshape({-1})); return;
    case 22: tensors.emplace_back(key, torch::full(t.sizes(), std::nan(""), torch::kFloat)); return;
    case 23: tensors.emplace_back(key, t.to(torch::kBool)); return;
    default: tensors.emplace_back(key, t); return;
  }
}

model::ModelConfig pick_model_config(FuzzedDataProvider& fdp, int64_t vocab_size) {
  model::ModelConfig m;
  m.vocab_size = fdp.ConsumeBool() ? vocab_size : pick_int(fdp, 1, 16);
  m.block_size = pick_int(fdp, 1, 16);
  m.n_layer = pick_int(fdp, 1, 2);
  m.n_head = pick_int(fdp, 1, 4);
  m.n_kv_head = pick_int(fdp, 0, 4);
  m.n_embd = static_cast<int64_t>(static_cast<uint64_t>(m.n_head) * static_cast<uint64_t>(pick_int(fdp, 1, 4)));
  if (rare(fdp, 16)) m.n_embd = fdp.ConsumeIntegral<int64_t>();
  m.dropout = pick_double(fdp, 0.0);
  m.bias = fdp.ConsumeBool();
  m.pos_encoding = pick_string(fdp, {"rope", "sinusoidal", "learned"});
  m.rope_base = pick_double(fdp, 10000.0);
  m.norm = pick_string(fdp, {"layernorm", "rmsnorm"});
  m.attention = pick_string(fdp, {"auto", "math", "sdpa"});
  return m;
}

bool small_and_valid(const model::ModelConfig& m) {
  try {
    m.validate();
  } catch (const std::exception&) {
    return false;
  }
  return m.vocab_size <= 4096 && m.block_size <= 64 && m.n_layer <= 4 && m.n_embd <= 64;
}

// `text` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string valid_utf8(const std::string& text) {
  return Json::parse(Json(text).dump(-1, ' ', false, Json::error_handler_t::replace)).get<std::string>();
}

// Builds a checkpoint file (its bytes) from the recipe.
std::string recipe_checkpoint(FuzzedDataProvider& fdp) {
  Metadata meta;
  Tensors tensors;
  put(fdp, meta, "format", rare(fdp, 16) ? "nanogpt-cpp" : train::kCheckpointFormat);
  put(fdp, meta, "format_version",
      std::to_string(rare(fdp, 16) ? fdp.ConsumeIntegral<int64_t>() : train::kCheckpointFormatVersion));
  put(fdp, meta, "iter", std::to_string(pick_int(fdp, 0, 1000)));
  put(fdp, meta, "best_val_loss", Json(pick_double(fdp, 2.5)).dump());
  put(fdp, meta, "config_yaml", fdp.ConsumeRandomLengthString(32));
  put(fdp, meta, "eval_done", fdp.ConsumeBool() ? "true" : "false");
  put(fdp, meta, "loss_scale", Json(pick_double(fdp, 1.0)).dump());
  put(fdp, meta, "loss_scale_growth", std::to_string(pick_int(fdp, 0, 2000)));

  // Vocabulary: from text (valid), or raw bytes after a valid-looking prefix.
  const std::string text = fdp.ConsumeRandomLengthString(48);
  std::string vocab_blob;
  int64_t vocab_size = 1;
  try {
    const auto vocab = data::Vocab::from_text(text.empty() ? "a" : text);
    vocab_blob = vocab.serialize();
    vocab_size = vocab.size();
  } catch (const std::exception&) {
    vocab_blob = "nanogpt-vocab/1 " + text;
  }
  put(fdp, meta, "vocab", vocab_blob);

  const model::ModelConfig m = pick_model_config(fdp, vocab_size);
  Json config = model::to_json(m);
  for (auto& [key, value] : config.items()) value = pick_value(fdp, value);
  for (auto it = config.begin(); it != config.end();) it = it->is_null() ? config.erase(it) : std::next(it);
  put(fdp, meta, "model_config", config.dump(-1, ' ', false, Json::error_handler_t::replace));

  // Sampler and RNG state: the real thing, or damaged.
  std::mt19937_64 rng(fdp.ConsumeIntegral<uint64_t>());
  std::ostringstream sampler;
  sampler << rng;
  std::string sampler_state = sampler.str();
  if (rare(fdp, 4))
    sampler_state = sampler_state.substr(0, fdp.ConsumeIntegralInRange<size_t>(0, sampler_state.size())) +
                    fdp.ConsumeRandomLengthString(8);
  put(fdp, meta, "sampler_state", sampler_state);
  const torch::Tensor rng_state = at::detail::getDefaultCPUGenerator().get_state();
  put_tensor(fdp, tensors, "rng.cpu", rng_state);
  if (rare(fdp, 8)) put_tensor(fdp, tensors, "rng.cuda", rng_state);

  // Weights and optimizer state of a model built from the recipe's config (when it is a small,
  // valid one), each tensor possibly damaged; otherwise a couple of stray tensors.
  if (small_and_valid(m)) {
    torch::manual_seed(0);
    model::GPT gpt(m);
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (auto& item : gpt->named_parameters()) {
      put_tensor(fdp, tensors, "model." + item.key(), item.value().detach());
      params.emplace_back(item.key(), item.value());
    }
    train::FlatAdamW optimizer(params, {});
    for (const auto& [name, tensor] : optimizer.state())
      put_tensor(fdp, tensors, "optimizer." + name,
                 name == "step" && rare(fdp, 8) ? torch::tensor(fdp.ConsumeIntegral<int64_t>()) : tensor);
  } else {
    tensors.emplace_back("model.wte.weight", torch::zeros({2, 2}));
  }
  // Names must be distinct for the writer: a damaged recipe may repeat none, but keep the first.
  Tensors distinct;
  for (auto& [name, tensor] : tensors) {
    bool seen = false;
    for (const auto& d : distinct) seen = seen || d.first == name;
    if (!seen) distinct.emplace_back(name, tensor);
  }
  for (auto& [key, value] : meta) value = valid_utf8(value);  // the writer wants UTF-8 metadata
  const std::string path = fuzz::scratch_dir() + "/recipe.safetensors";
  try {
    io::write_safetensors(path, distinct, meta, "fuzz");
  } catch (const std::runtime_error& e) {
    finding(std::string("the recipe's file could not be written: ") + e.what());
  }
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// What a resume does with a checkpoint: meta, then weights and optimizer into a model built from
// the stored config, then the sampler state.
void resume_from(const std::string& path) {
  train::CheckpointMeta meta;
  try {
    meta = train::read_checkpoint_meta(path);
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[ckpt] '");
    return;
  }
  meta.model_config.validate();  // read_checkpoint_meta promises a valid config
  if (meta.vocab.size() != meta.model_config.vocab_size) finding("vocabulary size differs from the model config");
  auto config = meta.model_config;
  config.dropout = 0.0;
  model::GPT gpt(config);
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& item : gpt->named_parameters()) params.emplace_back(item.key(), item.value());
  train::FlatAdamW optimizer(params, {});
  try {
    train::load_checkpoint(path, &gpt, &optimizer);
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[ckpt] '");
    return;
  }
  // The trainer restores the generator from it: read_checkpoint_meta must have checked it.
  at::make_generator<at::CPUGeneratorImpl>().set_state(meta.torch_rng_state);
  data::BatchSampler sampler(torch::zeros({config.block_size + 1}, torch::kInt32), 1, config.block_size, 0);
  try {
    sampler.restore_state(meta.sampler_state);
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[data] ");
  }
}

void sample_from(const std::string& path) {
  try {
    auto loaded = train::load_model(path);
    if (loaded.vocab.size() != loaded.model->config().vocab_size) finding("load_model: vocabulary size mismatch");
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[ckpt] '");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::init_torch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string file;
  if (data[0] % 2 == 0) {
    file.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  } else {
    FuzzedDataProvider fdp(data + 1, size - 1);
    file = recipe_checkpoint(fdp);
  }
  const std::string path = fuzz::write_scratch("ckpt.safetensors", file);
  sample_from(path);
  resume_from(path);
  return 0;
}
