// The bpe tokenizer (SentencePiece BPE with byte fallback) through prepare and the Vocab API: the
// token files decode back to exactly the input, any character encodes (an unseen one as its UTF-8
// bytes), the tokenizer survives serialize/deserialize, and what cannot work with it says so.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data/utf8.h"
#include "data/vocab.h"
#include "test_files.h"

using namespace nanogpt::data;
using nanogpt::testing::error_of;
using nanogpt::testing::ScratchDir;
using nanogpt::testing::slurp;
using nanogpt::testing::spit;
namespace fs = std::filesystem;

namespace {

// The first `bytes` of a corpus in the repository, cut back to whole lines.
std::string corpus_head(const std::string& name, size_t bytes) {
  std::string text = slurp(std::string(NANOGPT_SOURCE_DIR) + "/data/" + name + "/input.txt").substr(0, bytes);
  return text.substr(0, text.rfind('\n') + 1);
}

std::vector<int64_t> tokens_of(const std::string& path, int64_t vocab_size) {
  const auto t = read_token_file(path, vocab_size).to(torch::kLong);
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

PrepareOptions bpe_options(const std::string& input, const std::string& out, int64_t vocab_size) {
  PrepareOptions o;
  o.input = input;
  o.out_dir = out;
  o.tokenizer = TokenizerKind::Bpe;
  o.vocab_size = vocab_size;
  return o;
}

}  // namespace

TEST(Bpe, TokenFilesDecodeToExactlyTheInput) {
  ScratchDir dir;
  const std::string text = corpus_head("shakespeare_char", 60000);
  spit(dir / "in.txt", text);
  const DatasetMeta meta = prepare_dataset(bpe_options(dir / "in.txt", dir / "out", 512));
  EXPECT_EQ(meta.vocab.kind(), TokenizerKind::Bpe);
  EXPECT_LE(meta.vocab.size(), 512);
  EXPECT_GT(meta.vocab.size(), kBpeReservedPieces);

  // The split is the same character as for char: int(n * 0.9) of the code points.
  const std::u32string chars = decode_utf8(text);
  const auto train_chars = static_cast<int64_t>(static_cast<double>(chars.size()) * 0.9);
  EXPECT_EQ(meta.train_chars, train_chars);
  EXPECT_EQ(meta.val_chars, static_cast<int64_t>(chars.size()) - train_chars);

  const auto train = tokens_of(dir / "out/train.bin", meta.vocab.size());
  const auto val = tokens_of(dir / "out/val.bin", meta.vocab.size());
  EXPECT_EQ(static_cast<int64_t>(train.size()), meta.train_tokens);
  EXPECT_EQ(static_cast<int64_t>(val.size()), meta.val_tokens);
  EXPECT_EQ(meta.vocab.decode(train), encode_utf8(chars.substr(0, static_cast<size_t>(train_chars))));
  EXPECT_EQ(meta.vocab.decode(val), encode_utf8(chars.substr(static_cast<size_t>(train_chars))));
  // Subwords: fewer tokens than characters, and the ratio meta.bin gives is the counted one.
  EXPECT_LT(meta.val_tokens, meta.val_chars);
  EXPECT_DOUBLE_EQ(val_tokens_per_char(meta), static_cast<double>(val.size()) / static_cast<double>(meta.val_chars));

  const DatasetMeta read = read_meta(dir / "out");
  EXPECT_EQ(read.vocab, meta.vocab);
  EXPECT_EQ(read.train_chars, meta.train_chars);
  EXPECT_EQ(read.val_chars, meta.val_chars);
  EXPECT_EQ(read.vocab.encode("First Citizen:\n"), meta.vocab.encode("First Citizen:\n"));
  EXPECT_NE(summary_line(read).find("tokenizer=bpe"), std::string::npos) << summary_line(read);
}

TEST(Bpe, ChineseRoundTripsAndAnUnseenCharacterBecomesItsBytes) {
  ScratchDir dir;
  const std::string text = corpus_head("tang_poems", 120000);
  spit(dir / "in.txt", text);
  // 512 pieces cannot hold the thousands of characters: the rare ones fall back to bytes.
  const DatasetMeta meta = prepare_dataset(bpe_options(dir / "in.txt", dir / "out", 512));
  const Vocab& vocab = meta.vocab;

  const std::string unseen = "\xF0\x9F\x99\x82";  // U+1F642, an emoji no Tang poem holds
  ASSERT_EQ(text.find(unseen), std::string::npos);
  const std::string poem = "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。" + unseen + "\n";
  const auto ids = vocab.encode(poem);
  EXPECT_EQ(vocab.decode(ids), poem);
  std::string concatenated;
  for (int64_t id : ids) concatenated += vocab.decode_one(id);
  EXPECT_EQ(concatenated, poem);

  // The emoji is its four UTF-8 bytes, each a byte piece named as SentencePiece names them.
  const auto alone = vocab.encode(unseen);
  ASSERT_EQ(alone.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(vocab.piece(alone[i]), fmt::format("<0x{:02X}>", static_cast<unsigned char>(unseen[i])));
    EXPECT_EQ(vocab.decode_one(alone[i]), unseen.substr(i, 1));
  }
  EXPECT_TRUE(vocab.contains(U'\U0001F642'));  // byte fallback: nothing is unknown
  // The whole token files decode to the corpus.
  std::string decoded = vocab.decode(tokens_of(dir / "out/train.bin", vocab.size()));
  decoded += vocab.decode(tokens_of(dir / "out/val.bin", vocab.size()));
  EXPECT_EQ(decoded, text);
}

TEST(Bpe, SerializeRoundTripsAndDamageIsRefused) {
  ScratchDir dir;
  spit(dir / "in.txt", corpus_head("shakespeare_char", 30000));
  const Vocab vocab = prepare_dataset(bpe_options(dir / "in.txt", dir / "out", 400)).vocab;
  const std::string blob = vocab.serialize();
  EXPECT_EQ(blob.rfind("nanogpt-vocab/2 bpe 400 ", 0), 0u) << blob.substr(0, 40);
  EXPECT_EQ(replace_invalid_utf8(blob), blob);  // plain text: safetensors metadata can hold it
  const Vocab back = Vocab::deserialize(blob);
  EXPECT_EQ(back, vocab);
  EXPECT_EQ(back.requested_vocab_size(), 400);
  EXPECT_EQ(back.size(), vocab.size());
  const std::string sample = "KING RICHARD III:\nNow is the winter of our discontent";
  EXPECT_EQ(back.encode(sample), vocab.encode(sample));
  EXPECT_FALSE(back == Vocab::from_text(sample));

  std::string truncated = blob.substr(0, blob.size() - 4);
  EXPECT_NE(error_of([&] { Vocab::deserialize(truncated); }).find("[data] corrupt vocabulary"), std::string::npos);
  std::string bad_char = blob;
  bad_char[blob.size() - 10] = '!';
  EXPECT_NE(error_of([&] { Vocab::deserialize(bad_char); }).find("base64"), std::string::npos);
  std::string garbage = blob;  // valid base64, but not a model
  for (size_t i = blob.find('\n') + 1; i < blob.size() - 4; ++i) garbage[i] = 'A';
  EXPECT_NE(error_of([&] { Vocab::deserialize(garbage); }).find("[data] corrupt vocabulary"), std::string::npos);
}

TEST(Bpe, WhatNeedsCharactersRefusesInOneLine) {
  ScratchDir dir;
  spit(dir / "in.txt", corpus_head("shakespeare_char", 20000));
  const Vocab vocab = prepare_dataset(bpe_options(dir / "in.txt", dir / "out", 300)).vocab;
  const std::string message = error_of([&] { vocab.char_at(0); });
  EXPECT_NE(message.find("bpe"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_TRUE(vocab.chars().empty());
  const std::string refused = error_of([&] { vocab.require_char("export", "meta.pkl", "use safetensors"); });
  EXPECT_EQ(refused.rfind("[export] meta.pkl needs a character vocabulary, but this one is bpe", 0), 0u) << refused;
  EXPECT_NO_THROW(Vocab::from_text("abc").require_char("export", "meta.pkl", "hint"));

  const std::string small = error_of([&] { prepare_dataset(bpe_options(dir / "in.txt", dir / "small", 100)); });
  EXPECT_NE(small.find("vocab_size (100) is too small"), std::string::npos) << small;
  EXPECT_FALSE(fs::exists(dir / "small"));
}

TEST(Bpe, EnsurePreparedFollowsTheTokenizerAsked) {
  ScratchDir dir;
  spit(dir / "in.txt", corpus_head("shakespeare_char", 20000));
  PrepareOptions o;
  o.input = dir / "in.txt";
  o.out_dir = dir / "out";
  bool prepared = false;
  EXPECT_EQ(ensure_prepared(o, &prepared).vocab.kind(), TokenizerKind::Char);
  EXPECT_TRUE(prepared);
  o = bpe_options(dir / "in.txt", dir / "out", 320);
  EXPECT_EQ(ensure_prepared(o, &prepared).vocab.kind(), TokenizerKind::Bpe);
  EXPECT_TRUE(prepared);
  ensure_prepared(o, &prepared);
  EXPECT_FALSE(prepared);
  o.vocab_size = 360;
  EXPECT_EQ(ensure_prepared(o, &prepared).vocab.requested_vocab_size(), 360);
  EXPECT_TRUE(prepared);
}

// SentencePiece's own Python package, as a second opinion: it loads the model we trained and
// encodes a text to the same ids. Skips without the package.
TEST(Bpe, PythonSentencePieceEncodesTheSame) {
  const std::string python = NANOGPT_PYTHON;
  if (python.empty() || std::system((python + " -c 'import sentencepiece' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "no Python with the sentencepiece package (scripts/setup.sh --tests installs it)";
  ScratchDir dir;
  spit(dir / "in.txt", corpus_head("tang_poems", 60000) + corpus_head("shakespeare_char", 30000));
  const Vocab vocab = prepare_dataset(bpe_options(dir / "in.txt", dir / "out", 600)).vocab;
  const std::string blob = vocab.serialize();
  const std::string text = "ROMEO:\n  But soft, what light 床前明月光 \xF0\x9F\x99\x82 through yonder window breaks?\n";
  spit(dir / "text.txt", text);
  spit(dir / "vocab.txt", blob);
  const std::string script =
      "import base64, sys, sentencepiece as spm\n"
      "blob = open(sys.argv[1], 'rb').read()\n"
      "model = base64.b64decode(blob[blob.index(b'\\n') + 1:])\n"
      "sp = spm.SentencePieceProcessor(model_proto=model)\n"
      "text = open(sys.argv[2], encoding='utf-8').read()\n"
      "ids = sp.encode(text)\n"
      "assert sp.decode(ids) == text\n"
      "print(sp.get_piece_size(), *ids)\n";
  spit(dir / "check.py", script);
  const std::string cmd = python + " " + (dir / "check.py") + " " + (dir / "vocab.txt") + " " + (dir / "text.txt") + " > " +
                          (dir / "ids.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::string expected = std::to_string(vocab.size());
  for (int64_t id : vocab.encode(text)) expected += " " + std::to_string(id);
  EXPECT_EQ(slurp(dir / "ids.txt"), expected + "\n");
}
