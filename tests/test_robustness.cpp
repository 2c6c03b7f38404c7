// Robustness: a checkpoint save that fails (full disk, file size limit, unwritable folder) leaves
// the previous checkpoint byte for byte and says why in one line; damaged checkpoints are one-line
// "[ckpt]" errors, never crashes or runaway allocations; Python's safetensors opens a checkpoint
// and reads what C++ wrote. The cases at the end are inputs the fuzzers (tests/fuzz) found, kept
// as regressions.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <sys/wait.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/utf8.h"
#include "data/vocab.h"
#include "interop/safetensors_export.h"
#include "model/gpt.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "io/safetensors.h"
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
  const std::string path = dir / "ckpt_last.safetensors";
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
  const std::string staging = dir / "staging.safetensors";
  ckpt.save(staging);
  const auto size = fs::file_size(staging);
  SmallTmpfs disk(dir / "disk", size + size / 2);  // room for one checkpoint, not two
  if (!disk.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN); the file size limit test covers the failure path";
  const std::string path = dir / "disk/ckpt_last.safetensors";
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
  const std::string message = error_of([&] { ckpt.save(dir / "file/ckpt_last.safetensors"); });
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find("Not a directory"), std::string::npos) << message;
}

// Every prefix of a checkpoint (truncation at every byte) is a one-line error: the tensors must
// tile the data section exactly, so no prefix can pass. Flipped bytes either load (inside a
// weight) or are one-line errors.
TEST(CheckpointLoad, TruncatedAndGarbageFilesAreOneLineErrors) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  const std::string good = dir / "good.safetensors";
  ckpt.save(good);
  const std::string bytes = slurp(good);
  ASSERT_NO_THROW(train::load_model(good));
  const std::string path = dir / "damaged.safetensors";
  for (size_t n = 1; n < bytes.size(); ++n) {
    spit(path, bytes.substr(0, n));
    try {
      train::load_model(path);
      ADD_FAILURE() << "a checkpoint cut to " << n << " of " << bytes.size() << " bytes loaded";
      break;
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      if (message.rfind("[ckpt] '" + path + "': ", 0) != 0 || message.find('\n') != std::string::npos) {
        ADD_FAILURE() << "cut to " << n << " bytes: " << message;
        break;
      }
    }
  }
  std::vector<std::string> damaged = {std::string(bytes.size(), '\0'), std::string(4096, '\xff'), "not a checkpoint\n"};
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {  // a few flipped bytes, half of them in the length and the header
    std::string flipped = bytes;
    const size_t span = i % 2 ? flipped.size() : 8 + 1024;
    for (int k = 0; k < 1 + i % 4; ++k) flipped[rng() % span] ^= static_cast<char>(1 + rng() % 255);
    damaged.push_back(flipped);
  }
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

namespace {

using Json = nlohmann::ordered_json;

// Rewrites the safetensors file at `from` into `to` after `edit` changed its parsed header (the
// data section is copied as is): damage a checkpoint in one precise way.
void rewrite_header(const std::string& from, const std::string& to, const std::function<void(Json&)>& edit) {
  const std::string bytes = slurp(from);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  Json header = Json::parse(bytes.substr(8, n));
  edit(header);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t(text.size()) >> (8 * i));
  spit(to, out + text + bytes.substr(8 + n));
}

// The one-line error of loading `path` for sampling (load_model) or for a resume (load_checkpoint).
std::string sample_error(const std::string& path) {
  return error_of([&] { train::load_model(path); });
}
std::string resume_error(const std::string& path, TinyCheckpoint& ckpt) {
  return error_of([&] { train::load_checkpoint(path, &ckpt.gpt, ckpt.optimizer.get()); });
}

void expect_error_with(const std::string& message, const std::string& needle) {
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << message;
}

}  // namespace

