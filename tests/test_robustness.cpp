// Robustness: a checkpoint save that fails (full disk, file size limit, unwritable folder) leaves
// the previous checkpoint byte for byte and says why in one line; damaged checkpoints are one-line
// "[ckpt]" errors, never crashes or runaway allocations. The cases at the end are inputs the
// fuzzers (tests/fuzz) found, kept as regressions.
#include <ATen/CPUGeneratorImpl.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/utf8.h"
#include "data/vocab.h"
#include "model/gpt.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/safetensors.h"
#include "test_files.h"

namespace fs = std::filesystem;
using namespace nanogpt;

namespace {

using nanogpt::testing::ScratchDir;
using nanogpt::testing::slurp;
using nanogpt::testing::spit;

std::vector<std::string> temp_files(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) found.push_back(entry.path().string());
  return found;
}

// The message of the std::runtime_error `f` throws ("" and a test failure when it does not).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected std::runtime_error, got another exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

void expect_one_ckpt_line(const std::string& message) {
  EXPECT_EQ(message.rfind("[ckpt] ", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

model::ModelConfig tiny_model_config() {
  model::ModelConfig m;
  m.vocab_size = 5;
  m.block_size = 8;
  m.n_layer = 1;
  m.n_head = 2;
  m.n_embd = 8;
  return m;
}

// A model, its optimizer and meta, ready for save_checkpoint; meta.model_config may be changed
// afterwards to store values the model does not have (save_checkpoint writes them as given).
struct TinyCheckpoint {
  model::GPT gpt{nullptr};
  std::unique_ptr<train::FlatAdamW> optimizer;
  train::CheckpointMeta meta;

  TinyCheckpoint() {
    torch::manual_seed(0);
    gpt = model::GPT(tiny_model_config());
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (auto& item : gpt->named_parameters()) params.emplace_back(item.key(), item.value());
    optimizer = std::make_unique<train::FlatAdamW>(params, train::FlatAdamW::Options{});
    meta.iter = 10;
    meta.model_config = tiny_model_config();
    meta.vocab = data::Vocab::from_text("abcde");
    std::ostringstream sampler;
    sampler << std::mt19937_64(1);
    meta.sampler_state = sampler.str();
    meta.torch_rng_state = at::detail::getDefaultCPUGenerator().get_state();
    meta.eval_done = true;
  }
  void save(const std::string& path) { train::save_checkpoint(path, gpt, *optimizer, meta); }
};

// Lowers the file size limit (RLIMIT_FSIZE) for the scope, with SIGXFSZ ignored so an oversized
// write fails with EFBIG instead of killing the process: a full disk that needs no root.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  void (*old_handler_)(int) = nullptr;
  bool ok_ = false;
};

// A small tmpfs for the scope (needs root / CAP_SYS_ADMIN); ok() is false where it cannot mount.
class SmallTmpfs {
 public:
  SmallTmpfs(const std::string& dir, size_t bytes) : dir_(dir) {
    fs::create_directories(dir);
    const std::string options = "size=" + std::to_string(bytes);
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) == 0;
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount(dir_.c_str());
  }
  bool ok() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

// Saves once, then makes the second save fail inside `failing_scope`, and checks the aftermath.
void expect_failed_save_keeps_previous(const std::string& path, const std::function<std::string()>& failing_save,
                                       const std::string& reason) {
  const std::string before = slurp(path);
  ASSERT_FALSE(before.empty());
  const std::string message = failing_save();
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find("cannot write '" + path + "'"), std::string::npos) << message;
  EXPECT_NE(message.find(reason), std::string::npos) << message;
  EXPECT_EQ(slurp(path), before) << "the previous checkpoint changed";
  EXPECT_TRUE(temp_files(fs::path(path).parent_path()).empty()) << "a temporary file was left behind";
  EXPECT_EQ(train::read_checkpoint_meta(path).iter, 10);
}

}  // namespace

TEST(CheckpointSave, FailedSaveKeepsThePreviousCheckpoint_FileSizeLimit) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  const std::string path = dir / "ckpt_last.pt";
  ckpt.save(path);
  const auto size = fs::file_size(path);
  expect_failed_save_keeps_previous(
      path,
      [&] {
        ckpt.meta.iter = 20;
        FileSizeLimit limit(size / 2);
        if (!limit.ok()) return std::string("setrlimit failed: File too large");  // fails the checks loudly
        return error_of([&] { ckpt.save(path); });
      },
      "File too large");
}

