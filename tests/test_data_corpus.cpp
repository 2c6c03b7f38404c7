// Corpora as users have them and token files read in place: several files and folders read as one
// stream, invalid UTF-8 refused or replaced, the streaming checksum, memory-mapped token files
// (the same batches as tokens in memory), meta.bin versions, and dataset names.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>

#include "data/batch_sampler.h"
#include "data/checksum.h"
#include "data/corpus.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data/utf8.h"
#include "test_files.h"

using namespace nanogpt::data;
using nanogpt::testing::ScratchDir;
using nanogpt::testing::slurp;
using nanogpt::testing::spit;
namespace fs = std::filesystem;

using nanogpt::testing::error_of;

namespace {

// The whole corpus as one string of code points, read piece by piece.
std::u32string read_all(CorpusReader& reader, size_t* pieces = nullptr) {
  std::u32string all;
  std::u32string_view piece;
  while (reader.next(piece)) {
    all += piece;
    if (pieces) ++*pieces;
  }
  return all;
}

std::vector<int64_t> to_ids(const torch::Tensor& t) {
  auto l = t.to(torch::kInt64);
  return std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
}

// Text of mixed widths (1- to 4-byte characters) long enough to cross several 1 MiB read buffers,
// so characters straddle buffer ends.
std::string mixed_text(size_t bytes) {
  const std::string parts[] = {"a", "é", "世", "𠀀", "\n", "ok ", "—"};
  std::mt19937 rng(3);
  std::string text;
  while (text.size() < bytes) text += parts[rng() % 7];
  return text;
}

}  // namespace

TEST(Checksum, DoesNotDependOnHowTheStreamIsCut) {
  const std::string bytes = mixed_text(1000);
  const uint64_t whole = checksum_of(bytes);
  for (size_t cut : {size_t{1}, size_t{3}, size_t{7}, size_t{8}, size_t{9}, size_t{500}}) {
    Checksum sum;
    for (size_t i = 0; i < bytes.size(); i += cut) sum.update(std::string_view(bytes).substr(i, cut));
    EXPECT_EQ(sum.value(), whole) << "pieces of " << cut;
    EXPECT_EQ(sum.bytes(), bytes.size());
  }
  std::string changed = bytes;
  changed[517] ^= 1;
  EXPECT_NE(checksum_of(changed), whole);
  EXPECT_NE(checksum_of(bytes.substr(0, 999)), whole);  // truncated
  EXPECT_NE(checksum_of(std::string(8, '\0')), checksum_of(std::string(16, '\0')));  // the length counts
}

TEST(Corpus, ReadsLikeDecodingTheWholeFile) {
  ScratchDir dir;
  const std::string text = mixed_text(3'500'000);  // > 3 read buffers
  spit(dir / "big.txt", text);
  CorpusReader reader({dir / "big.txt"}, "\n", Utf8Errors::strict);
  size_t pieces = 0;
  EXPECT_EQ(read_all(reader, &pieces), decode_utf8(text));  // the independent reference: decode in one go
  EXPECT_GE(pieces, 4u);
  EXPECT_EQ(reader.bytes_read(), text.size());
  EXPECT_EQ(reader.checksum(), checksum_of(text));
}

TEST(Corpus, JoinsFilesAndFoldersInSortedOrderWithTheSeparator) {
  ScratchDir dir;
  fs::create_directories(dir / "docs/b");
  fs::create_directories(dir / "docs/.git");
  fs::create_directories(dir / "docs/out");
  spit(dir / "docs/b/2.txt", "two");
  spit(dir / "docs/b/1.txt", "one");
  spit(dir / "docs/a.txt", "alpha");
  spit(dir / "docs/.hidden", "no");
  spit(dir / "docs/.git/HEAD", "no");
  spit(dir / "docs/out/train.bin", "no");  // prepare's own output folder is left out
  spit(dir / "first.txt", "first");
  const auto files = corpus_files({dir / "first.txt", dir / "docs"}, dir / "docs/out");
  EXPECT_EQ(files, (std::vector<std::string>{dir / "first.txt", dir / "docs/a.txt", dir / "docs/b/1.txt",
                                              dir / "docs/b/2.txt"}));
  CorpusReader reader(files, "\n\n", Utf8Errors::strict);
  EXPECT_EQ(encode_utf8(read_all(reader)), "first\n\nalpha\n\none\n\ntwo");
  EXPECT_EQ(reader.total_bytes(), std::string("first\n\nalpha\n\none\n\ntwo").size());

  EXPECT_NE(error_of([&] { corpus_files({dir / "missing"}); }).find("does not exist"), std::string::npos);
  fs::create_directories(dir / "empty");
  EXPECT_NE(error_of([&] { corpus_files({dir / "empty"}); }).find("without files"), std::string::npos);
  EXPECT_NE(error_of([&] { CorpusReader({dir / "first.txt"}, "\xFF", Utf8Errors::strict); }).find("separator"),
            std::string::npos);
}

