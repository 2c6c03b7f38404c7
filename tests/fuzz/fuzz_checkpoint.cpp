// Fuzz target (c3): checkpoint reading, as `nanogpt sample` (load_model) and a resume
// (read_checkpoint_meta, then load_checkpoint into a model built from the stored config) do it.
//
// Input layout: one selector byte, then
//  - even selector: the raw bytes of a checkpoint file (LibTorch zip archive, or anything else);
//  - odd selector: a recipe, read with FuzzedDataProvider, for a well-formed LibTorch archive whose
//    entries are each present or missing, of the right or the wrong type, with plausible or
//    arbitrary values (configs, vocabularies, weight shapes and dtypes, optimizer state). Mutating
//    the zip bytes rarely gets past LibTorch's parser; the recipe reaches our own validation.
// Properties, beyond "no crash, no UB, no runaway allocation": every failure is a one-line
// "[ckpt] ..." (or "[data] ..." for the sampler state) error; a success returns a model whose
// config validates and whose vocabulary matches.
#include <fuzzer/FuzzedDataProvider.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "data/batch_sampler.h"
#include "data/vocab.h"
#include "model/gpt.h"
#include "tests/fuzz/fuzz_common.h"
#include "train/adamw.h"
#include "train/checkpoint.h"

using namespace nanogpt;
using nanogpt::fuzz::expect_clear_error;
using nanogpt::fuzz::finding;
using torch::serialize::OutputArchive;

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

enum class Entry { Missing, WrongType, Good };

Entry pick_entry(FuzzedDataProvider& fdp) {
  const int r = fdp.ConsumeIntegralInRange<int>(0, 31);
  return r == 30 ? Entry::Missing : r == 31 ? Entry::WrongType : Entry::Good;
}

// Writes `good` unless the recipe says to leave the key out or store a value of another type.
template <typename T>
void write_entry(FuzzedDataProvider& fdp, OutputArchive& a, const std::string& key, const T& good) {
  switch (pick_entry(fdp)) {
    case Entry::Missing: return;
    case Entry::WrongType:
      switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
        case 0: a.write(key, c10::IValue(fdp.ConsumeRandomLengthString(8))); return;
        case 1: a.write(key, c10::IValue(fdp.ConsumeIntegral<int64_t>())); return;
        case 2: a.write(key, c10::IValue(fdp.ConsumeFloatingPoint<double>())); return;
        default: a.write(key, torch::zeros({fdp.ConsumeIntegralInRange<int64_t>(0, 4)})); return;
      }
    case Entry::Good: a.write(key, c10::IValue(good)); return;
  }
}

// A tensor like `t`, or (per the recipe) missing, reshaped, of another dtype, or with NaNs.
void write_tensor(FuzzedDataProvider& fdp, OutputArchive& a, const std::string& key, const torch::Tensor& t) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 23)) {
    case 17: return;
    case 18: a.write(key, torch::zeros({fdp.ConsumeIntegralInRange<int64_t>(0, 8), fdp.ConsumeIntegralInRange<int64_t>(0, 3)})); return;
    case 19: a.write(key, t.to(torch::kInt32)); return;
    case 20: a.write(key, t.to(torch::kDouble)); return;
    case 21: a.write(key, t.reshape({-1})); return;
    case 22: a.write(key, torch::full(t.sizes(), std::nan(""), torch::kFloat)); return;
    case 23: a.write(key, c10::IValue(fdp.ConsumeRandomLengthString(4))); return;
    default: a.write(key, t); return;
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

// Builds a checkpoint file from the recipe.
std::string recipe_checkpoint(FuzzedDataProvider& fdp) {
  OutputArchive a;
  write_entry(fdp, a, "format_version", rare(fdp, 16) ? fdp.ConsumeIntegral<int64_t>()
                                                                                       : train::kCheckpointFormatVersion);
  write_entry(fdp, a, "iter", pick_int(fdp, 0, 1000));
  write_entry(fdp, a, "best_val_loss", pick_double(fdp, 2.5));
  write_entry(fdp, a, "config_yaml", fdp.ConsumeRandomLengthString(32));
  write_entry(fdp, a, "eval_done", fdp.ConsumeBool());

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
  write_entry(fdp, a, "vocab", vocab_blob);

  const model::ModelConfig m = pick_model_config(fdp, vocab_size);
  write_entry(fdp, a, "model_config.vocab_size", m.vocab_size);
  write_entry(fdp, a, "model_config.block_size", m.block_size);
  write_entry(fdp, a, "model_config.n_layer", m.n_layer);
  write_entry(fdp, a, "model_config.n_head", m.n_head);
  write_entry(fdp, a, "model_config.n_kv_head", m.n_kv_head);
  write_entry(fdp, a, "model_config.n_embd", m.n_embd);
  write_entry(fdp, a, "model_config.dropout", m.dropout);
  write_entry(fdp, a, "model_config.bias", m.bias);
  write_entry(fdp, a, "model_config.pos_encoding", m.pos_encoding);
  write_entry(fdp, a, "model_config.rope_base", m.rope_base);
  write_entry(fdp, a, "model_config.norm", m.norm);
  write_entry(fdp, a, "model_config.attention", m.attention);

  // Sampler and RNG state: the real thing, or damaged.
  std::mt19937_64 rng(fdp.ConsumeIntegral<uint64_t>());
  std::ostringstream sampler;
  sampler << rng;
  std::string sampler_state = sampler.str();
  if (rare(fdp, 4))
    sampler_state = sampler_state.substr(0, fdp.ConsumeIntegralInRange<size_t>(0, sampler_state.size())) +
                    fdp.ConsumeRandomLengthString(8);
  write_entry(fdp, a, "sampler_state", sampler_state);
  const torch::Tensor rng_state = at::detail::getDefaultCPUGenerator().get_state();
  write_tensor(fdp, a, "rng.cpu", rng_state);
  if (rare(fdp, 8)) write_tensor(fdp, a, "rng.cuda", rng_state);

  // Weights and optimizer state of a model built from the recipe's config (when it is a small,
  // valid one), each tensor possibly damaged; otherwise a couple of stray tensors.
  if (!rare(fdp, 16)) {
    OutputArchive weights, opt;
    if (small_and_valid(m)) {
      torch::manual_seed(0);
      model::GPT gpt(m);
      std::vector<std::pair<std::string, torch::Tensor>> params;
      for (auto& item : gpt->named_parameters()) {
        write_tensor(fdp, weights, item.key(), item.value().detach());
        params.emplace_back(item.key(), item.value());
      }
      train::FlatAdamW optimizer(params, {});
      if (!rare(fdp, 8)) {
        optimizer.save(opt);
      } else {
        write_tensor(fdp, opt, "step", torch::zeros({fdp.ConsumeIntegralInRange<int64_t>(0, 2)}));
        for (const char* name : {"exp_avg.decay", "exp_avg_sq.decay", "exp_avg.no_decay", "exp_avg_sq.no_decay"})
          write_tensor(fdp, opt, name, torch::zeros({fdp.ConsumeIntegralInRange<int64_t>(0, 64)}));
      }
    } else {
      weights.write("wte.weight", torch::zeros({2, 2}));
    }
    if (!rare(fdp, 16)) a.write("model", weights);
    if (!rare(fdp, 16)) a.write("optimizer", opt);
  }
  std::ostringstream out;
  a.save_to(out);
  return out.str();
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
  const std::string path = fuzz::write_scratch("ckpt.pt", file);
  sample_from(path);
  resume_from(path);
  return 0;
}
