// Checkpoints written in the background (train/checkpoint_writer.h): the file holds the state of
// the iteration that asked for it, byte for byte what a save on the training thread writes, however
// the training changes the weights meanwhile; a failed write reaches the training thread as one
// error; a kill -9 in the middle of a background write leaves the previous checkpoint, loadable, and
// the resumed run's losses equal an uninterrupted run's bit for bit, its temporary file removed at
// the next start; scripts/kill_resume.sh passes.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/sinks/null_sink.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "shell.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/config.h"
#include "train/trainer.h"
#include "train_fixture.h"

extern char** environ;

using namespace nanogpt;
using namespace nanogpt::testing;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<spdlog::logger> silent_logger() {
  return std::make_shared<spdlog::logger>("test", std::make_shared<spdlog::sinks::null_sink_mt>());
}

// A tiny model and its AdamW after one step (so the moments are not zero), with the meta a
// trainer would write.
struct Trained {
  model::GPT model{nullptr};
  std::unique_ptr<train::FlatAdamW> optimizer;
  train::CheckpointMeta meta;

  explicit Trained(torch::Device device = torch::kCPU) {
    torch::manual_seed(7);
    auto config = tiny_model_config();
    model = model::GPT(config);
    model->to(device);
    optimizer = std::make_unique<train::FlatAdamW>(*model, train::FlatAdamW::Options{});
    auto x = torch::randint(config.vocab_size, {2, config.block_size}).to(device);
    auto y = torch::randint(config.vocab_size, {2, config.block_size}).to(device);
    model->forward(x, y).second.backward();
    optimizer->step(1e-2);
    optimizer->zero_grad();
    meta.iter = 1;
    meta.model_config = config;
    meta.vocab = data::Vocab::from_text("abcdefghijk");
    meta.sampler_state = "sampler";
    meta.torch_rng_state = at::detail::getDefaultCPUGenerator().get_state();
  }
  train::CheckpointContent content() { return train::checkpoint_content(model, *optimizer, meta); }
  // What a training step does to everything the checkpoint holds: every value changes in place.
  void change_everything() {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(1.0f);
    for (auto& [name, tensor] : optimizer->state()) tensor.add_(1);
  }
};

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const std::string& n, const std::string& value) : name(n) { ::setenv(n.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

// The highest iteration of a `train` row in a metrics.csv being written (-1 for none yet).
int64_t last_train_iter(const std::string& metrics_csv) {
  std::istringstream in(read_text(metrics_csv));
  std::string line;
  int64_t last = -1;
  while (std::getline(in, line))
    if (line.find(",train,") != std::string::npos && !line.empty() && std::isdigit(static_cast<unsigned char>(line[0])))
      last = std::max<int64_t>(last, std::stoll(line));
  return last;
}

// A temporary file of `target` (its atomic write in progress), or "".
std::string temp_file_of(const std::string& target) {
  const fs::path path(target);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(path.parent_path(), ec))
    if (entry.path().filename().string().rfind(path.filename().string() + ".tmp.", 0) == 0) return entry.path().string();
  return "";
}

// A process id that no process has now: a child's that has exited and been reaped.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

}  // namespace

// The temporary files of saves whose process is gone (NAME.tmp.PID.N) are removed; a live writer's,
// this process's included, and files of other names stay.
TEST(CheckpointKill, TemporaryFilesOfDeadWritersAreRemoved) {
  TempDir dir("dead_temp_files");
  const std::string dead = std::to_string(dead_pid()), self = std::to_string(::getpid());
  auto file = [&](const std::string& name, size_t bytes) {
    std::ofstream(dir.path + "/" + name) << std::string(bytes, 'x');
    return dir.path + "/" + name;
  };
  const std::vector<std::string> gone = {file("ckpt_last.safetensors.tmp." + dead + ".0", 1000),
                                         file("ckpt_best.safetensors.tmp." + dead + ".17", 24)};
  const std::vector<std::string> kept = {file("ckpt_last.safetensors.tmp." + self + ".3", 5),
                                         file("config.yaml.tmp." + std::to_string(::getppid()) + ".0", 5),
                                         file("ckpt_last.safetensors", 5), file("notes.tmp." + dead + ".txt", 5),
                                         file("ckpt_last.safetensors.tmp." + dead, 5), file("tmp." + dead + ".1", 5)};
  const auto removed = io::remove_dead_temp_files(dir.path);
  EXPECT_EQ(removed.files, 2);
  EXPECT_EQ(removed.bytes, 1024);
  for (const auto& path : gone) EXPECT_FALSE(fs::exists(path)) << path;
  for (const auto& path : kept) EXPECT_TRUE(fs::exists(path)) << path;
}

