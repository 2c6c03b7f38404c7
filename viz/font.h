// A built-in 5x8 bitmap font for printable ASCII (rows 0-6 above the baseline, row 7 for
// descenders), so plots need no font files. Scaled by integer factors for crisp pixels.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace nanogpt::viz {

constexpr int kGlyphWidth = 5;    // pixels per glyph row, before scaling
constexpr int kGlyphHeight = 8;   // rows per glyph, descender row included
constexpr int kCapHeight = 7;     // rows above the baseline: the height of 'A'
constexpr int kGlyphAdvance = 6;  // horizontal step from one glyph to the next (1 column gap)

/// Not ASCII, but drawable: an open box (U+2423) for showing a space token.
constexpr char kVisibleSpace = '\x7f';

/// The 8 rows of `c`'s glyph; bit 4 is the leftmost column. Characters outside ' '..'~' (and
/// kVisibleSpace) get the '?' glyph.
const uint8_t* glyph_rows(char c);

/// Width in pixels of `text` drawn at `scale` (no trailing gap); 0 for empty text.
int text_width(std::string_view text, int scale = 1);

/// Makes UTF-8 text drawable: every code point outside printable ASCII (and kVisibleSpace)
/// becomes one '?'.
std::string to_drawable(std::string_view utf8_text);

}  // namespace nanogpt::viz
