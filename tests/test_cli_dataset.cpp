// Your own corpus through the nanogpt program: prepare from files and folders, then train on the
// prepared folder (no input.txt needed) by path or by name, with the same losses as the on-demand path.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "shell.h"
#include "train_fixture.h"

using namespace nanogpt::testing;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> losses(const std::string& metrics_csv) {
  std::vector<std::string> out;
  for (const auto& row : metrics_rows(metrics_csv)) out.push_back(std::to_string(row.iter) + row.split + row.loss);
  return out;
}

}  // namespace

TEST(CliDataset, APreparedFolderTrainsByPathAndByName) {
  TempDir dir("cli_dataset");
  auto c = tiny_config(dir.path);
  c.max_iters = 6;
  c.eval_interval = 3;
  std::ofstream(dir.path + "/tiny.yaml") << nanogpt::train::to_yaml(c);
  const std::string text = read_text(c.dataset + "/input.txt");

  // The reference: input.txt prepared on demand.
  auto a = run_nanogpt("train tiny.yaml --out_dir=out_a", dir.path, dir.path);
  ASSERT_EQ(a.rc, 0) << a.err;

  // The same text as two files in a folder, joined without a separator, into data/mine.
  fs::create_directories(dir.path + "/corpus/part");
  std::ofstream(dir.path + "/corpus/1.txt", std::ios::binary) << text.substr(0, 7000);
  std::ofstream(dir.path + "/corpus/part/2.txt", std::ios::binary) << text.substr(7000);
  auto p = run_nanogpt("prepare --input corpus --out_dir data/mine --separator ''", dir.path, dir.path);
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_FALSE(fs::exists(dir.path + "/data/mine/input.txt"));

  auto by_path = run_nanogpt("train tiny.yaml --out_dir=out_b --dataset=data/mine", dir.path, dir.path);
  ASSERT_EQ(by_path.rc, 0) << by_path.err;
  auto by_name = run_nanogpt("train tiny.yaml --out_dir=out_c --dataset=mine --verify_data=true", dir.path, dir.path);
  ASSERT_EQ(by_name.rc, 0) << by_name.err;
  EXPECT_NE(by_name.out.find("every token of train.bin and val.bin checked"), std::string::npos) << by_name.out;
  const auto reference = losses(dir.path + "/out_a/metrics.csv");
  EXPECT_GE(reference.size(), 6u);
  EXPECT_EQ(losses(dir.path + "/out_b/metrics.csv"), reference);
  EXPECT_EQ(losses(dir.path + "/out_c/metrics.csv"), reference);

  auto missing = run_nanogpt("train tiny.yaml --dataset=nothing_here", dir.path, dir.path);
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find("data/nothing_here"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("nanogpt prepare"), std::string::npos) << missing.err;
}

TEST(CliDataset, InvalidUtf8IsOneLineOrReplaced) {
  TempDir dir("cli_dataset_utf8");
  std::ofstream(dir.path + "/a.txt", std::ios::binary) << "some good text to start with\n";
  std::ofstream(dir.path + "/b.txt", std::ios::binary) << "then a bad byte \xFF here, and more text after it\n";
  auto strict = run_nanogpt("prepare --input a.txt b.txt --out_dir out", dir.path, dir.path);
  EXPECT_NE(strict.rc, 0);
  EXPECT_EQ(std::count(strict.err.begin(), strict.err.end(), '\n'), 1) << strict.err;
  EXPECT_NE(strict.err.find("'b.txt': invalid UTF-8 at byte offset 16"), std::string::npos) << strict.err;
  EXPECT_FALSE(fs::exists(dir.path + "/out/meta.bin"));
  auto replaced = run_nanogpt("prepare --input a.txt b.txt --out_dir out --errors=replace", dir.path, dir.path);
  ASSERT_EQ(replaced.rc, 0) << replaced.err;
  EXPECT_NE(replaced.err.find("replaced 1 invalid UTF-8 sequences"), std::string::npos) << replaced.err;
  EXPECT_EQ(replaced.out.rfind("[data] vocab_size=", 0), 0u) << replaced.out;
}