TEST(CheckpointLoad, DamagedHeadersAreOneLineErrorsThatSayWhat) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  const std::string good = dir / "good.safetensors", bad = dir / "bad.safetensors";
  ckpt.save(good);
  ASSERT_NO_THROW(train::load_checkpoint(good, &ckpt.gpt, ckpt.optimizer.get()));

  {  // a header that is not JSON
    std::string bytes = slurp(good);
    bytes.replace(8, 9, "{\"x\": nul");
    spit(bad, bytes);
    expect_error_with(sample_error(bad), "not valid JSON");
  }
  rewrite_header(good, bad, [](Json& h) { h["model.wte.weight"]["data_offsets"][1] = 1u << 30; });
  expect_error_with(sample_error(bad), "outside the data section");
  rewrite_header(good, bad, [](Json& h) { h["model.wte.weight"]["data_offsets"] = {1u << 30, (1u << 30) + 160}; });
  expect_error_with(sample_error(bad), "outside the data section");
  // Same bytes, transposed shape: the file is consistent, the config is not.
  rewrite_header(good, bad, [](Json& h) { h["model.wte.weight"]["shape"] = {8, 5}; });
  expect_error_with(sample_error(bad), "tensor 'model.wte.weight' has shape [8, 5], the config expects [5, 8]");
  rewrite_header(good, bad, [](Json& h) { h["model.wte.weight"]["shape"] = {5, 9}; });
  expect_error_with(sample_error(bad), "needs 180 bytes");
  rewrite_header(good, bad, [](Json& h) { h["model.wte.weight"]["dtype"] = "I32"; });
  expect_error_with(sample_error(bad), "not floating point");
  // Missing tensors (renamed, so that the data section still tiles).
  auto rename = [&](const std::string& from, const std::string& to) {
    rewrite_header(good, bad, [&](Json& h) {
      h[to] = h[from];
      h.erase(from);
    });
  };
  rename("model.wte.weight", "model.wte.weight.old");
  expect_error_with(sample_error(bad), "tensor 'model.wte.weight' is missing");
  rename("rng.cpu", "rng.cpu.old");
  expect_error_with(error_of([&] { train::read_checkpoint_meta(bad); }), "tensor 'rng.cpu' is missing");
  rename("optimizer.exp_avg_sq.no_decay", "optimizer.old");
  EXPECT_NO_THROW(train::load_model(bad));  // sampling does not need the optimizer state
  expect_error_with(resume_error(bad, ckpt), "optimizer state 'exp_avg_sq.no_decay' is missing");
  // Half as many F64 values in the same bytes: a consistent file with the wrong state.
  rewrite_header(good, bad, [](Json& h) {
    Json& t = h["optimizer.exp_avg.decay"];
    t["shape"] = {t["shape"][0].get<int64_t>() / 2};
    t["dtype"] = "F64";
  });
  expect_error_with(resume_error(bad, ckpt), "optimizer state 'exp_avg.decay' has 404 values, expected 808");
  // Metadata: missing, malformed, from another version, another kind of file.
  rewrite_header(good, bad, [](Json& h) { h["__metadata__"].erase("model_config"); });
  expect_error_with(sample_error(bad), "metadata 'model_config' is missing");
  rewrite_header(good, bad, [](Json& h) { h["__metadata__"]["model_config"] = "{\"n_layer\": 1}"; });
  expect_error_with(sample_error(bad), "model config lacks 'vocab_size'");
  rewrite_header(good, bad, [](Json& h) {
    Json m = Json::parse(h["__metadata__"]["model_config"].get<std::string>());
    m["n_embd"] = "eight";
    h["__metadata__"]["model_config"] = m.dump();
  });
  expect_error_with(sample_error(bad), "model config 'n_embd' is not an integer");
  rewrite_header(good, bad, [](Json& h) { h["__metadata__"]["iter"] = "ten"; });
  expect_error_with(sample_error(bad), "metadata 'iter' is not an integer");
  rewrite_header(good, bad, [](Json& h) { h["__metadata__"]["format_version"] = "3"; });
  expect_error_with(sample_error(bad), "checkpoint format version 3, this build reads version 2");
  rewrite_header(good, bad, [](Json& h) { h["__metadata__"]["format"] = "nanogpt-cpp"; });
  expect_error_with(sample_error(bad), "an exported model");
  rewrite_header(good, bad, [](Json& h) { h.erase("__metadata__"); });
  expect_error_with(sample_error(bad), "not a nanogpt-cpp checkpoint");
}