// The training thread changes every weight and moment right after asking for a background save
// (which is paused half-way through its write); the file still holds the state at the save, and is
// byte for byte the file a save on the training thread writes.
TEST(CheckpointWriter, ABackgroundSaveHoldsTheStateOfItsIterationByteForByte) {
  TempDir dir("ckpt_writer_snapshot");
  Trained t;
  const std::string foreground = dir.path + "/foreground.safetensors", background = dir.path + "/background.safetensors";
  train::save_checkpoint(foreground, t.model, *t.optimizer, t.meta);
  {
    ScopedEnv pause("NANOGPT_TEST_CKPT_PAUSE_MS", "300");
    train::CheckpointWriter writer(silent_logger(), /*background=*/true);
    const double paused_ms = writer.save({background}, t.content(), t.meta.iter);
    EXPECT_LT(paused_ms, 300) << "save() waited for the write";
    t.change_everything();  // the next steps, while the file is being written
    EXPECT_FALSE(fs::exists(background)) << "written before the pause ended: the test proves nothing";
    writer.finish();
  }
  EXPECT_TRUE(read_text(background) == read_text(foreground)) << "the background file differs from the foreground one";
  // ... and it is not the changed state.
  Trained changed;
  changed.change_everything();
  const std::string now = dir.path + "/now.safetensors";
  train::save_checkpoint(now, changed.model, *changed.optimizer, changed.meta);
  EXPECT_FALSE(read_text(now) == read_text(foreground)) << "change_everything() changed nothing";
}

// The same on a GPU: the snapshot is a device-to-host copy (into pinned memory), taken before
// save() returns, so the steps after it do not reach the file.
TEST(CheckpointWriter, AGpuSnapshotHoldsTheStateOfItsIterationByteForByte) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  TempDir dir("ckpt_writer_gpu");
  Trained t(torch::kCUDA);
  const std::string foreground = dir.path + "/foreground.safetensors", background = dir.path + "/background.safetensors";
  train::save_checkpoint(foreground, t.model, *t.optimizer, t.meta);
  {
    ScopedEnv pause("NANOGPT_TEST_CKPT_PAUSE_MS", "300");
    train::CheckpointWriter writer(silent_logger(), true);
    writer.save({background}, t.content(), t.meta.iter);
    t.change_everything();
    writer.finish();
  }
  EXPECT_TRUE(read_text(background) == read_text(foreground)) << "the background file differs from the foreground one";
  EXPECT_NO_THROW(train::load_model(background));
}

// Two saves in a row: the second waits for the first (one in flight), both land, in order, and the
// snapshot buffers reused by the second do not leak into the first.
TEST(CheckpointWriter, ASecondSaveWaitsForTheFirstAndBothHoldTheirOwnState) {
  TempDir dir("ckpt_writer_two");
  Trained t;
  const std::string first = dir.path + "/first.safetensors", second = dir.path + "/second.safetensors";
  const std::string expect_first = dir.path + "/expect_first.safetensors", expect_second = dir.path + "/expect_second.safetensors";
  train::save_checkpoint(expect_first, t.model, *t.optimizer, t.meta);
  {
    ScopedEnv pause("NANOGPT_TEST_CKPT_PAUSE_MS", "200");
    train::CheckpointWriter writer(silent_logger(), true);
    writer.save({first}, t.content(), 1);
    t.change_everything();
    t.meta.iter = 2;
    train::save_checkpoint(expect_second, t.model, *t.optimizer, t.meta);
    const double waited_ms = writer.save({second}, t.content(), 2);
    EXPECT_TRUE(fs::exists(first)) << "the second save did not wait for the first";
    EXPECT_GT(waited_ms, 50);
    t.change_everything();
    writer.finish();
  }
  EXPECT_TRUE(read_text(first) == read_text(expect_first)) << "the first save holds another state";
  EXPECT_TRUE(read_text(second) == read_text(expect_second)) << "the second save holds another state";
  EXPECT_EQ(train::read_checkpoint_meta(second).iter, 2);
}

