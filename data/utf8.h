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