// Format 1 (up to LibTorch archive checkpoints, a zip of pickles) gets a clear word, not a parse error.
TEST(CheckpointLoad, FormatOneArchiveSaysItIsFromAnOlderVersion) {
  ScratchDir dir;
  torch::serialize::OutputArchive archive;
  archive.write("format_version", c10::IValue(int64_t{1}));
  archive.write("rng.cpu", torch::zeros({4}, torch::kByte));
  archive.save_to(dir / "ckpt_last.pt");
  for (const auto& load : std::vector<std::function<void()>>{[&] { train::load_model(dir / "ckpt_last.pt"); },
                                                             [&] { train::read_checkpoint_meta(dir / "ckpt_last.pt"); }}) {
    const std::string message = error_of(load);
    expect_error_with(message, "a LibTorch archive checkpoint from an older nanogpt-cpp (format 1)");
    EXPECT_NE(message.find("retrain"), std::string::npos) << message;
  }
}

// fuzz_checkpoint: a stored string with a newline and escape sequence was echoed raw into the error.
TEST(CheckpointLoad, DamagedStringsAreEscapedInErrors) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  ckpt.meta.model_config.pos_encoding = "rope\n\x1b[31m";
  ckpt.save(dir / "ckpt.safetensors");
  const std::string message = error_of([&] { train::load_model(dir / "ckpt.safetensors"); });
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find("rope\\x0a\\x1b[31m"), std::string::npos) << message;
  // Invalid UTF-8 in the header (the writer never produces it) is an error, escaped too.
  std::string bytes = slurp(dir / "ckpt.safetensors");
  const auto at = bytes.find("rope");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 4, "\xff\n\x1b]");
  spit(dir / "bad.safetensors", bytes);
  expect_one_ckpt_line(error_of([&] { train::load_model(dir / "bad.safetensors"); }));
}

// A damaged size field must be rejected before the model is built: n_layer 4096 x n_embd 65536
// would have the constructor allocate and fill ~700 TB (an OOM kill), block_size 2^20 a 1 TiB mask.
TEST(CheckpointLoad, ConfigsTooLargeForTheFileAreRejectedBeforeAllocating) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  ckpt.meta.model_config.n_layer = 4096;
  ckpt.meta.model_config.n_embd = 65536;
  ckpt.save(dir / "huge.safetensors");
  for (const auto& load : std::vector<std::function<void()>>{[&] { train::load_model(dir / "huge.safetensors"); },
                                                             [&] { train::read_checkpoint_meta(dir / "huge.safetensors"); }}) {
    const std::string message = error_of(load);
    expect_one_ckpt_line(message);
    EXPECT_NE(message.find("needs at least"), std::string::npos) << message;
  }
  ckpt.meta.model_config = tiny_model_config();
  ckpt.meta.model_config.block_size = 1 << 20;
  ckpt.save(dir / "long.safetensors");
  const std::string message = error_of([&] { train::load_model(dir / "long.safetensors"); });
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find("implausibly large"), std::string::npos) << message;
}

// A wrong rng.cpu passed every check and failed resume in LibTorch's generator (multi-line error).
TEST(CheckpointLoad, RngStateThatIsNotAGeneratorStateIsOneLine) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  ckpt.meta.torch_rng_state = torch::zeros({3});
  ckpt.save(dir / "ckpt.safetensors");
  const std::string message = error_of([&] { train::read_checkpoint_meta(dir / "ckpt.safetensors"); });
  expect_one_ckpt_line(message);
  EXPECT_NE(message.find("rng.cpu"), std::string::npos) << message;
}

// read_checkpoint_meta reads the header and the RNG state only: damage in the weights' bytes is
// invisible to it (and a resume reads the weights later, through load_checkpoint).
TEST(CheckpointLoad, MetaReadsNeitherWeightsNorOptimizerState) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  ckpt.meta.best_val_loss = 1.0 / 3.0;
  ckpt.meta.loss_scale = 65536.0;
  ckpt.meta.loss_scale_growth = 17;
  ckpt.save(dir / "ckpt.safetensors");
  const auto meta = train::read_checkpoint_meta(dir / "ckpt.safetensors");
  EXPECT_EQ(meta.format_version, 2);
  EXPECT_EQ(meta.iter, 10);
  EXPECT_EQ(meta.best_val_loss, 1.0 / 3.0);  // bit for bit
  EXPECT_EQ(meta.loss_scale, 65536.0);
  EXPECT_EQ(meta.loss_scale_growth, 17);
  EXPECT_TRUE(meta.eval_done);
  EXPECT_EQ(meta.vocab, ckpt.meta.vocab);
  EXPECT_EQ(meta.sampler_state, ckpt.meta.sampler_state);
  EXPECT_EQ(model::to_json(meta.model_config), model::to_json(tiny_model_config()));
  EXPECT_TRUE(torch::equal(meta.torch_rng_state, ckpt.meta.torch_rng_state));
  EXPECT_FALSE(meta.cuda_rng_state.defined());
  // Non-finite losses survive too (JSON has no NaN: they are words).
  ckpt.meta.best_val_loss = std::numeric_limits<double>::infinity();
  ckpt.save(dir / "inf.safetensors");
  EXPECT_EQ(train::read_checkpoint_meta(dir / "inf.safetensors").best_val_loss, ckpt.meta.best_val_loss);
}

