// Shared by the training tests: a tiny dataset and config in a fresh temporary folder.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "train/config.h"

namespace nanogpt::testing {

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A fresh folder under the system temp dir, removed at destruction.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& name) {
    path = (std::filesystem::temp_directory_path() / ("nanogpt_test_" + name + "_" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

/// A tiny model for step-level tests: 2 layers, 2 heads, 32 wide, block 16, vocab 11, no dropout.
inline model::ModelConfig tiny_model_config() {
  model::ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.dropout = 0.0;
  return c;
}

/// The first `chars` bytes of tiny Shakespeare as dir/data/input.txt, and a tiny model config.
inline train::TrainConfig tiny_config(const std::string& dir, size_t chars = 20000) {
  std::filesystem::create_directories(dir + "/data");
  const std::string text = read_text(std::string(NANOGPT_SOURCE_DIR) + "/data/shakespeare_char/input.txt").substr(0, chars);
  std::ofstream(dir + "/data/input.txt", std::ios::binary) << text;
  train::TrainConfig c;
  c.out_dir = dir + "/out";
  c.dataset = dir + "/data";
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.model.block_size = 16;
  c.batch_size = 4;
  c.model.dropout = 0.1;  // exercises the dropout RNG across resume
  c.max_iters = 20;
  c.eval_interval = 10;
  c.eval_iters = 2;
  c.log_interval = 1;
  c.learning_rate = 3e-3;
  c.warmup_iters = 5;
  c.lr_decay_iters = 20;
  c.min_lr = 3e-4;
  c.device = "cpu";
  c.dtype = "float32";
  c.num_threads = 1;
  c.plot = false;
  return c;
}

/// The first whole lines within `bytes` bytes of the Tang poems.
inline std::string tang_poems_head(size_t bytes) {
  const std::string poems = read_text(std::string(NANOGPT_SOURCE_DIR) + "/data/tang_poems/input.txt").substr(0, bytes);
  return poems.substr(0, poems.rfind('\n') + 1);
}

/// `text` as dir/data/input.txt, and the tiny model config training on it into dir/out.
inline train::TrainConfig tiny_config_on(const std::string& dir, const std::string& text) {
  auto c = tiny_config(dir + "/cfg");
  std::filesystem::create_directories(dir + "/data");
  std::ofstream(dir + "/data/input.txt", std::ios::binary) << text;
  c.dataset = dir + "/data";
  c.out_dir = dir + "/out";
  return c;
}

/// Every row of a metrics.csv as (iter, split, loss text), in order.
struct MetricsRow {
  int64_t iter;
  std::string split, loss;
};
inline std::vector<MetricsRow> metrics_rows(const std::string& metrics_csv) {
  std::vector<MetricsRow> rows;
  std::istringstream in(read_text(metrics_csv));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "iter,split,loss,lr,ms,tokens_per_sec");
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string iter, split, loss;
    std::getline(f, iter, ',');
    std::getline(f, split, ',');
    std::getline(f, loss, ',');
    if (iter.empty()) continue;
    rows.push_back({std::stoll(iter), split, loss});
  }
  return rows;
}

/// (iter, loss) text of every `train` row of a metrics.csv, in order.
inline std::vector<std::string> train_losses(const std::string& metrics_csv) {
  std::vector<std::string> rows;
  for (const auto& r : metrics_rows(metrics_csv))
    if (r.split == "train") rows.push_back(std::to_string(r.iter) + ":" + r.loss);
  return rows;
}

}  // namespace nanogpt::testing
