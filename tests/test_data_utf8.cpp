// UTF-8 decoding/encoding: exact round trips and strict rejection, checked against hand-written bytes.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "data/utf8.h"

using namespace nanogpt::data;

namespace {

// The message of the error decode_utf8 throws for `bytes` (fails the test if none).
std::string decode_error(const std::string& bytes) {
  try {
    decode_utf8(bytes);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for invalid input";
  return "";
}

}  // namespace

TEST(Utf8, DecodesAsciiOneCodePointPerByte) {
  const std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.";
  const std::u32string cps = decode_utf8(text);
  ASSERT_EQ(cps.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(cps[i], static_cast<char32_t>(text[i]));
  EXPECT_EQ(encode_utf8(cps), text);
}

TEST(Utf8, DecodesEachLengthToTheRightCodePoint) {
  // Hand-encoded: 'A' (1 byte), 'é' U+00E9 (2), '中' U+4E2D (3), '𠀀' U+20000 (4), '😀' U+1F600 (4).
  const std::string bytes = "A\xC3\xA9\xE4\xB8\xAD\xF0\xA0\x80\x80\xF0\x9F\x98\x80";
  const std::u32string expected = {U'A', 0xE9, 0x4E2D, 0x20000, 0x1F600};
  EXPECT_EQ(decode_utf8(bytes), expected);
  EXPECT_EQ(encode_utf8(expected), bytes);
}

TEST(Utf8, BoundaryCodePointsRoundTrip) {
  const std::u32string cps = {0x0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF};
  const std::string bytes = encode_utf8(cps);
  EXPECT_EQ(bytes.size(), 1u + 1 + 2 + 2 + 3 + 3 + 3 + 3 + 4 + 4);
  EXPECT_EQ(decode_utf8(bytes), cps);
}

TEST(Utf8, ChineseWithCharactersOutsideTheBmpRoundTrips) {
  const std::string text = "秦川雄帝宅，函谷壮皇居。𠀀𠀁𪚥\n";
  const std::u32string cps = decode_utf8(text);
  ASSERT_EQ(cps.size(), 16u);  // 12 BMP characters, 3 four-byte characters, '\n'
  EXPECT_EQ(cps[0], 0x79E6u);  // 秦
  EXPECT_EQ(cps[12], 0x20000u);
  EXPECT_EQ(cps[13], 0x20001u);
  EXPECT_EQ(cps[14], 0x2A6A5u);
  EXPECT_EQ(cps[15], static_cast<char32_t>('\n'));
  EXPECT_EQ(encode_utf8(cps), text);
}

TEST(Utf8, MixedTextRoundTrips) {
  const std::string text = "ROMEO: 你好, naïve café — 𠀀 ok 😀\r\n\tend";
  EXPECT_EQ(encode_utf8(decode_utf8(text)), text);
}

TEST(Utf8, TruncatedSequenceNamesItsOffset) {
  EXPECT_NE(decode_error("ab\xE4\xB8").find("byte offset 2"), std::string::npos);     // ends early
  EXPECT_NE(decode_error("abc\xE4\xB8" "d").find("byte offset 3"), std::string::npos);  // ASCII inside
  EXPECT_NE(decode_error("\xF0\xA0\x80").find("truncated"), std::string::npos);
}

TEST(Utf8, OverlongEncodingsAreRejected) {
  EXPECT_NE(decode_error("x\xC0\x80").find("byte offset 1"), std::string::npos);  // U+0000 in 2 bytes
  EXPECT_NE(decode_error("\xC1\xBF").find("overlong"), std::string::npos);
  EXPECT_NE(decode_error("ok\xE0\x80\xAF").find("byte offset 2: overlong"), std::string::npos);  // '/' in 3
  EXPECT_NE(decode_error("\xF0\x82\x82\xAC").find("overlong"), std::string::npos);               // '€' in 4
}

TEST(Utf8, SurrogatesAndValuesAboveTheMaximumAreRejected) {
  EXPECT_NE(decode_error("abcd\xED\xA0\x80").find("byte offset 4: UTF-16 surrogate"), std::string::npos);
  EXPECT_NE(decode_error("\xED\xBF\xBF").find("surrogate"), std::string::npos);
  EXPECT_NE(decode_error("\xF4\x90\x80\x80").find("above U+10FFFF"), std::string::npos);
  EXPECT_NE(decode_error("\xF5\x80\x80\x80").find("byte offset 0"), std::string::npos);
  EXPECT_NE(decode_error("\xFF").find("invalid lead byte"), std::string::npos);
}

TEST(Utf8, StrayContinuationByteNamesItsOffset) {
  const std::string msg = decode_error("中文\x80");
  EXPECT_NE(msg.find("byte offset 6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("continuation"), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind("[data] invalid UTF-8", 0), 0u) << msg;
}

TEST(Utf8, EncodingRejectsSurrogatesAndOutOfRange) {
  std::string out;
  EXPECT_THROW(append_utf8(out, 0xD800), std::runtime_error);
  EXPECT_THROW(append_utf8(out, 0x110000), std::runtime_error);
}

TEST(Utf8, DescribeCharShowsTheCharacterAndItsCode) {
  EXPECT_EQ(describe_char(U'x'), "'x' (U+0078)");
  EXPECT_EQ(describe_char(0x4E2D), "'中' (U+4E2D)");
  EXPECT_EQ(describe_char(0x20000), "'𠀀' (U+20000)");
  EXPECT_EQ(describe_char(U'\n'), "'\\n' (U+000A)");
  EXPECT_EQ(describe_char(0x01), "U+0001");
}

// Every proper prefix of a character is held back whole, and nothing else is: checked against the
// strict decoder over each prefix of text with 1- to 4-byte characters.
TEST(Utf8, IncompleteTailIsExactlyTheUnfinishedLastCharacter) {
  const std::string text = "a\xC3\xA9\xE5\xBA\x8A\xF0\x9F\x98\x80z";  // a é 床 😀 z
  size_t char_start = 0;
  for (size_t end = 0; end <= text.size(); ++end) {
    const std::string prefix = text.substr(0, end);
    // The longest prefix the strict decoder accepts ends where the last whole character ends.
    size_t whole = end;
    while (whole > 0) {
      try {
        decode_utf8(prefix.substr(0, whole));
        break;
      } catch (const std::runtime_error&) {
        --whole;
      }
    }
    EXPECT_EQ(incomplete_utf8_tail(prefix), end - whole) << "prefix of " << end << " bytes";
    char_start = whole;
  }
  EXPECT_EQ(char_start, text.size());
  // Bytes that no later byte can complete are not held: a stray continuation, an invalid lead.
  EXPECT_EQ(incomplete_utf8_tail("a\x80"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("a\xFF"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("\x80\x80\x80"), 0u);
  EXPECT_EQ(incomplete_utf8_tail(""), 0u);
}