TEST(CheckpointSave, FailedSaveKeepsThePreviousCheckpoint_FullDisk) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  const std::string staging = dir / "staging.pt";
  ckpt.save(staging);
  const auto size = fs::file_size(staging);
  SmallTmpfs disk(dir / "disk", size + size / 2);  // room for one checkpoint, not two
  if (!disk.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN); the file size limit test covers the failure path";
  const std::string path = dir / "disk/ckpt_last.pt";
  ckpt.save(path);
  expect_failed_save_keeps_previous(
      path,
      [&] {
        ckpt.meta.iter = 20;
        return error_of([&] { ckpt.save(path); });
      },
      "No space left on device");
}

TEST(CheckpointSave, UnwritableFolderIsOneClearLine) {
  ScratchDir dir;
  spit(dir / "file", "not a folder");
  TinyCheckpoint ckpt;
  const std::string message = error_of([&] { ckpt.save(dir / "file/ckpt_last.pt"); });
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find("Not a directory"), std::string::npos) << message;
}

TEST(CheckpointLoad, TruncatedAndGarbageFilesAreOneLineErrors) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  const std::string good = dir / "good.pt";
  ckpt.save(good);
  const std::string bytes = slurp(good);
  std::vector<std::string> damaged = {std::string(bytes.size(), '\0'), std::string(4096, '\xff'), "PK\x03\x04",
                                      "not a checkpoint\n"};
  for (size_t n = 1; n < bytes.size(); n += bytes.size() / 97 + 1) damaged.push_back(bytes.substr(0, n));
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {  // a few flipped bytes
    std::string flipped = bytes;
    for (int k = 0; k < 4; ++k) flipped[rng() % flipped.size()] ^= static_cast<char>(1 + rng() % 255);
    damaged.push_back(flipped);
  }
  const std::string path = dir / "damaged.pt";
  for (size_t i = 0; i < damaged.size(); ++i) {
    SCOPED_TRACE("damaged file " + std::to_string(i) + " (" + std::to_string(damaged[i].size()) + " bytes)");
    spit(path, damaged[i]);
    try {
      train::load_model(path);  // a flipped byte inside a weight can still load: that is fine
    } catch (const std::runtime_error& e) {
      expect_one_ckpt_line(e.what());
    }
  }
}

// fuzz_checkpoint: a stored string with a newline and invalid UTF-8 was echoed raw into the error.
TEST(CheckpointLoad, DamagedStringsAreEscapedInErrors) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  ckpt.meta.model_config.pos_encoding = "rope\n\xff\x1b[31m";
  ckpt.save(dir / "ckpt.pt");
  const std::string message = error_of([&] { train::load_model(dir / "ckpt.pt"); });
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find("rope\\x0A\\xFF\\x1B[31m"), std::string::npos) << message;
}

// A damaged size field must be rejected before the model is built: n_layer 4096 x n_embd 65536
// would have the constructor allocate and fill ~700 TB (an OOM kill), block_size 2^20 a 1 TiB mask.
TEST(CheckpointLoad, ConfigsTooLargeForTheFileAreRejectedBeforeAllocating) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  ckpt.meta.model_config.n_layer = 4096;
  ckpt.meta.model_config.n_embd = 65536;
  ckpt.save(dir / "huge.pt");
  for (const auto& load : std::vector<std::function<void()>>{[&] { train::load_model(dir / "huge.pt"); },
                                                             [&] { train::read_checkpoint_meta(dir / "huge.pt"); }}) {
    const std::string message = error_of(load);
    expect_one_ckpt_line(message);
    EXPECT_NE(message.find("needs at least"), std::string::npos) << message;
  }
  ckpt.meta.model_config = tiny_model_config();
  ckpt.meta.model_config.block_size = 1 << 20;
  ckpt.save(dir / "long.pt");
  const std::string message = error_of([&] { train::load_model(dir / "long.pt"); });
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find("implausibly large"), std::string::npos) << message;
}

// A wrong rng.cpu passed every check and failed resume in LibTorch's generator (multi-line error).
TEST(CheckpointLoad, RngStateThatIsNotAGeneratorStateIsOneLine) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  ckpt.meta.torch_rng_state = torch::zeros({3});
  ckpt.save(dir / "ckpt.pt");
  const std::string message = error_of([&] { train::read_checkpoint_meta(dir / "ckpt.pt"); });
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find("rng.cpu"), std::string::npos) << message;
}

