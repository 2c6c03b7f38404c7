// Text made safe for one-line error messages: bytes from a damaged or hostile file (control
// characters, invalid UTF-8) are shown as \xNN escapes, so an error stays one readable line.
#pragma once

#include <string>
#include <string_view>

namespace nanogpt::io {

enum class Escape {
  controls,        // control characters (< 0x20, 0x7f) only; UTF-8 passes through
  controls_utf8,   // controls, and every byte >= 0x80 when the text is not valid UTF-8
  non_ascii,       // every byte outside printable ASCII
};

/// `text` with the bytes `escape` selects written as \xNN (lowercase hex).
std::string printable(std::string_view text, Escape escape = Escape::controls_utf8);

/// Whether `text` is valid UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool is_utf8(std::string_view text);

}  // namespace nanogpt::io