TEST(Corpus, InvalidUtf8NamesTheFileAndOffsetOrIsReplaced) {
  ScratchDir dir;
  spit(dir / "good.txt", "fine");
  // Offset 1 MiB + 5: past the first read buffer, so the offset is the file's, not the buffer's.
  std::string bad = std::string((1 << 20) + 5, 'x') + "\xC3\x28";
  spit(dir / "bad.txt", bad);
  CorpusReader strict({dir / "good.txt", dir / "bad.txt"}, "\n", Utf8Errors::strict);
  const std::string msg = error_of([&] { read_all(strict); });
  EXPECT_NE(msg.find("'" + (dir / "bad.txt") + "': invalid UTF-8 at byte offset 1048581"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--errors=replace"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  // Unicode's "maximal subpart" replacement (what Python's errors="replace" does): a truncated
  // sequence is one U+FFFD, each stray byte is one, and decoding resumes right after.
  spit(dir / "mixed.txt", "a\xE2\x82" "b\xFF\xFE" "c\xED\xA0\x80" "d\xF0\x9F\x98");
  CorpusReader replace({dir / "mixed.txt"}, "", Utf8Errors::replace);
  EXPECT_EQ(read_all(replace), U"a\uFFFDb\uFFFD\uFFFDc\uFFFD\uFFFD\uFFFDd\uFFFD");
  EXPECT_EQ(replace.replaced(), 7u);
}

TEST(Prepare, SeveralFilesGiveTheTokensOfTheirJoinedText) {
  ScratchDir dir;
  const std::string a = mixed_text(1'500'000), b = "and a second file\n";
  spit(dir / "a.txt", a);
  spit(dir / "b.txt", b);
  PrepareOptions options{dir / "a.txt", dir / "out"};
  options.more_inputs = {dir / "b.txt"};
  options.separator = "<|doc|>";
  std::vector<PrepareProgress> progress;
  options.progress = [&](const PrepareProgress& p) { progress.push_back(p); };
  const DatasetMeta meta = prepare_dataset(options);
  const std::string joined = a + "<|doc|>" + b;
  // Independent reference: the in-memory vocabulary and encoder on the joined text.
  const Vocab vocab = Vocab::from_text(joined);
  EXPECT_EQ(meta.vocab, vocab);
  std::vector<int64_t> ids = to_ids(read_token_file(dir / "out/train.bin", vocab.size()));
  const auto val = to_ids(read_token_file(dir / "out/val.bin", vocab.size()));
  ids.insert(ids.end(), val.begin(), val.end());
  EXPECT_EQ(ids, vocab.encode(joined));
  EXPECT_EQ(meta.train_tokens, static_cast<int64_t>(static_cast<double>(ids.size()) * 0.9));
  EXPECT_EQ(meta.input_bytes, joined.size());
  ASSERT_GE(progress.size(), 2u);  // each 1 MiB read of each pass, at most once a percent
  EXPECT_EQ(progress.front().pass, 1);
  EXPECT_EQ(progress.back().pass, 2);
  EXPECT_EQ(progress.back().bytes_done, joined.size());
  for (const auto& p : progress) EXPECT_EQ(p.bytes_total, joined.size());
}

TEST(TokenFile, MappedTokensEqualTheTokensReadInMemory) {
  ScratchDir dir;
  spit(dir / "in.txt", mixed_text(200'000));
  const DatasetMeta meta = prepare_dataset({dir / "in.txt", dir / "out"});
  const auto mapped = map_token_file(dir / "out/train.bin", {meta.vocab.size(), meta.train_tokens, meta.train_checksum});
  const auto in_memory = read_token_file(dir / "out/train.bin", meta.vocab.size());
  EXPECT_EQ(mapped.scalar_type(), torch::kUInt16);
  EXPECT_EQ(to_ids(mapped), to_ids(in_memory));

  const auto wide = (dir / "wide.bin");
  const uint64_t sum = write_token_file(wide, {0, 69999, 5, 70000 - 2}, 70000);
  const auto w = map_token_file(wide, {70000, 4, sum, true});
  EXPECT_EQ(w.scalar_type(), torch::kInt32);
  EXPECT_EQ(to_ids(w), (std::vector<int64_t>{0, 69999, 5, 69998}));
}

// Batches from the mapped uint16 file are the batches today's in-memory int32 tokens give, for
// the same seed, state and sequential index: exact resume and old runs' batches hold.
TEST(TokenFile, MappedTokensDrawTheSameBatches) {
  ScratchDir dir;
  spit(dir / "in.txt", mixed_text(100'000));
  const DatasetMeta meta = prepare_dataset({dir / "in.txt", dir / "out"});
  const auto mapped = map_token_file(dir / "out/train.bin", {meta.vocab.size(), meta.train_tokens, meta.train_checksum});
  const auto in_memory = read_token_file(dir / "out/train.bin", meta.vocab.size());
  BatchSampler a(mapped, 5, 32, 1337, meta.vocab.size()), b(in_memory, 5, 32, 1337);
  for (int i = 0; i < 20; ++i) {
    auto [xa, ya] = a.next();
    auto [xb, yb] = b.next();
    ASSERT_TRUE(torch::equal(xa, xb) && torch::equal(ya, yb)) << "batch " << i;
  }
  EXPECT_EQ(a.state(), b.state());
  EXPECT_TRUE(torch::equal(a.sequential(7).first, b.sequential(7).first));
  EXPECT_EQ(to_ids(mapped), to_ids(in_memory));  // pages dropped after each batch read back the same
}

TEST(TokenFile, DamagedTruncatedOrForeignFilesAreOneClearLine) {
  ScratchDir dir;
  spit(dir / "in.txt", mixed_text(20'000));
  spit(dir / "other.txt", mixed_text(30'000));
  const DatasetMeta meta = prepare_dataset({dir / "in.txt", dir / "out"});
  prepare_dataset({dir / "other.txt", dir / "other"});
  const std::string path = dir / "out/train.bin";
  const TokenFileCheck check{meta.vocab.size(), meta.train_tokens, meta.train_checksum};
  const std::string good = slurp(path);
  const auto expect = [&](const std::string& what) {
    const std::string msg = error_of([&] { map_token_file(path, check); });
    EXPECT_NE(msg.find("[data] '" + path + "': "), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find("nanogpt prepare"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  spit(path, good.substr(0, good.size() - 2));
  expect("truncated or corrupt");
  spit(path, slurp(dir / "other/train.bin"));  // another preparation's tokens
  expect("but meta.bin says");
  std::string damaged = good;
  size_t at = 24 + (good.size() - 24) / 4 * 2;  // two different neighbours swapped: ids still valid,
  while (damaged.substr(at, 2) == damaged.substr(at + 2, 2)) at += 2;  // only the checksum sees it
  std::swap(damaged[at], damaged[at + 2]);
  std::swap(damaged[at + 1], damaged[at + 3]);
  spit(path, damaged);
  expect("checksum");
  damaged = good;
  damaged[24] = '\xFF', damaged[25] = '\xFF';
  spit(path, damaged);
  expect("token 65535 at index 0 is outside the vocabulary");
  spit(path, "NGPTMETA and more bytes than a header");
  expect("wrong magic number");
}

// A token file too large to be read at every start is checked by its length and header only; a
// damaged id is then caught by the sampler when drawn, before it reaches the model.
TEST(BatchSampler, IdsOutsideTheVocabularyAreOneClearLine) {
  auto tokens = torch::arange(100, torch::kInt32);
  tokens[50] = 1000;
  BatchSampler sampler(tokens, 4, 60, 1, 100);
  const std::string msg = error_of([&] { sampler.next(); });
  EXPECT_NE(msg.find("token 1000 at index 50 is outside the vocabulary (vocab_size 100)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--verify_data"), std::string::npos) << msg;
}

TEST(Meta, Version1FilesStillReadAndArePreparedAgain) {
  ScratchDir dir;
  const std::string text = "abcdefghijklmnopqrstuvwxyz";
  spit(dir / "input.txt", text);
  prepare_dataset({dir / "input.txt", dir.path});
  // meta.bin as version 1 wrote it: no mtime, no token checksums, the FNV-1a of the input.
  std::string v1 = slurp(dir / "meta.bin");
  v1[8] = 1;
  v1.erase(52, 40);
  for (int i = 0; i < 8; ++i) v1[36 + i] = static_cast<char>((fnv1a64(text) >> (8 * i)) & 0xFF);
  spit(dir / "meta.bin", v1);
  const DatasetMeta meta = read_meta(dir.path);
  EXPECT_EQ(meta.version, 1u);
  EXPECT_EQ(meta.vocab.size(), 26);
  EXPECT_EQ(meta.train_checksum, 0u);
  EXPECT_FALSE(is_prepared(dir / "input.txt", dir.path));  // prepared again, gaining the checksums
  bool prepared = false;
  EXPECT_EQ(ensure_prepared({dir / "input.txt", dir.path}, &prepared).version, 3u);
  EXPECT_TRUE(prepared);
}

TEST(Meta, ReadsVersion2AsOneCharacterPerToken) {
  ScratchDir dir;
  spit(dir / "input.txt", "abcdefghijklmnopqrstuvwxyz");
  const DatasetMeta current = prepare_dataset({dir / "input.txt", dir.path});
  // meta.bin as version 2 wrote it: no character counts.
  std::string v2 = slurp(dir / "meta.bin");
  v2[8] = 2;
  v2.erase(76, 16);
  spit(dir / "meta.bin", v2);
  const DatasetMeta meta = read_meta(dir.path);
  EXPECT_EQ(meta.version, 2u);
  EXPECT_EQ(meta.train_chars, current.train_tokens);
  EXPECT_EQ(meta.val_chars, current.val_tokens);
  EXPECT_EQ(val_tokens_per_char(meta), 1.0);
}

TEST(DatasetDir, ANameWithoutASlashIsAFolderUnderData) {
  EXPECT_EQ(dataset_dir("mine"), "data/mine");
  EXPECT_EQ(dataset_dir("shakespeare_char"), "data/shakespeare_char");
  EXPECT_EQ(dataset_dir("data/mine"), "data/mine");
  EXPECT_EQ(dataset_dir("./mine"), "./mine");
  EXPECT_EQ(dataset_dir("/abs/corpus"), "/abs/corpus");
  EXPECT_EQ(dataset_dir("."), ".");
}

// Above kAlwaysVerifyBytes, opening checks the header and length only (start-up does not grow with
// the corpus); `full` (train's --verify_data) reads every token and finds the damaged one.
TEST(TokenFile, LargeFilesAreReadWholeOnlyWhenAsked) {
  ScratchDir dir;
  const std::string path = dir / "big.bin";
  const uint64_t count = kAlwaysVerifyBytes / 2 + 1000;  // uint16 tokens: just over the limit
  std::vector<int32_t> ids(1 << 20);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 50);
  {
    TokenFileWriter writer(path, count, 100);
    while (writer.written() + ids.size() <= count) writer.append(ids.data(), ids.size());
    writer.append(ids.data(), count - writer.written());
    writer.finish();
  }
  const std::string last("\x63\x00", 2);  // the last token becomes 99: inside the file's vocabulary of 100...
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kTokenFileHeaderBytes + 2 * (count - 1)));
    f.write(last.data(), 2);
  }
  // ...but not of the 50 the dataset has.
  const auto tokens = map_token_file(path, {50, static_cast<int64_t>(count)});
  EXPECT_EQ(tokens.numel(), static_cast<int64_t>(count));
  const std::string msg = error_of([&] { map_token_file(path, {50, static_cast<int64_t>(count), 0, true}); });
  EXPECT_NE(msg.find(fmt::format("token 99 at index {} is outside the vocabulary (vocab_size 50)", count - 1)),
            std::string::npos)
      << msg;
}
