// The nanoGPT bridge (see nanogpt_bridge.h). The neutral file scripts/nanogpt_bridge.py reads and
// writes: tensors "model:<nanoGPT state_dict key>" and "optimizer:<param id>:exp_avg|exp_avg_sq";
// metadata "checkpoint" (model_args, model_keys, iter_num, best_val_loss, config, optimizer, tied)
// and "meta" (itos and stoi as [id, [code points]] pairs), both JSON.
#include "interop/nanogpt_bridge.h"

#include <fmt/format.h>

#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "data/vocab.h"
#include "interop/imported_run.h"
#include "interop/nanogpt_config.h"
#include "interop/nanogpt_layout.h"
#include "io/atomic_dir.h"
#include "io/safetensors.h"
#include "io/text.h"
#include "model/gpt.h"
#include "runtime/subprocess.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace nanogpt::interop {
namespace {

using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

constexpr const char* kNeutralFile = "nanogpt-bridge.safetensors";
constexpr const char* kNeutralFormat = "nanogpt-bridge";  // the "format" metadata both sides check

std::runtime_error export_error(const std::string& what) { return std::runtime_error(io::printable("[export] " + what)); }

// Runs scripts/nanogpt_bridge.py; its failure line ("[import] ...") becomes the error.
void run_bridge(const PythonBridge& bridge, const std::vector<std::string>& args, const std::string& tag) {
  const std::string hint = "a Python with torch reads and writes nanoGPT's pickles: run scripts/setup.sh, or set "
                           "NANOGPT_PYTHON=/path/to/python";
  if (!fs::is_regular_file(bridge.script))
    throw std::runtime_error("[" + tag + "] the bridge script '" + bridge.script + "' is missing (a moved source tree?)");
  std::vector<std::string> argv = {bridge.python, bridge.script};
  argv.insert(argv.end(), args.begin(), args.end());
  runtime::ProcessResult result;
  try {
    result = runtime::run_process(argv);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(io::printable("[" + tag + "] " + e.what() + " (" + hint + ")"));
  }
  if (result.exit_code == 0) return;
  std::string last, own;  // the last line, and the last line the script wrote under our tag
  size_t begin = 0;
  while (begin < result.output.size()) {
    size_t end = result.output.find('\n', begin);
    if (end == std::string::npos) end = result.output.size();
    const std::string line = result.output.substr(begin, end - begin);
    if (!line.empty()) last = line;
    if (line.rfind("[" + tag + "] ", 0) == 0) own = line;
    begin = end + 1;
  }
  if (!own.empty()) throw std::runtime_error(io::printable(own));
  throw std::runtime_error(io::printable(fmt::format("[{}] {} failed (exit {}): {} ({})", tag, bridge.script,
                                                     result.exit_code, last.empty() ? "no output" : last, hint)));
}

std::map<std::string, torch::Tensor> by_name(io::SafeTensors& file) {
  std::map<std::string, torch::Tensor> tensors;
  for (auto& [name, tensor] : file.tensors) tensors.emplace(name, std::move(tensor));
  return tensors;
}

Json metadata_json(const io::SafeTensors& file, const std::string& key) {
  const auto format = file.metadata.find("format");
  if (format == file.metadata.end() || format->second != kNeutralFormat)
    throw import_error("the bridge script's output is not format '" + std::string(kNeutralFormat) + "' (a different script version?)");
  const auto it = file.metadata.find(key);
  Json value = it == file.metadata.end() ? Json() : Json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) throw import_error("the bridge script's output lacks '" + key + "' (a different script version?)");
  return value;
}

std::vector<std::pair<std::string, torch::Tensor>> parameters_of(model::GPT& gpt) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& item : gpt->named_parameters()) params.emplace_back(item.key(), item.value());
  return params;
}

train::FlatAdamW::Options adamw_options(const train::TrainConfig& config) {
  train::FlatAdamW::Options options;
  options.weight_decay = config.weight_decay;
  options.beta1 = config.beta1;
  options.beta2 = config.beta2;
  return options;
}

// A fresh start for what nanoGPT does not save: the batch sampler's and dropout's generators,
// seeded as a new run with `seed` would seed them.
}  // namespace

PythonBridge PythonBridge::find(const std::string& built_python, const std::string& source_dir) {
  PythonBridge bridge;
  const char* env = std::getenv("NANOGPT_PYTHON");
  bridge.python = env && *env ? env : !built_python.empty() ? built_python : "python3";
  bridge.script = source_dir + "/scripts/nanogpt_bridge.py";
  return bridge;
}

