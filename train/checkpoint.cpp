// Checkpoint files (see checkpoint.h): one safetensors file (io/safetensors.h).
//   tensors   model.<parameter name>         fp32, nanoGPT-like names (model.h.0.attn.q_proj.weight)
//             optimizer.step                  0-d int64
//             optimizer.{exp_avg,exp_avg_sq}.{decay,no_decay}   FlatAdamW's flat moments
//                                             (no optimizer.* at all: weights only, an imported model;
//                                             a resume starts the optimizer afresh)
//             rng.cpu, rng.cuda (when trained on CUDA)          generator states, uint8
//   metadata  format ("nanogpt-cpp checkpoint"), format_version, iter, best_val_loss, eval_done,
//             config_yaml, model_config (JSON object), vocab (data::Vocab::serialize),
//             sampler_state, loss_scale, loss_scale_growth, world_size, run_id (all strings, as safetensors
//             wants; world_size may be absent: 1; run_id may be absent: "")
// Numbers are written so that they read back bit for bit (JSON's shortest round-trip form).
#include "train/checkpoint.h"

#include <fmt/format.h>

#include <ATen/CPUGeneratorImpl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "train/adamw.h"
#include "io/safetensors.h"
#include "io/text.h"

namespace nanogpt::train {
namespace {

using Json = nlohmann::ordered_json;
constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimizerPrefix = "optimizer.";

std::runtime_error ckpt_error(const std::string& path, const std::string& what) {
  return std::runtime_error(io::printable("[ckpt] '" + path + "': " + what));  // one line, even for hostile bytes
}

// Checks what a path holds before the safetensors reader sees it, to say what it is when it is not
// ours: missing, a folder, empty, a format-1 checkpoint (LibTorch's zip archive) or foreign bytes.
void check_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw ckpt_error(path, "no such file (train first, or check --out_dir)");
  if (S_ISDIR(st.st_mode)) throw ckpt_error(path, "is a directory, expected a checkpoint file");
  if (st.st_size == 0) throw ckpt_error(path, "file is empty (an interrupted copy?)");
  std::ifstream in(path, std::ios::binary);
  char start[9] = {};
  in.read(start, sizeof start);
  const auto got = in.gcount();
  if (got >= 4 && start[0] == 'P' && start[1] == 'K' && start[2] == 3 && start[3] == 4)
    throw ckpt_error(path, "a LibTorch archive checkpoint from an older nanogpt-cpp (format 1), which this version "
                           "cannot read (retrain, or sample with the older build)");
  if (got == 9 && start[8] != '{')
    throw ckpt_error(path, "not a nanogpt-cpp checkpoint (neither a safetensors file nor a LibTorch archive)");
}

// The metadata of an open checkpoint, read with one clear error per missing or malformed entry.
class Metadata {
 public:
  Metadata(const io::SafeTensorsReader& reader, const std::string& path) : meta_(reader.metadata()), path_(path) {}

  const std::string& text(const std::string& key) const {
    const auto it = meta_.find(key);
    if (it == meta_.end()) throw ckpt_error(path_, "metadata '" + key + "' is missing (not a nanogpt-cpp checkpoint?)");
    return it->second;
  }
  bool has(const std::string& key) const { return meta_.count(key) != 0; }
  Json json(const std::string& key) const {
    Json value = Json::parse(text(key), nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded())
      throw ckpt_error(path_, "metadata '" + key + "' is not valid JSON ('" + text(key).substr(0, 40) + "')");
    return value;
  }
  int64_t integer(const std::string& key) const {
    const Json value = Json::parse(text(key), nullptr, false);
    if (!value.is_number_integer() || (value.is_number_unsigned() && value.get<uint64_t>() > INT64_MAX))
      throw ckpt_error(path_, "metadata '" + key + "' is not an integer ('" + text(key).substr(0, 40) + "')");
    return value.get<int64_t>();
  }
  double number(const std::string& key) const {
    const std::string& t = text(key);
    if (t == "nan") return std::nan("");
    if (t == "inf" || t == "-inf") return t[0] == '-' ? -HUGE_VAL : HUGE_VAL;
    const Json value = Json::parse(t, nullptr, false);
    if (!value.is_number()) throw ckpt_error(path_, "metadata '" + key + "' is not a number ('" + t.substr(0, 40) + "')");
    return value.get<double>();
  }
  bool boolean(const std::string& key) const {
    const Json value = Json::parse(text(key), nullptr, false);
    if (!value.is_boolean()) throw ckpt_error(path_, "metadata '" + key + "' is not true or false");
    return value.get<bool>();
  }

