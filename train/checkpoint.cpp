// Checkpoint files (see checkpoint.h). LibTorch's archive format (a zip of pickled tensors) with
// our keys:
//   format_version, iter, best_val_loss, config_yaml, vocab, sampler_state, eval_done  (values)
//   model_config.<field>                                                                (values)
//   rng.cpu, rng.cuda                                                                   (tensors)
//   model/<parameter name>                          (nested archive, fp32, nanoGPT-like names)
//   optimizer/{step, exp_avg.decay, exp_avg_sq.decay, exp_avg.no_decay, exp_avg_sq.no_decay}
#include "train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "data/atomic_file.h"
#include "data/utf8.h"
#include "train/adamw.h"
#include "train/archive_check.h"

namespace nanogpt::train {
namespace {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

// A damaged file's strings (a config field, a name inside the archive) end up in error messages:
// escape control characters, and every non-ASCII byte when the text is not valid UTF-8, so the
// error stays one readable line.
std::string printable(const std::string& text) {
  bool utf8 = true;
  try {
    data::decode_utf8(text);
  } catch (const std::exception&) {
    utf8 = false;
  }
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F || (u >= 0x80 && !utf8)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::runtime_error ckpt_error(const std::string& path, const std::string& what) {
  return std::runtime_error(printable("[ckpt] '" + path + "': " + what));
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// Returns the file size.
uint64_t check_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw ckpt_error(path, "no such file (train first, or check --out_dir)");
  if (S_ISDIR(st.st_mode)) throw ckpt_error(path, "is a directory, expected a checkpoint file");
  if (st.st_size == 0) throw ckpt_error(path, "file is empty (an interrupted copy?)");
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  if (!in || magic[0] != 'P' || magic[1] != 'K' || magic[2] != 3 || magic[3] != 4)
    throw ckpt_error(path, "not a nanogpt-cpp checkpoint (not a LibTorch archive)");
  return static_cast<uint64_t>(st.st_size);
}

// Loads the archive; LibTorch's errors (truncated zip, foreign pickle) become one clear line.
// Returns the file size.
uint64_t open_archive(const std::string& path, InputArchive& archive) {
  const uint64_t size = check_file(path);
  try {
    check_torch_archive(path);  // what LibTorch would trust blindly (see archive_check.h)
    archive.load_from(path, torch::kCPU);
  } catch (const std::exception& e) {
    throw ckpt_error(path, "cannot be read, truncated or damaged? (" + first_line(e.what()) + ")");
  }
  return size;
}

c10::IValue read_value(InputArchive& archive, const std::string& path, const std::string& key) {
  c10::IValue value;
  bool found = false;
  try {
    found = archive.try_read(key, value);
  } catch (const std::exception& e) {
    throw ckpt_error(path, "entry '" + key + "' is unreadable (" + first_line(e.what()) + ")");
  }
  if (!found) throw ckpt_error(path, "entry '" + key + "' is missing (not a nanogpt-cpp checkpoint?)");
  return value;
}

int64_t read_int(InputArchive& a, const std::string& path, const std::string& key) {
  auto v = read_value(a, path, key);
  if (!v.isInt()) throw ckpt_error(path, "entry '" + key + "' is not an integer");
  return v.toInt();
}
double read_double(InputArchive& a, const std::string& path, const std::string& key) {
  auto v = read_value(a, path, key);
  if (!v.isDouble()) throw ckpt_error(path, "entry '" + key + "' is not a number");
  return v.toDouble();
}
bool read_bool(InputArchive& a, const std::string& path, const std::string& key) {
  auto v = read_value(a, path, key);
  if (!v.isBool()) throw ckpt_error(path, "entry '" + key + "' is not a boolean");
  return v.toBool();
}
std::string read_string(InputArchive& a, const std::string& path, const std::string& key) {
  auto v = read_value(a, path, key);
  if (!v.isString()) throw ckpt_error(path, "entry '" + key + "' is not a string");
  return v.toStringRef();
}
torch::Tensor read_tensor(InputArchive& a, const std::string& path, const std::string& key, bool required) {
  torch::Tensor t;
  bool found = false;
  try {
    found = a.try_read(key, t);
  } catch (const std::exception& e) {
    throw ckpt_error(path, "tensor '" + key + "' is unreadable (" + first_line(e.what()) + ")");
  }
  if (!found && required) throw ckpt_error(path, "tensor '" + key + "' is missing");
  return found ? t : torch::Tensor();
}

void write_model_config(OutputArchive& a, const model::ModelConfig& m) {
  a.write("model_config.vocab_size", m.vocab_size);
  a.write("model_config.block_size", m.block_size);
  a.write("model_config.n_layer", m.n_layer);
  a.write("model_config.n_head", m.n_head);
  a.write("model_config.n_kv_head", m.n_kv_head);
  a.write("model_config.n_embd", m.n_embd);
  a.write("model_config.dropout", m.dropout);
  a.write("model_config.bias", m.bias);
  a.write("model_config.pos_encoding", m.pos_encoding);
  a.write("model_config.rope_base", m.rope_base);
  a.write("model_config.norm", m.norm);
  a.write("model_config.attention", m.attention);
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
model::ModelConfig read_model_config(InputArchive& a, const std::string& path, uint64_t file_size) {
  model::ModelConfig m;
  m.vocab_size = read_int(a, path, "model_config.vocab_size");
  m.block_size = read_int(a, path, "model_config.block_size");
  m.n_layer = read_int(a, path, "model_config.n_layer");
  m.n_head = read_int(a, path, "model_config.n_head");
  m.n_kv_head = read_int(a, path, "model_config.n_kv_head");
  m.n_embd = read_int(a, path, "model_config.n_embd");
  m.dropout = read_double(a, path, "model_config.dropout");
  m.bias = read_bool(a, path, "model_config.bias");
  m.pos_encoding = read_string(a, path, "model_config.pos_encoding");
  m.rope_base = read_double(a, path, "model_config.rope_base");
  m.norm = read_string(a, path, "model_config.norm");
  m.attention = read_string(a, path, "model_config.attention");
  // "sdpa" saved on LibTorch 2.x must still load on 1.13: the math path computes the same thing.
  if (m.attention == "sdpa") m.attention = "auto";
  try {
    m.validate();
  } catch (const std::exception& e) {
    throw ckpt_error(path, std::string("stored model config is invalid: ") + e.what());
  }
  // block_size: attention builds a (block_size, block_size) mask, so 2^18 (64 GiB of it) is above
  // anything that was ever trained; the position tables grow with it even without weights.
  if (m.vocab_size > (int64_t{1} << 21) || m.n_layer > 4096 || m.n_embd > (int64_t{1} << 16) ||
      m.block_size > (int64_t{1} << 18))
    throw ckpt_error(path, "stored model config is implausibly large (damaged file?)");
  const double needed = min_weight_bytes(m);
  if (needed > static_cast<double>(file_size))
    throw ckpt_error(path, "stored model config (vocab_size " + std::to_string(m.vocab_size) + ", n_layer " +
                               std::to_string(m.n_layer) + ", n_embd " + std::to_string(m.n_embd) + ") needs at least " +
                               std::to_string(static_cast<uint64_t>(needed)) + " bytes of weights, but the file has " +
                               std::to_string(file_size) + " (damaged file?)");
  return m;
}

CheckpointMeta read_meta(InputArchive& a, const std::string& path, uint64_t file_size) {
  CheckpointMeta meta;
  c10::IValue version;
  if (!a.try_read("format_version", version) || !version.isInt())
    throw ckpt_error(path, "not a nanogpt-cpp checkpoint (no format_version)");
  meta.format_version = version.toInt();
  if (meta.format_version != kCheckpointFormatVersion)
    throw ckpt_error(path, "checkpoint format version " + std::to_string(meta.format_version) + ", this build reads version " +
                               std::to_string(kCheckpointFormatVersion) + " (use the nanogpt that wrote it)");
  meta.iter = read_int(a, path, "iter");
  meta.best_val_loss = read_double(a, path, "best_val_loss");
  meta.config_yaml = read_string(a, path, "config_yaml");
  meta.sampler_state = read_string(a, path, "sampler_state");
  meta.eval_done = read_bool(a, path, "eval_done");
  c10::IValue scale, growth;  // absent in checkpoints from before float16 training: no scaler then
  if (a.try_read("loss_scale", scale) && scale.isDouble()) meta.loss_scale = scale.toDouble();
  if (a.try_read("loss_scale_growth", growth) && growth.isInt()) meta.loss_scale_growth = growth.toInt();
  meta.model_config = read_model_config(a, path, file_size);
  try {
    meta.vocab = data::Vocab::deserialize(read_string(a, path, "vocab"));
  } catch (const std::runtime_error& e) {
    throw ckpt_error(path, e.what());
  }
  if (meta.vocab.size() != meta.model_config.vocab_size)
    throw ckpt_error(path, "vocabulary has " + std::to_string(meta.vocab.size()) + " characters but the model expects " +
                               std::to_string(meta.model_config.vocab_size));
  meta.torch_rng_state = read_tensor(a, path, "rng.cpu", true);
  // Resume hands it to the CPU generator, whose own size check throws LibTorch's multi-line error.
  const int64_t rng_bytes = at::make_generator<at::CPUGeneratorImpl>().get_state().numel();
  if (meta.torch_rng_state.scalar_type() != torch::kByte || meta.torch_rng_state.dim() != 1 ||
      meta.torch_rng_state.numel() != rng_bytes)
    throw ckpt_error(path, "tensor 'rng.cpu' is not a CPU generator state (" + std::to_string(rng_bytes) + " bytes)");
  meta.cuda_rng_state = read_tensor(a, path, "rng.cuda", false);
  if (meta.iter < 0) throw ckpt_error(path, "negative iteration count");
  return meta;
}

std::string shape_str(torch::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

void load_weights(InputArchive& a, const std::string& path, model::GPT& model) {
  InputArchive weights;
  if (!a.try_read("model", weights)) throw ckpt_error(path, "the model weights are missing");
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    auto t = read_tensor(weights, path, item.key(), true);
    if (t.sizes() != item.value().sizes())
      throw ckpt_error(path, "tensor '" + item.key() + "' has shape " + shape_str(t.sizes()) + ", the config expects " +
                                 shape_str(item.value().sizes()));
    if (!t.is_floating_point()) throw ckpt_error(path, "tensor '" + item.key() + "' is not floating point");
    item.value().copy_(t);
  }
}

// Writes the archive to `path` through our own file descriptor. LibTorch must never see a failed
// write: its zip writer throws, and its destructor then retries and throws again, which calls
// std::terminate (a full disk used to abort the run with a LibTorch stack trace and leave the
// temporary file behind). So the first error (ENOSPC, EFBIG, EIO) is remembered, the rest of the
// bytes are dropped, and the error is thrown here once LibTorch has finished.
void write_archive(OutputArchive& archive, const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create '" + path + "': " + std::strerror(errno));
  int write_errno = 0;
  try {
    archive.save_to([&](const void* data, size_t size) -> size_t {
      const auto* bytes = static_cast<const char*>(data);
      for (size_t done = 0; done < size && write_errno == 0;) {
        const ssize_t n = ::write(fd, bytes + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) write_errno = errno;
        else done += static_cast<size_t>(n);
      }
      return size;  // claim success even after an error (see above)
    });
  } catch (const c10::Error& e) {
    ::close(fd);
    throw std::runtime_error(first_line(e.what_without_backtrace()));
  }
  if (::close(fd) != 0 && write_errno == 0) write_errno = errno;
  if (write_errno != 0) throw std::runtime_error(std::string("write failed: ") + std::strerror(write_errno));
}

}  // namespace

void save_checkpoint(const std::string& path, model::GPT& model, const FlatAdamW& optimizer, const CheckpointMeta& meta) {
  OutputArchive archive;
  archive.write("format_version", kCheckpointFormatVersion);
  archive.write("iter", meta.iter);
  archive.write("best_val_loss", meta.best_val_loss);
  archive.write("config_yaml", meta.config_yaml);
  archive.write("vocab", meta.vocab.serialize());
  archive.write("sampler_state", meta.sampler_state);
  archive.write("eval_done", meta.eval_done);
  archive.write("loss_scale", meta.loss_scale);
  archive.write("loss_scale_growth", meta.loss_scale_growth);
  write_model_config(archive, meta.model_config);
  archive.write("rng.cpu", meta.torch_rng_state);
  if (meta.cuda_rng_state.defined()) archive.write("rng.cuda", meta.cuda_rng_state);
  OutputArchive weights;
  for (const auto& item : model->named_parameters())
    weights.write(item.key(), item.value().detach().to(torch::kCPU, torch::kFloat).clone());  // own storage each
  archive.write("model", weights);
  OutputArchive opt;
  optimizer.save(opt);
  archive.write("optimizer", opt);
  data::write_file_atomically(path, [&](const std::string& tmp) { write_archive(archive, tmp); }, "ckpt");
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  InputArchive archive;
  const uint64_t file_size = open_archive(path, archive);
  return read_meta(archive, path, file_size);
}

CheckpointMeta load_checkpoint(const std::string& path, model::GPT* model, FlatAdamW* optimizer) {
  InputArchive archive;
  const uint64_t file_size = open_archive(path, archive);
  auto meta = read_meta(archive, path, file_size);
  if (model) load_weights(archive, path, *model);
  if (optimizer) {
    InputArchive opt;
    if (!archive.try_read("optimizer", opt)) throw ckpt_error(path, "the optimizer state is missing");
    try {
      optimizer->load(opt);
    } catch (const std::exception& e) {  // also LibTorch's c10::Error (a missing entry), not a runtime_error
      throw ckpt_error(path, first_line(e.what()));
    }
  }
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
  InputArchive archive;
  const uint64_t file_size = open_archive(path, archive);
  LoadedModel loaded;
  loaded.path = path;
  loaded.meta = read_meta(archive, path, file_size);
  loaded.vocab = loaded.meta.vocab;
  auto config = loaded.meta.model_config;
  config.dropout = 0.0;  // inference
  loaded.model = model::GPT(config);
  load_weights(archive, path, loaded.model);
  loaded.model->to(device);
  loaded.model->eval();
  return loaded;
}

}  // namespace nanogpt::train
