// The bpe tokenizer through the nanogpt program: prepare -> train -> sample, with the tokenizer
// travelling inside the checkpoint; the eval line's bits per character against an independent count;
// attention's axes show the pieces; what cannot hold a bpe tokenizer refuses in one line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "data/utf8.h"
#include "train/checkpoint.h"
#include "train_fixture.h"

using namespace nanogpt;
using namespace nanogpt::testing;
namespace fs = std::filesystem;

namespace {

struct Outcome {
  int rc = -1;
  std::string out, err;
};

Outcome run(const std::string& args, const std::string& cwd) {
  const std::string out = cwd + "/stdout", err = cwd + "/stderr";
  const std::string cmd =
      "cd '" + cwd + "' && " + std::string(NANOGPT_BINARY) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  Outcome r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

uint64_t header_count(const std::string& token_file) {  // the token count in a token file's header
  const std::string bytes = read_text(token_file);
  uint64_t count = 0;
  for (int i = 7; i >= 0; --i) count = (count << 8) | static_cast<unsigned char>(bytes.at(16 + static_cast<size_t>(i)));
  return count;
}

// A folder with data/input.txt (tiny Shakespeare), data/bpe prepared from it, and tiny.yaml training on data/bpe.
struct BpeRun {
  TempDir dir{"tokenizer"};
  train::TrainConfig config = tiny_config(dir.path, 30000);
  Outcome prepare, train;
  BpeRun() {
    prepare = run("prepare --input data/input.txt --out_dir data/bpe --tokenizer=bpe --vocab_size=320", dir.path);
    config.dataset = "data/bpe";
    config.out_dir = "out";
    config.max_iters = 6;
    config.eval_interval = 3;
    std::ofstream(dir.path + "/tiny.yaml") << train::to_yaml(config);
    if (prepare.rc == 0) train = run("train tiny.yaml", dir.path);
  }
};

}  // namespace

TEST(Tokenizer, BpePreparesTrainsAndReportsBitsPerCharacter) {
  BpeRun r;
  ASSERT_EQ(r.prepare.rc, 0) << r.prepare.err;
  EXPECT_NE(r.prepare.out.find("tokenizer=bpe"), std::string::npos) << r.prepare.out;
  ASSERT_EQ(r.train.rc, 0) << r.train.err;

  // Independently: the val split's characters (the last 10% of the code points) and its tokens (val.bin's header).
  const auto n = static_cast<int64_t>(data::decode_utf8(read_text(r.dir.path + "/data/input.txt")).size());
  const int64_t val_chars = n - static_cast<int64_t>(static_cast<double>(n) * 0.9);
  const auto val_tokens = static_cast<double>(header_count(r.dir.path + "/data/bpe/val.bin"));
  EXPECT_LT(val_tokens, val_chars);  // subwords

  const std::string log = read_text(r.dir.path + "/out/train.log");
  const std::regex eval(R"(\[eval\] iter (\d+) \| train ([0-9.]+) \| val ([0-9.]+) \| val bits/char ([0-9.]+))");
  int lines = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), eval); it != std::sregex_iterator(); ++it, ++lines) {
    const double val = std::stod((*it)[3]), bpc = std::stod((*it)[4]);
    EXPECT_NEAR(bpc, val * val_tokens / static_cast<double>(val_chars) / std::log(2.0), 2e-4 * bpc) << (*it)[0];
  }
  EXPECT_GE(lines, 2) << log;
}