 private:
  const std::map<std::string, std::string>& meta_;
  const std::string& path_;
};

// JSON has no NaN or infinity: those are written as the words strtod and Python's float() read.
std::string number_text(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return Json(x).dump();  // shortest text that reads back to the same double
}

// A lower bound on the bytes of float32 weights a config needs: the token embedding, learned
// positions, and per layer the attention's q/out projections (C x C each) and the MLP (2 x 4C x C).
double min_weight_bytes(const model::ModelConfig& m) {
  const double C = static_cast<double>(m.n_embd);
  double params = static_cast<double>(m.vocab_size) * C + static_cast<double>(m.n_layer) * 10.0 * C * C;
  if (m.pos_encoding == "learned") params += static_cast<double>(m.block_size) * C;
  return 4.0 * params;
}

// `file_size` bounds the model: a damaged size field must fail here, not make the model constructor
// allocate (and fill) gigabytes or terabytes.
model::ModelConfig read_model_config(const Metadata& meta, const std::string& path, uint64_t file_size) {
  model::ModelConfig m;
  try {
    m = model::model_config_from_json(meta.json("model_config"));
    m.validate();
  } catch (const std::invalid_argument& e) {  // "[model] ...": under this file's tag instead
    const std::string what = e.what();
    throw ckpt_error(path, "stored model config is invalid: " + what.substr(what.find("] ") + 2));
  }
  // block_size: attention builds a (block_size, block_size) mask, so 2^18 (64 GiB of it) is above
  // anything that was ever trained; the position tables grow with it even without weights.
  if (m.vocab_size > (int64_t{1} << 21) || m.n_layer > 4096 || m.n_embd > (int64_t{1} << 16) ||
      m.block_size > (int64_t{1} << 18))
    throw ckpt_error(path, "stored model config is implausibly large (damaged file?)");
  const double needed = min_weight_bytes(m);
  if (needed > static_cast<double>(file_size))
    throw ckpt_error(path, fmt::format("stored model config (vocab_size {}, n_layer {}, n_embd {}) needs at least {} "
                                       "bytes of weights, but the file has {} (damaged file?)",
                                       m.vocab_size, m.n_layer, m.n_embd, static_cast<uint64_t>(needed), file_size));
  return m;
}

torch::Tensor read_tensor(io::SafeTensorsReader& reader, const std::string& path, const std::string& name, bool required) {
  const io::TensorInfo* info = reader.find(name);
  if (!info) {
    if (required) throw ckpt_error(path, "tensor '" + name + "' is missing");
    return {};
  }
  return reader.read(*info);
}

CheckpointMeta read_meta(io::SafeTensorsReader& reader, const std::string& path) {
  const Metadata stored(reader, path);
  if (!stored.has("format") || stored.text("format") != kCheckpointFormat)
    throw ckpt_error(path, stored.has("format") && stored.text("format") == "nanogpt-cpp"
                               ? "an exported model (nanogpt export), not a training checkpoint (give the checkpoint it was exported from)"
                               : "not a nanogpt-cpp checkpoint (a safetensors file without format '" +
                                     std::string(kCheckpointFormat) + "')");
  CheckpointMeta meta;
  meta.format_version = stored.integer("format_version");
  if (meta.format_version != kCheckpointFormatVersion)
    throw ckpt_error(path, fmt::format("checkpoint format version {}, this build reads version {} (use the nanogpt "
                                       "that wrote it)",
                                       meta.format_version, kCheckpointFormatVersion));
  meta.iter = stored.integer("iter");
  if (meta.iter < 0) throw ckpt_error(path, "negative iteration count");
  meta.best_val_loss = stored.number("best_val_loss");
  meta.config_yaml = stored.text("config_yaml");
  meta.sampler_state = stored.text("sampler_state");
  meta.eval_done = stored.boolean("eval_done");
  meta.loss_scale = stored.number("loss_scale");
  meta.loss_scale_growth = stored.integer("loss_scale_growth");
  meta.world_size = stored.has("world_size") ? stored.integer("world_size") : 1;
  if (meta.world_size < 1) throw ckpt_error(path, "world_size below 1");
  meta.run_id = stored.has("run_id") ? stored.text("run_id") : "";
  meta.model_config = read_model_config(stored, path, reader.file_size());
  try {
    meta.vocab = data::Vocab::deserialize(stored.text("vocab"));
  } catch (const std::runtime_error& e) {
    throw ckpt_error(path, e.what());
  }
  if (meta.vocab.size() != meta.model_config.vocab_size)
    throw ckpt_error(path, fmt::format("vocabulary has {} characters but the model expects {}", meta.vocab.size(),
                                       meta.model_config.vocab_size));
  meta.torch_rng_state = read_tensor(reader, path, "rng.cpu", true);
  // Resume hands it to the CPU generator, whose own size check throws LibTorch's multi-line error.
  const int64_t rng_bytes = at::make_generator<at::CPUGeneratorImpl>().get_state().numel();
  if (meta.torch_rng_state.scalar_type() != torch::kByte || meta.torch_rng_state.dim() != 1 ||
      meta.torch_rng_state.numel() != rng_bytes)
    throw ckpt_error(path, fmt::format("tensor 'rng.cpu' is not a CPU generator state ({} bytes of U8)", rng_bytes));
  meta.optimizer_state = std::any_of(reader.tensors().begin(), reader.tensors().end(), [](const io::TensorInfo& t) {
    return t.name.rfind(kOptimizerPrefix, 0) == 0;
  });
  meta.cuda_rng_state = read_tensor(reader, path, "rng.cuda", false);
  if (meta.cuda_rng_state.defined() && (meta.cuda_rng_state.scalar_type() != torch::kByte || meta.cuda_rng_state.dim() != 1))
    throw ckpt_error(path, "tensor 'rng.cuda' is not a generator state (1-D U8)");
  return meta;
}

std::string shape_str(torch::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// Sets every parameter of `model` from the checkpoint. Every tensor is checked before the first
// one is read: a bad header leaves the model as it was. `fresh`: a model made only to be loaded,
// which nobody sees if this throws; its parameters are read straight into their memory. Otherwise
// every tensor is read first and copied after (a file that fails half-way leaves the model whole).
void load_weights(io::SafeTensorsReader& reader, const std::string& path, model::GPT& model, bool fresh = false) {
  std::vector<std::pair<const io::TensorInfo*, torch::Tensor>> checked;  // (in the file, parameter)
  for (auto& item : model->named_parameters()) {
    const std::string name = kModelPrefix + item.key();
    const io::TensorInfo* info = reader.find(name);
    if (!info) throw ckpt_error(path, "tensor '" + name + "' is missing");
    if (torch::IntArrayRef(info->shape) != item.value().sizes())
      throw ckpt_error(path, "tensor '" + name + "' has shape " + shape_str(info->shape) + ", the config expects " +
                                 shape_str(item.value().sizes()));
    if (!c10::isFloatingType(info->dtype)) throw ckpt_error(path, "tensor '" + name + "' is not floating point");
    checked.emplace_back(info, item.value());
  }
  torch::NoGradGuard no_grad;
  if (fresh) {
    for (auto& [info, param] : checked) reader.read_into(*info, param);
    return;
  }
  std::vector<torch::Tensor> stored;
  for (auto& [info, param] : checked) stored.push_back(reader.read(*info));
  for (size_t i = 0; i < checked.size(); ++i) checked[i].second.copy_(stored[i]);
}

void load_optimizer(io::SafeTensorsReader& reader, const std::string& path, FlatAdamW& optimizer) {
  const std::string prefix = kOptimizerPrefix;
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& info : reader.tensors())
    if (info.name.rfind(prefix, 0) == 0) state.emplace_back(info.name.substr(prefix.size()), reader.read(info));
  if (state.empty()) return;  // weights only: the optimizer stays as it was built (CheckpointMeta::optimizer_state)
  try {
    optimizer.load_state(state);
  } catch (const std::runtime_error& e) {  // "[ckpt] optimizer state ...": add the path
    const std::string what = e.what();
    throw ckpt_error(path, what.rfind("[ckpt] ", 0) == 0 ? what.substr(7) : what);
  }
}

// The checkpoint with the optimizer's state, or weights only when `optimizer` is null.
CheckpointContent content_of(model::GPT& model, const FlatAdamW* optimizer, const CheckpointMeta& meta) {
  CheckpointContent content;
  auto& tensors = content.tensors;
  for (const auto& item : model->named_parameters())
    tensors.emplace_back(kModelPrefix + item.key(), item.value().detach().to(torch::kFloat));
  if (optimizer)
    for (const auto& [name, tensor] : optimizer->state()) tensors.emplace_back(kOptimizerPrefix + name, tensor);
  tensors.emplace_back("rng.cpu", meta.torch_rng_state);
  if (meta.cuda_rng_state.defined()) tensors.emplace_back("rng.cuda", meta.cuda_rng_state);
  content.metadata = {
      {"format", kCheckpointFormat},
      {"format_version", std::to_string(kCheckpointFormatVersion)},
      {"iter", std::to_string(meta.iter)},
      {"best_val_loss", number_text(meta.best_val_loss)},
      {"eval_done", meta.eval_done ? "true" : "false"},
      {"config_yaml", meta.config_yaml},
      {"model_config", model::to_json(meta.model_config).dump(-1, ' ', false, Json::error_handler_t::replace)},
      {"vocab", meta.vocab.serialize()},
      {"sampler_state", meta.sampler_state},
      {"loss_scale", number_text(meta.loss_scale)},
      {"loss_scale_growth", std::to_string(meta.loss_scale_growth)},
      {"world_size", std::to_string(meta.world_size)},
      {"run_id", meta.run_id},
  };
  return content;
}

}  // namespace

