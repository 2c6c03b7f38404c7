// Dataset preparation, token files, meta files: nanoGPT's split sizes, exact round trips, and a
// clear error (with nothing half-written) for every kind of bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <stdexcept>

#include "io/atomic_file.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data/utf8.h"
#include "test_files.h"

using namespace nanogpt::data;
using namespace nanogpt::io;
namespace fs = std::filesystem;

using nanogpt::testing::error_of;

namespace {

const std::string kShakespeare = std::string(NANOGPT_SOURCE_DIR) + "/data/shakespeare_char/input.txt";

using nanogpt::testing::ScratchDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::vector<int64_t> to_ids(const torch::Tensor& t) {
  auto l = t.to(torch::kInt64);
  return std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
}

std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) names.insert(entry.path().filename().string());
  return names;
}

// Patches bytes [offset, offset + bytes.size()) of a file.
void patch(const std::string& path, size_t offset, const std::string& bytes) {
  std::string content = read_file(path);
  content.replace(offset, bytes.size(), bytes);
  write_text(path, content);
}

}  // namespace

TEST(Prepare, ShakespeareSplitMatchesNanoGpt) {
  ScratchDir dir;
  const DatasetMeta meta = prepare_dataset({kShakespeare, dir.path.string()});
  EXPECT_EQ(summary_line(meta), "[data] vocab_size=65 train_tokens=1003854 val_tokens=111540");

  // Independent reference: the file is ASCII, so the vocabulary is its set of bytes.
  const std::string text = read_file(kShakespeare);
  const std::set<char> bytes(text.begin(), text.end());
  EXPECT_EQ(encode_utf8(meta.vocab.chars()), std::string(bytes.begin(), bytes.end()));

  const auto train = read_token_file(dir / "train.bin", meta.vocab.size());
  const auto val = read_token_file(dir / "val.bin", meta.vocab.size());
  EXPECT_EQ(train.scalar_type(), torch::kInt32);
  EXPECT_EQ(train.numel(), 1003854);
  EXPECT_EQ(val.numel(), 111540);
  EXPECT_EQ(meta.vocab.decode(to_ids(train)) + meta.vocab.decode(to_ids(val)), text);  // lossless
  EXPECT_EQ(fs::file_size(dir / "train.bin"), 24u + 2u * 1003854u);                   // uint16 tokens
}

TEST(Prepare, SplitsByCharactersNotBytes) {
  ScratchDir dir;
  const std::string text = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。𠀀\n";  // 26 characters, 76 bytes
  write_text(dir / "poem.txt", text);
  const DatasetMeta meta = prepare_dataset({dir / "poem.txt", dir / "out"});
  EXPECT_EQ(meta.train_tokens, 23);  // int(26 * 0.9)
  EXPECT_EQ(meta.val_tokens, 3);
  const std::u32string chars = decode_utf8(text);
  EXPECT_EQ(meta.vocab.decode(to_ids(read_token_file(dir / "out/train.bin", meta.vocab.size()))), encode_utf8(chars.substr(0, 23)));
  EXPECT_EQ(meta.vocab.decode(to_ids(read_token_file(dir / "out/val.bin", meta.vocab.size()))), "。𠀀\n");
  EXPECT_EQ(meta.input_bytes, text.size());
}

TEST(Prepare, TangPoemsHave7443Characters) {
  ScratchDir dir;
  const DatasetMeta meta = prepare_dataset({std::string(NANOGPT_SOURCE_DIR) + "/data/tang_poems/input.txt", dir.path});
  EXPECT_EQ(meta.vocab.size(), 7443);
  EXPECT_EQ(meta.train_tokens + meta.val_tokens, 2469433);  // characters, per data/tang_poems/SOURCE.md
  EXPECT_EQ(meta.train_tokens, 2222489);
}