// A checkpoint of weights only (what an import writes) holds no optimizer tensor; it loads as the
// weights of the full one, and a resume from it keeps the optimizer as built (zero moments, step 0)
// and can step it. The full checkpoint still restores its optimizer state.
TEST(CheckpointLoad, WeightsOnlyCheckpointResumesWithAFreshOptimizer) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  {  // one step, so the full checkpoint's moments are not zeros
    const auto idx = torch::randint(0, 5, {2, 8});
    ckpt.gpt->forward(idx, idx).second.backward();
    ckpt.optimizer->step(1e-3);
  }
  const std::string full = dir / "full.safetensors", weights = dir / "weights.safetensors";
  ckpt.save(full);
  train::save_checkpoint(weights, ckpt.gpt, ckpt.meta);
  io::SafeTensorsReader reader(weights, "ckpt");
  for (const auto& t : reader.tensors()) EXPECT_NE(t.name.rfind("optimizer.", 0), 0u) << t.name;
  EXPECT_FALSE(train::read_checkpoint_meta(weights).optimizer_state);
  EXPECT_TRUE(train::read_checkpoint_meta(full).optimizer_state);
  EXPECT_LT(fs::file_size(weights), fs::file_size(full));

  auto fresh = [] {
    TinyCheckpoint other;
    torch::NoGradGuard no_grad;
    for (auto& p : other.gpt->parameters()) p.fill_(0.5);  // other weights than the checkpoint's
    return other;
  };
  TinyCheckpoint resumed = fresh();
  const auto meta = train::load_checkpoint(weights, &resumed.gpt, resumed.optimizer.get());
  EXPECT_FALSE(meta.optimizer_state);
  EXPECT_EQ(meta.iter, ckpt.meta.iter);
  const auto ours = ckpt.gpt->named_parameters(), theirs = resumed.gpt->named_parameters();
  for (const auto& item : ours) EXPECT_TRUE(torch::equal(item.value(), theirs[item.key()])) << item.key();
  EXPECT_EQ(resumed.optimizer->steps(), 0);
  for (const auto& [name, tensor] : resumed.optimizer->state())
    EXPECT_EQ(tensor.count_nonzero().item<int64_t>(), 0) << name;
  const auto idx = torch::randint(0, 5, {2, 8});
  resumed.gpt->forward(idx, idx).second.backward();
  resumed.optimizer->step(1e-3);
  EXPECT_EQ(resumed.optimizer->steps(), 1);

  TinyCheckpoint restored = fresh();
  EXPECT_TRUE(train::load_checkpoint(full, &restored.gpt, restored.optimizer.get()).optimizer_state);
  EXPECT_EQ(restored.optimizer->steps(), 1);
  const auto saved_state = ckpt.optimizer->state(), restored_state = restored.optimizer->state();
  for (size_t i = 0; i < saved_state.size(); ++i)
    EXPECT_TRUE(torch::equal(saved_state[i].second, restored_state[i].second)) << saved_state[i].first;
}