CheckpointContent checkpoint_content(model::GPT& model, const FlatAdamW& optimizer, const CheckpointMeta& meta) {
  return content_of(model, &optimizer, meta);
}

CheckpointContent checkpoint_content(model::GPT& model, const CheckpointMeta& meta) {
  return content_of(model, nullptr, meta);
}

void write_checkpoint(const std::string& path, const CheckpointContent& content,
                      const std::function<void(size_t)>& after_tensor) {
  io::write_safetensors(path, content.tensors, content.metadata, "ckpt", after_tensor);
}

void save_checkpoint(const std::string& path, model::GPT& model, const FlatAdamW& optimizer, const CheckpointMeta& meta) {
  write_checkpoint(path, checkpoint_content(model, optimizer, meta));
}

void save_checkpoint(const std::string& path, model::GPT& model, const CheckpointMeta& meta) {
  write_checkpoint(path, checkpoint_content(model, meta));
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  check_file(path);
  io::SafeTensorsReader reader(path, "ckpt");
  return read_meta(reader, path);
}

CheckpointMeta load_checkpoint(const std::string& path, model::GPT* model, FlatAdamW* optimizer) {
  check_file(path);
  io::SafeTensorsReader reader(path, "ckpt");
  auto meta = read_meta(reader, path);
  if (model) load_weights(reader, path, *model);
  if (optimizer) load_optimizer(reader, path, *optimizer);
  return meta;
}

std::string resolve_checkpoint(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("[ckpt] '" + path + "' does not exist (give an out_dir or a checkpoint file)");
  if (!S_ISDIR(st.st_mode)) return path;
  for (const char* name : {kBestCheckpoint, kLastCheckpoint}) {
    const std::string candidate = path + "/" + name;
    if (::stat(candidate.c_str(), &st) == 0) return candidate;
  }
  throw std::runtime_error("[ckpt] no checkpoint in '" + path + "' (expected " + kBestCheckpoint + " or " +
                           kLastCheckpoint + "; train first: nanogpt train CONFIG)");
}

LoadedModel load_model(const std::string& path, torch::Device device) {
  check_file(path);
  io::SafeTensorsReader reader(path, "ckpt");
  LoadedModel loaded;
  loaded.path = path;
  loaded.meta = read_meta(reader, path);
  loaded.vocab = loaded.meta.vocab;
  auto config = loaded.meta.model_config;
  config.dropout = 0.0;  // inference
  loaded.model = model::GPT(config, /*initialise=*/false);  // load_weights sets every parameter
  load_weights(reader, path, loaded.model, /*fresh=*/true);
  loaded.model->to(device);
  loaded.model->eval();
  return loaded;
}

}  // namespace nanogpt::train
