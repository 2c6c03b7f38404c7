// UTF-8 <-> Unicode code points. The tokenizer works on code points, so a CJK character or a
// 4-byte character outside the BMP is one token, never a run of bytes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace nanogpt::data {

/// Decodes UTF-8 strictly (no overlongs, no surrogates, nothing above U+10FFFF).
/// Throws std::runtime_error "[data] invalid UTF-8 at byte offset N: ..." naming the first bad byte.
std::u32string decode_utf8(std::string_view bytes);

/// The largest Unicode code point.
constexpr char32_t kMaxCodePoint = 0x10FFFF;

/// One step of strict decoding (see decode_utf8_step).
struct Utf8Step {
  char32_t cp;      // the code point, when length > 0
  int length;       // bytes it took (1..4); 0 when the bytes there are not valid UTF-8
  int bad_length;   // on error: the bytes to skip (the maximal invalid subpart, Unicode 15 section 3.9)
  bool truncated;   // on error: the sequence was cut short by the end of `bytes` (more input may complete it)
};

/// Decodes the code point starting at bytes[i] (i < bytes.size()). On an error, `error` (if given)
/// receives what is wrong, e.g. "invalid lead byte 0xFF (never appears in UTF-8)".
Utf8Step decode_utf8_step(std::string_view bytes, size_t i, std::string* error = nullptr);

/// `bytes` with each maximal invalid subsequence replaced by U+FFFD (Python's errors="replace"):
/// for text assembled from byte pieces, which a model may leave incomplete.
std::string replace_invalid_utf8(std::string_view bytes);

/// How many bytes at the end of `bytes` begin a code point that is not complete yet (0 to 3): a lead
/// byte and fewer continuation bytes than it announces. Text streamed piece by piece holds these
/// back until the rest arrives (byte pieces of a subword tokenizer split characters).
size_t incomplete_utf8_tail(std::string_view bytes);

/// Appends the UTF-8 encoding of one code point. Throws on surrogates / values > U+10FFFF.
void append_utf8(std::string& out, char32_t cp);

/// Encodes code points to UTF-8.
std::string encode_utf8(std::u32string_view cps);

/// `text` with control characters (< 0x20, 0x7f) written as \xNN, so an error message that quotes
/// file contents stays on one line.
std::string escape_controls(std::string_view text);

/// Human-readable name of a code point for error messages: 'x' (U+0078).
std::string describe_char(char32_t cp);

}  // namespace nanogpt::data
