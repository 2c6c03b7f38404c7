// Character vocabulary: order, exact encode/decode inverses, unknown characters, serialization.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>

#include "data/utf8.h"
#include "data/vocab.h"
#include "test_files.h"

using namespace nanogpt::data;
using nanogpt::testing::error_of;

TEST(Vocab, IsTheSortedSetOfCodePoints) {
  const std::string text = "hello world\n";
  const Vocab vocab = Vocab::from_text(text);
  // Reference: std::set of the characters (ASCII, so bytes are code points).
  const std::set<char> expected(text.begin(), text.end());
  ASSERT_EQ(vocab.size(), static_cast<int64_t>(expected.size()));
  int64_t id = 0;
  for (char c : expected) EXPECT_EQ(vocab.char_at(id++), static_cast<char32_t>(c));
  EXPECT_EQ(vocab.chars(), U"\n dehlorw");
}

TEST(Vocab, CjkAndFourByteCharactersAreOneTokenEach) {
  const std::string text = "床前明月光，疑是地上霜。𠀀床𠀀";
  const Vocab vocab = Vocab::from_text(text);
  EXPECT_EQ(vocab.size(), 13);  // the 12 distinct characters of 床前明月光，疑是地上霜。 + 𠀀
  EXPECT_EQ(vocab.char_at(vocab.size() - 1), 0x20000u);  // highest code point sorts last
  const auto ids = vocab.encode(text);
  EXPECT_EQ(ids.size(), 15u);  // one token per character, not per byte
  EXPECT_EQ(ids[12], vocab.size() - 1);
  EXPECT_EQ(ids[13], ids[0]);
  EXPECT_TRUE(std::is_sorted(vocab.chars().begin(), vocab.chars().end()));
}

TEST(Vocab, EncodeAndDecodeAreExactInverses) {
  for (const std::string& text : {std::string("To be, or not to be: that is the question.\n"),
                                 std::string("白日依山尽，黄河入海流。𠀀𪚥\n"), std::string("mixed: café 中文 😀 \t\r\n")}) {
    const Vocab vocab = Vocab::from_text(text);
    const auto ids = vocab.encode(text);
    EXPECT_EQ(vocab.decode(ids), text);
    for (int64_t id = 0; id < vocab.size(); ++id) {
      EXPECT_EQ(vocab.encode(vocab.decode_one(id)), std::vector<int64_t>{id});
    }
  }
}

TEST(Vocab, UnknownCharacterIsAnErrorNamingItAndItsPosition) {
  const Vocab vocab = Vocab::from_text("abc");
  const std::string msg = error_of([&] { vocab.encode("ab中c"); });
  EXPECT_NE(msg.find("'中' (U+4E2D)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position 2"), std::string::npos) << msg;  // character index, not byte offset
  EXPECT_EQ(msg.rfind("[data] ", 0), 0u) << msg;
}

TEST(Vocab, UnknownCharactersCanBeSkipped) {
  const Vocab vocab = Vocab::from_text("abc");
  std::u32string skipped;
  const auto ids = vocab.encode("axbyc", UnknownChars::Skip, &skipped);
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(skipped, U"xy");
  EXPECT_EQ(vocab.encode("zz", UnknownChars::Skip), std::vector<int64_t>{});
}

TEST(Vocab, OutOfRangeIdsThrow) {
  const Vocab vocab = Vocab::from_text("ab");
  EXPECT_THROW(vocab.char_at(2), std::runtime_error);
  EXPECT_THROW(vocab.char_at(-1), std::runtime_error);
  EXPECT_THROW(vocab.decode({0, 5}), std::runtime_error);
  EXPECT_THROW(vocab.decode_one(2), std::runtime_error);
}

TEST(Vocab, InvalidUtf8TextIsRejected) {
  EXPECT_THROW(Vocab::from_text("ab\xFF"), std::runtime_error);
  const Vocab vocab = Vocab::from_text("ab");
  EXPECT_THROW(vocab.encode("a\xC3"), std::runtime_error);
}

TEST(Vocab, SerializeRoundTrips) {
  for (const std::string& text : {std::string(""), std::string("abc\n"), std::string("春眠不觉晓𠀀😀\n")}) {
    const Vocab vocab = Vocab::from_text(text);
    const Vocab back = Vocab::deserialize(vocab.serialize());
    EXPECT_EQ(back, vocab);
    EXPECT_EQ(back.encode(text), vocab.encode(text));  // the index is rebuilt too
  }
}

TEST(Vocab, CorruptBlobsThrowNeverCrash) {
  const std::string good = Vocab::from_text("abc中𠀀").serialize();
  // Every truncation, and every single-byte corruption, either throws or gives a valid vocabulary.
  for (size_t len = 0; len < good.size(); ++len) {
    EXPECT_THROW(Vocab::deserialize(good.substr(0, len)), std::runtime_error) << "truncated to " << len;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    for (int v : {0x00, 0x30, 0x61, 0x80, 0xFF}) {
      std::string bad = good;
      bad[i] = static_cast<char>(v);
      try {
        const Vocab vocab = Vocab::deserialize(bad);
        EXPECT_TRUE(std::is_sorted(vocab.chars().begin(), vocab.chars().end()));
      } catch (const std::runtime_error&) {
      }
    }
  }
  EXPECT_THROW(Vocab::deserialize("nanogpt-vocab/1 3\ncba"), std::runtime_error);  // not sorted
  EXPECT_THROW(Vocab::deserialize("nanogpt-vocab/1 3\naab"), std::runtime_error);  // not distinct
  EXPECT_THROW(Vocab::deserialize("nanogpt-vocab/1 2\nabc"), std::runtime_error);  // count mismatch
  EXPECT_THROW(Vocab::deserialize("nanogpt-vocab/2 1\na"), std::runtime_error);    // unknown version
  EXPECT_THROW(Vocab::deserialize("nanogpt-vocab/1 99999999999999999999\na"), std::runtime_error);
  EXPECT_THROW(Vocab::deserialize("garbage"), std::runtime_error);
}