// A write that fails in the background (its folder is gone) surfaces on the training thread as the
// usual one-line error, once; the writer then goes on working.
TEST(CheckpointWriter, AFailedBackgroundWriteIsOneErrorOnTheTrainingThread) {
  TempDir dir("ckpt_writer_error");
  Trained t;
  train::CheckpointWriter writer(silent_logger(), true);
  const std::string bad = dir.path + "/no_such_folder/ckpt_last.safetensors";
  writer.save({bad}, t.content(), 1);
  try {
    writer.finish();
    FAIL() << "no error for a write into a missing folder";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[ckpt] cannot write '" + bad + "'", 0), 0u) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_NO_THROW(writer.check());  // reported once
  const std::string good = dir.path + "/ckpt_last.safetensors";
  writer.save({good}, t.content(), 1);
  writer.finish();
  EXPECT_EQ(train::read_checkpoint_meta(good).iter, 1);
  // check() reports a failure between saves, without waiting for the next one.
  writer.save({bad}, t.content(), 1);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  bool thrown = false;
  while (!thrown && Clock::now() < deadline) {
    try {
      writer.check();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } catch (const std::runtime_error& e) {
      thrown = std::string(e.what()).find("cannot write") != std::string::npos;
    }
  }
  EXPECT_TRUE(thrown);
}

// The run's last save failing in the background (ckpt_best's path is taken by a folder) fails the
// run with the usual one line: the end of the run waits for the write and reports its error.
TEST(CheckpointWriter, ALastSaveThatFailsInTheBackgroundFailsTheRun) {
  TempDir dir("ckpt_writer_last_fails");
  auto c = tiny_config(dir.path);
  c.max_iters = 10;  // one save, at the end: ckpt_last, then ckpt_best
  const std::string best = c.out_dir + "/" + train::kBestCheckpoint;
  fs::create_directories(best);
  try {
    train::Trainer(c, true).run();
    FAIL() << "the run succeeded though its last save failed";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[ckpt] cannot write '" + best + "'", 0), 0u) << what;
  }
  EXPECT_EQ(train::read_checkpoint_meta(c.out_dir + "/" + train::kLastCheckpoint).iter, 10);
}

// A trainer that saves in the background and one that saves on its own thread write the same
// checkpoints (but for the key that says which, and each run's id), and the same losses.
TEST(CheckpointWriter, TrainingWritesTheSameCheckpointInTheBackgroundOrNot) {
  TempDir dir("ckpt_writer_trainer");
  std::vector<io::SafeTensors> files;
  std::vector<std::vector<std::string>> losses;
  for (const bool async : {true, false}) {
    auto c = tiny_config(dir.path + (async ? "/async" : "/sync"));
    c.checkpoint_async = async;
    c.checkpoint_interval = 3;
    c.max_iters = 14;
    train::Trainer(c, true).run();
    files.push_back(io::read_safetensors(c.out_dir + "/" + train::kLastCheckpoint, "ckpt"));
    losses.push_back(train_losses(c.out_dir + "/metrics.csv"));
    const std::string log = read_text(c.out_dir + "/train.log");
    // Saves at 3, 6, 9, 12, at the evaluations 10 and 14 (with ckpt_best): 8 files written.
    int saved = 0;
    for (size_t at = log.find("[ckpt] saved"); at != std::string::npos; at = log.find("[ckpt] saved", at + 1)) ++saved;
    EXPECT_EQ(saved, 8) << log;
    EXPECT_EQ(log.find("in the background") != std::string::npos, async) << log;
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(files[0].tensors.size(), files[1].tensors.size());
  for (size_t i = 0; i < files[0].tensors.size(); ++i) {
    EXPECT_EQ(files[0].tensors[i].first, files[1].tensors[i].first);
    EXPECT_TRUE(torch::equal(files[0].tensors[i].second, files[1].tensors[i].second)) << files[0].tensors[i].first;
  }
  for (const auto& [key, value] : files[0].metadata)
    if (key != "config_yaml" && key != "run_id") {  // (each run has its own id)
      EXPECT_EQ(value, files[1].metadata.at(key)) << key;
    }
}

// kill -9 in the middle of a background write: each write pauses 1.5 s half-way (a test setting),
// the run is killed once the write of iter 20's checkpoint is half on disk and training has gone on
// past iter 20 (so the write really is off the training thread). ckpt_last is then iter 10's, whole
// and loadable, beside the half-written temporary file; the resumed run's losses are those of a run
// that was never interrupted, bit for bit.
TEST(CheckpointKill, AKillMidBackgroundWriteLeavesTheLastCheckpointAndResumeIsExact) {
  TempDir dir("ckpt_kill_mid_write");
  auto c = tiny_config(dir.path);
  c.max_iters = 40;
  c.lr_decay_iters = 40;
  c.checkpoint_async = true;
  const std::string config = dir.path + "/tiny.yaml";
  std::ofstream(config) << train::to_yaml(c);
  auto whole = start({NANOGPT_BINARY, "train", config, "--out_dir=" + dir.path + "/whole"}, {}, dir.path + "/whole");
  ASSERT_EQ(wait_for(whole), 0) << read_text(whole.err);

  const std::string out = dir.path + "/cut", last = out + "/" + train::kLastCheckpoint;
  auto cut = start({NANOGPT_BINARY, "train", config, "--out_dir=" + out}, {"NANOGPT_TEST_CKPT_PAUSE_MS=1500"}, dir.path + "/cut");
  // iter 10's job writes ckpt_last then ckpt_best (1.5 s each) while training goes on to iter 20
  // and waits; iter 20's job then starts on ckpt_last while training goes on past 20.
  std::string temp;
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline) {
    if (fs::exists(out + "/" + train::kBestCheckpoint) && last_train_iter(out + "/metrics.csv") > 20) {
      temp = temp_file_of(last);
      if (!temp.empty()) break;
    }
    int status = 0;
    ASSERT_EQ(::waitpid(cut.pid, &status, WNOHANG), 0) << "the run ended before its kill: " << read_text(cut.err);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_FALSE(temp.empty()) << "no background write of iter 20 seen while training went on past it\n"
                             << read_text(out + "/train.log");
  ::kill(cut.pid, SIGKILL);
  EXPECT_EQ(wait_for(cut), 128 + SIGKILL);

  // The kill came mid-write: a partial temporary file beside the previous, complete checkpoint.
  ASSERT_TRUE(fs::exists(temp)) << temp;
  EXPECT_LT(fs::file_size(temp), fs::file_size(last));
  const auto meta = train::read_checkpoint_meta(last);
  EXPECT_EQ(meta.iter, 10);
  EXPECT_NO_THROW(train::load_model(last));
  EXPECT_NO_THROW(train::load_model(out + "/" + train::kBestCheckpoint));

  auto resumed = start({NANOGPT_BINARY, "train", config, "--out_dir=" + out, "--init_from=resume"}, {}, dir.path + "/resumed");
  ASSERT_EQ(wait_for(resumed), 0) << read_text(resumed.err);
  EXPECT_NE(read_text(resumed.out).find("[ckpt] resumed from " + last + " at iter 10"), std::string::npos) << read_text(resumed.out);
  // The killed save's temporary file is gone: kills and restarts leave none to pile up.
  EXPECT_FALSE(fs::exists(temp)) << temp;
  EXPECT_NE(read_text(resumed.out).find("temporary file"), std::string::npos) << read_text(resumed.out);
  const auto expected = train_losses(dir.path + "/whole/metrics.csv");
  ASSERT_EQ(expected.size(), 40u);
  EXPECT_EQ(train_losses(out + "/metrics.csv"), expected);
}

// The crash-safety script (kill -9 at random moments, Ctrl-C, SIGTERM, a full disk) with background
// saves every 2 iterations, so that many kills land while a save is being written.
TEST(CheckpointKill, KillResumeScriptPasses) {
  if (std::system("command -v awk >/dev/null 2>&1") != 0) GTEST_SKIP() << "no awk";
  TempDir dir("ckpt_kill_script");
  const std::string command = "TMPDIR=" + dir.path + " CHECKPOINT_INTERVAL=2 SEED=47 " + NANOGPT_SOURCE_DIR +
                              "/scripts/kill_resume.sh " + NANOGPT_BINARY + " 8 > " + dir.path + "/script.out 2>&1";
  const int rc = std::system(command.c_str());
  EXPECT_EQ(rc, 0) << read_text(dir.path + "/script.out");
}