TEST(TokenFile, RoundTripsWithTwoByteTokens) {
  ScratchDir dir;
  const std::vector<int64_t> tokens = {0, 1, 65535, 300, 7442};
  write_token_file(dir / "t.bin", tokens, 65536);
  const std::string bytes = read_file(dir / "t.bin");
  ASSERT_EQ(bytes.size(), 24u + 2 * tokens.size());
  EXPECT_EQ(bytes.substr(0, 8), std::string("NGPTTOK\0", 8));
  EXPECT_EQ(bytes.substr(8, 8), std::string("\x01\0\0\0\x02\0\0\0", 8));  // version 1, width 2
  EXPECT_EQ(bytes.substr(16, 8), std::string("\x05\0\0\0\0\0\0\0", 8));   // count 5
  EXPECT_EQ(bytes.substr(24 + 3 * 2, 2), "\x2C\x01");                     // tokens[3] = 300, little-endian
  const auto back = read_token_file(dir / "t.bin", 65536);
  EXPECT_EQ(back.scalar_type(), torch::kInt32);
  EXPECT_EQ(to_ids(back), tokens);
}

TEST(TokenFile, RoundTripsWithFourByteTokens) {
  ScratchDir dir;
  const std::vector<int64_t> tokens = {0, 65536, 69999, 12};
  write_token_file(dir / "t.bin", tokens, 70000);
  EXPECT_EQ(fs::file_size(dir / "t.bin"), 24u + 4 * tokens.size());
  EXPECT_EQ(read_file(dir / "t.bin").substr(12, 4), std::string("\x04\0\0\0", 4));
  EXPECT_EQ(to_ids(read_token_file(dir / "t.bin", 70000)), tokens);
  write_token_file(dir / "empty.bin", {}, 70000);
  EXPECT_EQ(read_token_file(dir / "empty.bin", 70000).numel(), 0);
}

TEST(TokenFile, CorruptionIsDetected) {
  ScratchDir dir;
  const std::string path = dir / "t.bin";
  const auto expect_error = [&](const std::string& what) {
    const std::string msg = error_of([&] { read_token_file(path, 10); });
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  };
  const auto fresh = [&] { write_token_file(path, {1, 2, 3, 4}, 10); };

  fresh();
  patch(path, 0, "XGPT");
  expect_error("wrong magic");
  fresh();
  patch(path, 8, std::string("\x02\0\0\0", 4));
  expect_error("unsupported token file version 2");
  fresh();
  patch(path, 12, std::string("\x03\0\0\0", 4));
  expect_error("invalid token width 3");
  fresh();
  write_text(path, read_file(path).substr(0, 24 + 6));  // a token short
  expect_error("truncated or corrupt");
  fresh();
  write_text(path, read_file(path) + "x");  // a byte too many
  expect_error("truncated or corrupt");
  fresh();
  patch(path, 16, std::string("\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF", 8));  // absurd count, no overflow
  expect_error("truncated or corrupt");
  write_text(path, "NGPT");
  expect_error("shorter than the 24-byte");
  write_text(path, "");
  expect_error("empty");
  EXPECT_NE(error_of([&] { read_token_file(dir / "missing.bin", 10); }).find("No such file"), std::string::npos);
}