TEST(Tokenizer, TheCheckpointCarriesTheTokenizer) {
  BpeRun r;
  ASSERT_EQ(r.train.rc, 0) << r.prepare.err << r.train.err;
  // Sample from a copy of the checkpoint in a folder with no dataset at all.
  fs::create_directories(r.dir.path + "/elsewhere");
  fs::copy_file(r.dir.path + "/out/ckpt_last.safetensors", r.dir.path + "/elsewhere/model.safetensors");
  fs::remove_all(r.dir.path + "/data");
  const train::CheckpointMeta meta = train::read_checkpoint_meta(r.dir.path + "/elsewhere/model.safetensors");
  ASSERT_EQ(meta.vocab.kind(), data::TokenizerKind::Bpe);
  EXPECT_EQ(meta.vocab.requested_vocab_size(), 320);

  // 月 and the emoji: the first is rare or absent in Shakespeare, the second surely absent: byte fallback.
  const std::string prompt = "ROMEO:\n月 \xF0\x9F\x99\x82";
  const Outcome sample = run("sample --ckpt elsewhere/model.safetensors --device=cpu --max_new_tokens=30 --num_samples=1 --start='" +
                             prompt + "'",
                         r.dir.path);
  ASSERT_EQ(sample.rc, 0) << sample.err;
  EXPECT_EQ(sample.out.rfind(prompt, 0), 0u) << sample.out;
  EXPECT_GT(sample.out.size(), prompt.size() + 16);
  EXPECT_EQ(data::replace_invalid_utf8(sample.out), sample.out);  // whole characters only

  // attention: one axis label per piece of the prompt, as the tokenizer cuts it.
  const std::string text = "Before we proceed";  // fewer pieces than block_size (16): the whole prompt is drawn
  const Outcome attention =
      run("attention --ckpt elsewhere/model.safetensors --device=cpu --layer=0 --no_heatmap --html=page.html --csv=att.csv "
          "--start='" + text + "'",
          r.dir.path);
  ASSERT_EQ(attention.rc, 0) << attention.err;
  const std::string csv = read_text(r.dir.path + "/att.csv");
  const auto ids = meta.vocab.encode(text);
  ASSERT_LT(ids.size(), data::decode_utf8(text).size());  // fewer pieces than characters
  ASSERT_LE(static_cast<int64_t>(ids.size()), r.config.model.block_size);
  std::string last_row_tokens;
  for (size_t j = 0; j < ids.size(); ++j) {
    std::string label = meta.vocab.piece(ids[j]);
    if (label == "\n") label = "\\n";
    last_row_tokens += "\"" + label + "\"";
  }
  // The row of the last query position names each key's piece in order.
  std::string keys;
  const std::string row_prefix = "0,0," + std::to_string(ids.size() - 1) + ",";
  for (size_t pos = csv.find(row_prefix); pos != std::string::npos; pos = csv.find(row_prefix, pos + 1)) {
    if (pos != 0 && csv[pos - 1] != '\n') continue;
    const std::string row = csv.substr(pos, csv.find('\n', pos) - pos);
    const size_t a = row.find(",\"", row_prefix.size() - 1) + 1;       // the query's label
    const size_t b = row.find(",\"", a + 1) + 1;                       // the key's label
    keys += row.substr(b, row.rfind(',') - b);
  }
  EXPECT_EQ(keys, last_row_tokens) << row_prefix << "\n" << csv.substr(0, 300);
}

TEST(Tokenizer, WhatCannotHoldBpeRefusesInOneLine) {
  BpeRun r;
  ASSERT_EQ(r.train.rc, 0) << r.prepare.err << r.train.err;
  for (const char* format : {"nanogpt", "hf"}) {
    const Outcome e = run(std::string("export --out_dir out --format=") + format + " --out=exported_" + format, r.dir.path);
    EXPECT_NE(e.rc, 0) << format;
    EXPECT_NE(e.err.find("needs a character vocabulary, but this one is bpe"), std::string::npos) << e.err;
    EXPECT_NE(e.err.find("--format=safetensors"), std::string::npos) << e.err;
    EXPECT_EQ(std::count(e.err.begin(), e.err.end(), '\n'), 1) << e.err;
    EXPECT_FALSE(fs::exists(r.dir.path + "/exported_" + format)) << format;
  }
  const Outcome st = run("export --out_dir out --out=model.safetensors", r.dir.path);
  EXPECT_EQ(st.rc, 0) << st.err;

  const Outcome bad = run("train tiny.yaml --tokenizer=char --vocab_size=300", r.dir.path);
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("vocab_size (300)"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  // A prepared folder without input.txt cannot become another tokenizer: said, not ignored.
  const Outcome other = run("train tiny.yaml --tokenizer=bpe --vocab_size=400", r.dir.path);
  EXPECT_NE(other.rc, 0);
  EXPECT_NE(other.err.find("not bpe with vocab_size 400"), std::string::npos) << other.err;
  EXPECT_EQ(std::count(other.err.begin(), other.err.end(), '\n'), 1) << other.err;
  const Outcome small = run("prepare --input data/input.txt --out_dir data/small --tokenizer=bpe --vocab_size=50", r.dir.path);
  EXPECT_NE(small.rc, 0);
  EXPECT_NE(small.err.find("vocab_size (50) is too small"), std::string::npos) << small.err;
  EXPECT_EQ(std::count(small.err.begin(), small.err.end(), '\n'), 1) << small.err;
}