namespace {

// Runs `command`; returns its exit status and standard output.
std::pair<int, std::string> run_command(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return {-1, ""};
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

// The point of safetensors checkpoints: Python opens them without LibTorch or pickle.
// tests/check_checkpoint.py loads one with safetensors.numpy.load_file (and its metadata with
// safe_open) and prints every tensor's values and the metadata as JSON; they must equal what C++
// wrote, value for value.
TEST(CheckpointInterop, PythonSafetensorsReadsWhatCppWrote) {
  const std::string python = NANOGPT_PYTHON;
  if (python.empty()) GTEST_SKIP() << "no Python found at configure time (set -DNANOGPT_PYTHON=/path/to/python)";
  if (run_command("'" + python + "' -c 'import safetensors, numpy' 2>/dev/null").first != 0)
    GTEST_SKIP() << "'" << python << "' cannot import safetensors and numpy (pip install safetensors numpy, or "
                 << "configure with -DNANOGPT_PYTHON=<a Python that can>)";
  ScratchDir dir;
  TinyCheckpoint ckpt;
  auto state = ckpt.optimizer->state();  // non-trivial optimizer state: step 7, random moments
  state[0].second = torch::tensor(int64_t{7});
  for (size_t i = 1; i < state.size(); ++i) state[i].second = torch::rand_like(state[i].second);
  ckpt.optimizer->load_state(state);
  ckpt.meta.best_val_loss = 2.125;
  const std::string path = dir / "ckpt_last.safetensors";
  ckpt.save(path);

  const std::string script = std::string(NANOGPT_SOURCE_DIR) + "/tests/check_checkpoint.py";
  const auto [rc, out] = run_command("'" + python + "' '" + script + "' '" + path + "' 2>&1");
  ASSERT_EQ(rc, 0) << out;
  Json seen;
  ASSERT_NO_THROW(seen = Json::parse(out)) << out;

  std::vector<std::pair<std::string, torch::Tensor>> expected;
  for (const auto& item : ckpt.gpt->named_parameters()) expected.emplace_back("model." + item.key(), item.value().detach());
  for (const auto& [name, tensor] : ckpt.optimizer->state()) expected.emplace_back("optimizer." + name, tensor);
  expected.emplace_back("rng.cpu", ckpt.meta.torch_rng_state);
  ASSERT_EQ(seen["tensors"].size(), expected.size()) << seen["tensors"].dump().substr(0, 500);
  for (const auto& [name, tensor] : expected) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(seen["tensors"].contains(name));
    const Json& t = seen["tensors"][name];
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), tensor.sizes().vec());
    const std::string dtype = tensor.scalar_type() == torch::kFloat ? "float32"
                              : tensor.scalar_type() == torch::kLong ? "int64" : "uint8";
    EXPECT_EQ(t["dtype"], dtype);
    const auto values = torch::tensor(t["values"].get<std::vector<double>>(), torch::kDouble);
    EXPECT_TRUE(torch::equal(values, tensor.to(torch::kDouble).reshape({-1}))) << "values differ";
  }
  const Json& meta = seen["metadata"];
  EXPECT_EQ(meta["format"], train::kCheckpointFormat);
  EXPECT_EQ(meta["format_version"], "2");
  EXPECT_EQ(meta["iter"], "10");
  EXPECT_EQ(meta["best_val_loss"], "2.125");
  EXPECT_EQ(meta["eval_done"], "true");
  EXPECT_EQ(meta["vocab"], ckpt.meta.vocab.serialize());
  const Json config = Json::parse(meta["model_config"].get<std::string>());
  EXPECT_EQ(config["vocab_size"], 5);
  EXPECT_EQ(config["n_embd"], 8);
  EXPECT_EQ(config["pos_encoding"], "rope");
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
    EXPECT_TRUE(message.find("\\x0a") != std::string::npos || message.find("a\\nb") != std::string::npos) << message;  // escaped, either way
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
    const std::string message = error_of([&] { io::read_safetensors(dir / "bad.safetensors"); });
    EXPECT_EQ(message.rfind("[export] ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_TRUE(message.find("\\x0a") != std::string::npos || message.find("a\\nb") != std::string::npos) << message;  // escaped, either way
  }
}

// load_model zeroes dropout for inference; the export still states the dropout the model was trained with.
TEST(Export, KeepsTheTrainedDropout) {
  ScratchDir dir;
  TinyCheckpoint ckpt;
  ckpt.meta.model_config.dropout = 0.1;
  ckpt.save(dir / "ckpt.safetensors");
  const train::LoadedModel loaded = train::load_model(dir / "ckpt.safetensors");
  EXPECT_EQ(loaded.model->config().dropout, 0.0);
  interop::export_safetensors(loaded, dir / "m.safetensors");
  const auto config = nlohmann::json::parse(io::read_safetensors(dir / "m.safetensors").metadata.at("config"));
  EXPECT_EQ(config.at("dropout").get<double>(), 0.1);
}
