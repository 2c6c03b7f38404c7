// The scripts a new user runs first, with tiny overrides: each runs to the end and does what its
// comment says. They run the program under test (NANOGPT_BIN), not whatever build/ holds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "shell.h"
#include "train_fixture.h"

using namespace nanogpt::testing;
namespace fs = std::filesystem;

namespace {

struct Logged {
  int rc = -1;
  std::string log;
};

// `script args` from the source tree, with the program under test; stdout and stderr together.
Logged script(const std::string& line, const std::string& tmp) {
  const std::string log = tmp + "/log";
  const std::string cmd = "cd " + std::string(NANOGPT_SOURCE_DIR) + " && NANOGPT_BIN=" + NANOGPT_BINARY +
                          " OMP_NUM_THREADS=1 " + line + " >" + log + " 2>&1 </dev/null";
  Logged r;
  r.rc = shell(cmd);
  r.log = read_text(log);
  return r;
}

std::string torchrun() {  // what scripts/env.sh exports as NANOGPT_TORCHRUN
  TempDir dir("scripts_env");
  const Logged r = script("bash -c 'source scripts/env.sh && printf %s \"$NANOGPT_TORCHRUN\"'", dir.path);
  return r.rc == 0 ? r.log : "";
}

// Tiny, fast overrides of the CPU preset.
const std::string kTiny = " --max_iters=2 --eval_iters=1 --eval_interval=1000 --n_layer=1 --n_embd=32 --n_head=2 "
                          "--block_size=16 --batch_size=2 --num_threads=1 --plot=false";

}  // namespace

// The script's own example, with the preset's gradient_accumulation_steps (1) and 2 processes: the
// script makes it a multiple of the processes and says so, and the run trains and saves.
TEST(Scripts, TrainDdpRunsItsOwnExample) {
  const std::string run = torchrun();
  if (run.empty() || !fs::exists(run)) GTEST_SKIP() << "no torchrun in the project's environment (scripts/setup.sh)";
  TempDir dir("scripts_ddp");
  tiny_config(dir.path);  // dir/data/input.txt: the first 20,000 characters of tiny Shakespeare
  const Logged r = script("NPROC=2 scripts/train_ddp.sh configs/shakespeare_char_cpu.yaml --dataset=" + dir.path +
                           "/data --out_dir=" + dir.path + "/out" + kTiny,
                       dir.path);
  ASSERT_EQ(r.rc, 0) << r.log;
  EXPECT_NE(r.log.find("gradient_accumulation_steps 1 -> 2"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find(run), std::string::npos) << "the script names the torchrun it runs: " << r.log;
  EXPECT_TRUE(fs::exists(dir.path + "/out/ckpt_last.safetensors")) << r.log;
}

// --out_dir=X is honoured to the end: the model is trained into X and the samples come from X.
TEST(Scripts, TrainShakespeareSamplesFromItsOutDir) {
  TempDir dir("scripts_shakespeare");
  const std::string out = dir.path + "/mine";
  const Logged r = script("scripts/train_shakespeare.sh --out_dir=" + out + kTiny, dir.path);
  ASSERT_EQ(r.rc, 0) << r.log;
  EXPECT_TRUE(fs::exists(out + "/ckpt_last.safetensors")) << r.log;
  EXPECT_NE(r.log.find("[train_shakespeare] samples from " + out), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("[sample] 1500 tokens"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("[train_shakespeare] program: " + std::string(NANOGPT_BINARY)), std::string::npos) << r.log;
}