ImportReport import_nanogpt(const std::string& ckpt_pt, const std::string& meta_pkl, const std::string& out_dir,
                            const PythonBridge& bridge) {
  if (meta_pkl.empty())
    throw import_error("no meta.pkl given: without one nanoGPT uses the GPT-2 BPE tokenizer, and nanogpt-cpp is "
                       "character-level (for a character model give --meta=<nanoGPT>/data/<dataset>/meta.pkl)");
  for (const auto& [path, what] : {std::pair{ckpt_pt, "checkpoint"}, std::pair{meta_pkl, "meta.pkl"}})
    if (!fs::is_regular_file(path))
      throw import_error("the " + std::string(what) + " '" + path + "' is not a file (nanoGPT writes out_dir/ckpt.pt and "
                         "data/<dataset>/meta.pkl)");
  io::StagedDir staged(out_dir, "import");
  run_bridge(bridge, {"read", ckpt_pt, meta_pkl, staged / kNeutralFile}, "import");
  io::SafeTensors file = io::read_safetensors(staged / kNeutralFile, "import");
  fs::remove(staged / kNeutralFile);
  const Json checkpoint = metadata_json(file, "checkpoint");
  const Json meta = metadata_json(file, "meta");
  auto tensors = by_name(file);

  ImportReport report;
  const model::ModelConfig model_config = config_from_model_args(checkpoint.value("model_args", Json()));
  const NanoVocab vocab = vocab_from_meta(meta, model_config.vocab_size, meta_pkl);
  const train::TrainConfig config =
      train_config_from_nanogpt(checkpoint.value("config", Json()), model_config, out_dir, report.notes);

  model::GPT gpt(model_config);
  train::FlatAdamW optimizer(parameters_of(gpt), adamw_options(config));
  const NanoLayout layout(gpt);
  layout.load_weights(gpt, tensors, vocab.order);
  report.optimizer = layout.load_moments(optimizer, checkpoint.value("optimizer", Json()), tensors, vocab.order, report.notes);

  train::CheckpointMeta state;
  const Json iter = checkpoint.value("iter_num", Json());
  if (!iter.is_null() && !(iter.is_number_integer() && iter.get<int64_t>() >= 0))
    throw import_error("iter_num (" + iter.dump() + ") is not a non-negative integer");
  state.iter = iter.is_null() ? 0 : iter.get<int64_t>();
  const Json best = checkpoint.value("best_val_loss", Json());
  state.best_val_loss = best.is_number() ? best.get<double>() : 1e9;
  state.config_yaml = train::to_yaml(config);
  state.model_config = model_config;
  state.vocab = vocab.vocab;
  fresh_generators(state, static_cast<uint64_t>(config.seed));
  state.eval_done = true;  // nanoGPT saves right after evaluating at iter_num: resume goes on with its step
  write_checkpoint_folder(staged, gpt, report.optimizer ? &optimizer : nullptr, state, "import");
  staged.commit();

  report.checkpoint = out_dir + "/" + train::kLastCheckpoint;
  report.config = out_dir + "/config.yaml";
  report.model_config = model_config;
  report.iter = state.iter;
  return report;
}

std::string nanogpt_lacks(const model::ModelConfig& config) {
  if (config.pos_encoding != "learned")
    return (config.pos_encoding == "rope" ? "RoPE" : "sinusoidal positions") + (" (pos_encoding " + config.pos_encoding + ")");
  if (config.norm != "layernorm") return "RMSNorm (norm " + config.norm + ")";
  if (config.kv_heads() != config.n_head)
    return fmt::format("grouped-query attention (n_kv_head {} < n_head {})", config.kv_heads(), config.n_head);
  if (config.qk_norm) return "QK-norm (qk_norm true)";
  if (config.mlp != "gelu") return config.mlp + " MLP (mlp " + config.mlp + ")";
  if (!config.tie_embeddings) return "untied head (tie_embeddings false)";
  if (config.logit_softcap > 0) return "logit soft-capping (logit_softcap " + fmt::format("{}", config.logit_softcap) + ")";
  return "";
}

std::string export_nanogpt(const std::string& checkpoint, const std::string& out_dir, const PythonBridge& bridge) {
  const train::CheckpointMeta meta = train::read_checkpoint_meta(checkpoint);
  meta.vocab.require_char("export", "--format=nanogpt (meta.pkl holds characters)",
                          "--format=safetensors keeps the bpe tokenizer");
  const std::string lacks = nanogpt_lacks(meta.model_config);
  if (!lacks.empty())
    throw export_error("nanoGPT's model.py has no " + lacks + ", so it cannot load this model (learned positions, "
                       "LayerNorm, GELU, a tied head and n_kv_head = n_head only); --format=safetensors exports any model");
  train::TrainConfig config;
  try {
    config = train::parse_config(meta.config_yaml, checkpoint);
  } catch (const std::exception&) {  // from another version: the defaults' optimizer settings will do
  }
  io::StagedDir staged(out_dir, "export");
  model::GPT gpt(meta.model_config);
  train::FlatAdamW optimizer(parameters_of(gpt), adamw_options(config));
  train::load_checkpoint(checkpoint, &gpt, &optimizer);
  const NanoLayout layout(gpt);

  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  const Json nano_config = nanogpt_config_of(config, meta.model_config, out_dir);
  Json neutral = {{"model_args", model_args_of(meta.model_config)},
                  {"model_keys", layout.state_dict_keys()},
                  {"iter_num", meta.iter},
                  {"best_val_loss", std::isfinite(meta.best_val_loss) ? Json(meta.best_val_loss) : Json()},
                  {"config", nano_config},
                  {"optimizer", layout.save_moments(optimizer, config, tensors)},
                  {"tied", {{kNanoHead, kNanoEmbedding}}}};
  layout.save_weights(gpt, tensors);
  Json itos = Json::array();
  for (int64_t id = 0; id < meta.vocab.size(); ++id) itos.push_back({id, {static_cast<uint32_t>(meta.vocab.char_at(id))}});
  const Json vocab = {{"vocab_size", meta.vocab.size()}, {"itos", itos}};
  io::write_safetensors(staged / kNeutralFile, tensors,
                        {{"format", kNeutralFormat}, {"checkpoint", neutral.dump()}, {"meta", vocab.dump()}}, "export");
  run_bridge(bridge, {"write", staged / kNeutralFile, staged.staging()}, "export");
  fs::remove(staged / kNeutralFile);
  staged.commit();
  return nano_config.at("dataset").get<std::string>();
}

}  // namespace nanogpt::interop