// A token file from another dataset (or a stale one beside a new meta.bin) holds ids the vocabulary
// lacks: one line naming the file, the id and the vocabulary size, not an index error at the first step.
TEST(TokenFile, ReadRefusesTokensOutsideTheVocabulary) {
  ScratchDir dir;
  const std::string path = dir / "train.bin";
  write_token_file(path, {0, 64, 70, 3}, 100);
  EXPECT_EQ(to_ids(read_token_file(path, 71)), (std::vector<int64_t>{0, 64, 70, 3}));
  const std::string msg = error_of([&] { read_token_file(path, 65); });
  EXPECT_EQ(msg.rfind("[data] '" + path + "': token 70 at index 2 is outside the vocabulary (vocab_size 65)", 0), 0u) << msg;
  EXPECT_NE(msg.find("re-run `nanogpt prepare`"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  write_token_file(path, {65535}, 65536);  // the largest two-byte id
  EXPECT_NE(error_of([&] { read_token_file(path, 65535); }).find("token 65535 at index 0"), std::string::npos);
}

TEST(TokenFile, WriteRejectsTokensOutsideTheVocabularyAndLeavesNoFile) {
  ScratchDir dir;
  EXPECT_THROW(write_token_file(dir / "t.bin", {0, 10}, 10), std::runtime_error);
  EXPECT_THROW(write_token_file(dir / "t.bin", {-1}, 10), std::runtime_error);
  EXPECT_TRUE(listing(dir.path.string()).empty());
}

TEST(AtomicFile, FailedWriteLeavesTheOldFileAndNoTemporary) {
  ScratchDir dir;
  write_bytes_atomically(dir / "f", "old");
  const std::string msg = error_of([&] {
    write_file_atomically(dir / "f", [](const std::string& tmp) {
      write_text(tmp, "half");
      throw std::runtime_error("disk full");
    });
  });
  EXPECT_NE(msg.find("[data] cannot write '" + (dir / "f") + "': disk full"), std::string::npos) << msg;
  EXPECT_EQ(read_file(dir / "f"), "old");
  EXPECT_EQ(listing(dir.path.string()), std::set<std::string>{"f"});
  write_bytes_atomically(dir / "f", "new");
  EXPECT_EQ(read_file(dir / "f"), "new");
  EXPECT_THROW(write_bytes_atomically(dir / "no/such/dir/f", "x"), std::runtime_error);
  EXPECT_NE(error_of([&] { read_file(dir.path.string()); }).find("is a directory"), std::string::npos);
}

TEST(Meta, RoundTrips) {
  ScratchDir dir;
  write_text(dir / "in.txt", "hello, 世界 𠀀\nhello again\n");
  const DatasetMeta written = prepare_dataset({dir / "in.txt", dir / "out", 0.25});
  const DatasetMeta read = read_meta(dir / "out");
  EXPECT_EQ(read.vocab, written.vocab);
  EXPECT_EQ(read.train_tokens, written.train_tokens);
  EXPECT_EQ(read.val_tokens, written.val_tokens);
  EXPECT_EQ(read.input_bytes, fs::file_size(dir / "in.txt"));
  EXPECT_EQ(read.input_hash, checksum_of(read_file(dir / "in.txt")));
  EXPECT_EQ(read.train_checksum, checksum_of(read_file(dir / "out/train.bin").substr(24)));
  EXPECT_EQ(read.val_checksum, checksum_of(read_file(dir / "out/val.bin").substr(24)));
  EXPECT_EQ(read.version, 3u);
  EXPECT_EQ(read.val_fraction, 0.25);
  EXPECT_EQ(read.train_chars, read.train_tokens);  // char: a token per character
  EXPECT_EQ(read.val_chars, read.val_tokens);
  EXPECT_EQ(read.train_chars + read.val_chars, 24);  // hello, 世界 𠀀 = 12 characters with the newline, twice
}

TEST(Meta, CorruptionIsDetected) {
  ScratchDir dir;
  write_text(dir / "in.txt", "abcdefghijklmnopqrstuvwxyz");
  prepare_dataset({dir / "in.txt", dir.path});
  const std::string meta = dir / "meta.bin";
  const std::string good = read_file(meta);
  patch(meta, 0, "X");
  EXPECT_NE(error_of([&] { read_meta(dir.path); }).find("wrong magic"), std::string::npos);
  write_text(meta, good);
  patch(meta, 8, "\x07");
  EXPECT_NE(error_of([&] { read_meta(dir.path); }).find("version 7"), std::string::npos);
  for (size_t len : {size_t{0}, size_t{10}, good.size() - 1}) {
    write_text(meta, good.substr(0, len));
    EXPECT_THROW(read_meta(dir.path), std::runtime_error) << "truncated to " << len;
  }
  write_text(meta, good + "x");
  EXPECT_THROW(read_meta(dir.path), std::runtime_error);
  fs::remove(meta);
  EXPECT_THROW(read_meta(dir.path), std::runtime_error);
}

TEST(Fnv1a64, MatchesPublishedVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(EnsurePrepared, PreparesOnlyWhenTheInputChanges) {
  ScratchDir dir;
  const std::string input = dir / "in.txt", out = dir / "out";
  write_text(input, "the quick brown fox jumps over the lazy dog");
  bool prepared = false;
  ensure_prepared({input, out}, &prepared);
  EXPECT_TRUE(prepared);
  ensure_prepared({input, out}, &prepared);
  EXPECT_FALSE(prepared);
  EXPECT_TRUE(is_prepared(input, out));

  write_text(input, "THE quick brown fox jumps over the lazy dog");  // same size, new content
  EXPECT_FALSE(is_prepared(input, out));
  DatasetMeta meta = ensure_prepared({input, out}, &prepared);
  EXPECT_TRUE(prepared);
  EXPECT_TRUE(meta.vocab.contains(U'T'));
  EXPECT_EQ(read_meta(out).vocab, meta.vocab);

  write_text(input, "a longer text: the quick brown fox jumps over the lazy dog");
  ensure_prepared({input, out}, &prepared);
  EXPECT_TRUE(prepared);

  ensure_prepared({input, out, 0.2}, &prepared);  // another val_fraction
  EXPECT_TRUE(prepared);
  EXPECT_FALSE(is_prepared(input, out, 0.1));

  fs::remove(out + "/val.bin");  // a missing token file
  ensure_prepared({input, out, 0.2}, &prepared);
  EXPECT_TRUE(prepared);
  write_text(out + "/train.bin", "truncated");
  ensure_prepared({input, out, 0.2}, &prepared);
  EXPECT_TRUE(prepared);

  // Already prepared, but too short for the requested window: an error, not a silent pass.
  EXPECT_THROW(ensure_prepared({input, out, 0.2, 1000}), std::runtime_error);
}

TEST(PrepareErrors, EachBadInputIsAClearErrorAndWritesNothing) {
  ScratchDir dir;
  const std::string out = dir / "out";
  const auto expect_error = [&](const PrepareOptions& options, const std::string& what) {
    const std::string msg = error_of([&] { prepare_dataset(options); });
    EXPECT_EQ(msg.rfind("[data] ", 0), 0u) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_TRUE(listing(out).empty()) << "after: " << msg;
  };
  expect_error({dir / "missing.txt", out}, "does not exist");
  fs::create_directories(dir / "no_files/.hidden");
  write_text(dir / "no_files/.hidden/notes.txt", "hidden files are not read");
  expect_error({dir / "no_files", out}, "is a directory without files");
  write_text(dir / "empty.txt", "");
  expect_error({dir / "empty.txt", out}, "is empty");
  write_text(dir / "short.txt", "abcdefghij");  // splits of 9 and 1 characters
  expect_error({dir / "short.txt", out, 0.1, 2}, "val split has 1 tokens, fewer than the 2");
  expect_error({dir / "short.txt", out, 0.5, 6}, "train split has 5 tokens");
  write_text(dir / "bad.txt", "good text, then \xC3\x28 bad");
  expect_error({dir / "bad.txt", out}, "invalid UTF-8 at byte offset 16");
  expect_error({dir / "short.txt", out, 1.5}, "val_fraction");

  write_text(dir / "good.txt", "abcdefghijklmnopqrstuvwxyz");
  write_text(dir / "a_file", "x");
  const std::string msg = error_of([&] { prepare_dataset({dir / "good.txt", dir / "a_file/sub"}); });
  EXPECT_NE(msg.find("cannot create output directory"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { prepare_dataset({dir / "good.txt", dir / "a_file"}); }).find("not a directory"),
            std::string::npos);
  EXPECT_EQ(read_file(dir / "a_file"), "x");
}

TEST(PrepareErrors, UnwritableOutDir) {
  if (::geteuid() == 0) GTEST_SKIP() << "root may write anywhere";
  ScratchDir dir;
  write_text(dir / "in.txt", "abcdefghijklmnopqrstuvwxyz");
  fs::create_directory(dir / "ro");
  fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  const std::string msg = error_of([&] { prepare_dataset({dir / "in.txt", dir / "ro"}); });
  fs::permissions(dir / "ro", fs::perms::owner_all);
  EXPECT_NE(msg.find("cannot write to output directory"), std::string::npos) << msg;
  EXPECT_TRUE(listing(dir / "ro").empty());
}

TEST(PrepareErrors, AFailedPrepareKeepsThePreviousOutput) {
  ScratchDir dir;
  write_text(dir / "in.txt", "abcdefghijklmnopqrstuvwxyz");
  prepare_dataset({dir / "in.txt", dir / "out"});
  const std::string train = read_file(dir / "out/train.bin");
  write_text(dir / "in.txt", "abc\xFF");
  EXPECT_THROW(prepare_dataset({dir / "in.txt", dir / "out"}), std::runtime_error);
  EXPECT_EQ(read_file(dir / "out/train.bin"), train);
  EXPECT_EQ(listing(dir / "out"), (std::set<std::string>{"meta.bin", "train.bin", "val.bin"}));
}