// A checkpoint whose optimizer section lacks its entries failed resume with LibTorch's multi-line
// c10::Error (found by fuzz_checkpoint).
TEST(CheckpointLoad, MissingOptimizerStateIsOneLine) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  const auto& m = ckpt.meta.model_config;
  torch::serialize::OutputArchive a, weights, empty_optimizer;
  a.write("format_version", train::kCheckpointFormatVersion);
  a.write("iter", ckpt.meta.iter);
  a.write("best_val_loss", ckpt.meta.best_val_loss);
  a.write("config_yaml", std::string());
  a.write("vocab", ckpt.meta.vocab.serialize());
  a.write("sampler_state", ckpt.meta.sampler_state);
  a.write("eval_done", true);
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
  a.write("rng.cpu", ckpt.meta.torch_rng_state);
  for (const auto& item : ckpt.gpt->named_parameters()) weights.write(item.key(), item.value().detach().clone());
  a.write("model", weights);
  a.write("optimizer", empty_optimizer);
  a.save_to(dir / "no_optimizer_state.pt");

  EXPECT_NO_THROW(train::load_model(dir / "no_optimizer_state.pt"));  // sampling does not need it
  const std::string message =
      error_of([&] { train::load_checkpoint(dir / "no_optimizer_state.pt", &ckpt.gpt, ckpt.optimizer.get()); });
  expect_one_ckpt_line(message);
}

// fuzz_checkpoint: a damaged class source (code/*.py, a deflated record) crashed LibTorch 1.13's
// TorchScript parser with SIGSEGV. Rewrites a good checkpoint with one source line changed.
TEST(CheckpointLoad, DamagedClassSourceIsOneLineNotACrash) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  ckpt.save(dir / "good.pt");
  for (const std::string& bad : {std::string("  model : __torch__.\xff\x01(((\n"), std::string("  def f(self):\n")}) {
    SCOPED_TRACE(bad);
    {
      caffe2::serialize::PyTorchStreamReader reader(dir / "good.pt");
      caffe2::serialize::PyTorchStreamWriter writer(dir / "bad.pt");
      for (const std::string& name : reader.getAllRecords()) {
        if (name == ".data/version" || name == "version") continue;  // the writer adds its own
        auto [data, size] = reader.getRecord(name);
        std::string bytes(static_cast<const char*>(data.get()), size);
        if (name == "code/__torch__.py") bytes += bad;
        const bool source = name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0;  // deflated, as LibTorch does
        writer.writeRecord(name, bytes.data(), bytes.size(), source);
      }
      writer.writeEndOfFile();
    }
    const std::string message = error_of([&] { train::load_model(dir / "bad.pt"); });
    expect_one_ckpt_line(message);
    EXPECT_NE(message.find("code/__torch__.py"), std::string::npos) << data::escape_controls(message);
  }
}

// fuzz_config: quoted keys and values with newlines made multi-line errors.
TEST(ConfigErrors, NewlinesInKeysAndValuesAreEscaped) {
  for (const std::string yaml : {"\"max_iter\\nx\": 1\n", "max_iters: \"1\\n2\"\n", "init_from: |\n  a\n  b\n"}) {
    SCOPED_TRACE(yaml);
    std::string message;
    try {
      train::parse_config(yaml, "cfg.yaml").validate();
      ADD_FAILURE() << "expected an error";
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    EXPECT_EQ(message.rfind("[config] ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find("\\x0a"), std::string::npos) << message;
  }
  train::TrainConfig config;
  try {
    train::apply_overrides(config, {"--max_iters=1\n2"});
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

// fuzz_config: yaml-cpp's LoadAll never returned on a stray ',' (memory grew until the OOM killer).
TEST(ConfigErrors, StrayCommaIsAnErrorNotAHang) {
  for (const std::string yaml : {",", ", a", "# comment\n,", "max_iters: 5\n---\n,"}) {
    SCOPED_TRACE(yaml);
    try {
      train::parse_config(yaml, "cfg.yaml");
      ADD_FAILURE() << "expected an error";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[config] cfg.yaml: ", 0), 0u) << e.what();
    }
  }
}

// fuzz_safetensors: names and JSON errors from the header were echoed with raw newlines.
TEST(SafeTensorsErrors, NewlinesFromTheHeaderAreEscaped) {
  ScratchDir dir;
  const auto file_with_header = [](std::string header) {
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t(header.size()) >> (8 * i));
    return out + header;
  };
  const std::vector<std::string> headers = {R"({"a\nb":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})",
                                            "{\"x\":\"\\\n\"}"};  // a JSON \n escape; a raw newline after '\'
  for (const std::string& header : headers) {
    SCOPED_TRACE(header);
    spit(dir / "bad.safetensors", file_with_header(header));
    const std::string message = error_of([&] { train::read_safetensors(dir / "bad.safetensors"); });
    EXPECT_EQ(message.rfind("[export] ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find("\\x0a"), std::string::npos) << message;
  }
}
