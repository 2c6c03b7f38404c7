// Strict UTF-8 decoding and encoding (Unicode 15, Table 3-7 "Well-Formed UTF-8 Byte Sequences").
// The second byte's allowed range depends on the lead byte; checking it there is what rejects
// overlong forms (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and values above U+10FFFF (F4 90..).
#include "data/utf8.h"

#include <fmt/format.h>

#include "io/text.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>

namespace nanogpt::data {
namespace {

std::string hex_byte(unsigned char b) { return fmt::format("0x{:02X}", b); }

[[noreturn]] void fail(size_t offset, const std::string& what) {
  throw std::runtime_error(
      fmt::format("[data] invalid UTF-8 at byte offset {}: {} (the input must be UTF-8 text; re-save it as UTF-8)", offset, what));
}

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

Utf8Step decode_utf8_step(std::string_view bytes, size_t i, std::string* error) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  const unsigned char lead = p[i];
  if (lead < 0x80) return {lead, 1, 0, false};
  const auto bad = [&](int bad_length, bool truncated, const std::string& what) {
    if (error) *error = what;
    return Utf8Step{0, 0, bad_length, truncated};
  };
  int len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  char32_t cp = 0;
  if (lead < 0xC0) {
    return bad(1, false, "unexpected continuation byte " + hex_byte(lead) + " (no lead byte before it)");
  } else if (lead < 0xC2) {
    return bad(1, false, "overlong encoding (lead byte " + hex_byte(lead) + " encodes an ASCII character in 2 bytes)");
  } else if (lead < 0xE0) {
    len = 2;
    cp = lead & 0x1F;
  } else if (lead < 0xF0) {
    len = 3;
    cp = lead & 0x0F;
    if (lead == 0xE0) lo = 0xA0;  // below: overlong
    if (lead == 0xED) hi = 0x9F;  // above: UTF-16 surrogates U+D800..U+DFFF
  } else if (lead < 0xF5) {
    len = 4;
    cp = lead & 0x07;
    if (lead == 0xF0) lo = 0x90;  // below: overlong
    if (lead == 0xF4) hi = 0x8F;  // above: beyond U+10FFFF
  } else {
    return bad(1, false, "invalid lead byte " + hex_byte(lead) + " (never appears in UTF-8)");
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= n) {
      return bad(k, true, fmt::format("truncated sequence (lead byte {} needs {} bytes, the input ends after {})",
                                      hex_byte(lead), len, k));
    }
    const unsigned char b = p[i + k];
    if (!is_continuation(b)) {
      return bad(k, false, fmt::format("truncated sequence (lead byte {} needs {} bytes, its byte {}, {}, is not a "
                                       "continuation byte)",
                                       hex_byte(lead), len, k + 1, hex_byte(b)));
    }
    if (k == 1 && (b < lo || b > hi)) {
      const char* why = lead == 0xED ? "UTF-16 surrogate code point"
                        : lead == 0xF4 ? "code point above U+10FFFF"
                                       : "overlong encoding";
      return bad(1, false, std::string(why) + " (bytes " + hex_byte(lead) + " " + hex_byte(b) + ")");
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, len, 0, false};
}

std::u32string decode_utf8(std::string_view bytes) {
  std::u32string out;
  out.reserve(bytes.size());  // an upper bound; ASCII text needs exactly this
  size_t i = 0;
  std::string error;
  while (i < bytes.size()) {
    const Utf8Step step = decode_utf8_step(bytes, i, &error);
    if (step.length == 0) fail(i, error);
    out.push_back(step.cp);
    i += static_cast<size_t>(step.length);
  }
  return out;
}

size_t incomplete_utf8_tail(std::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto b = static_cast<unsigned char>(bytes[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: the lead is further back
    const size_t length = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 1;
    return back < length ? back : 0;
  }
  return 0;  // no lead byte in the last three: nothing a later byte could complete
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    if (cp >= 0xD800 && cp <= 0xDFFF) {
      throw std::runtime_error("[data] cannot encode " + describe_char(cp) + " as UTF-8: it is a UTF-16 surrogate");
    }
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= 0x10FFFF) {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    throw std::runtime_error("[data] cannot encode " + describe_char(cp) + " as UTF-8: above U+10FFFF");
  }
}

std::string encode_utf8(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append_utf8(out, cp);
  return out;
}

std::string describe_char(char32_t cp) {
  const std::string code = fmt::format("U+{:04X}", static_cast<unsigned>(cp));
  std::string shown;
  switch (cp) {
    case '\n': shown = "\\n"; break;
    case '\t': shown = "\\t"; break;
    case '\r': shown = "\\r"; break;
    default:
      // Control characters, surrogates and non-characters print as the code alone.
      if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0) || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
        return code;
      }
      append_utf8(shown, cp);
  }
  return "'" + shown + "' (" + code + ")";
}

std::string escape_controls(std::string_view text) { return io::printable(text, io::Escape::controls); }

std::string replace_invalid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Step step = decode_utf8_step(bytes, i);
    if (step.length > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(step.length)));
      i += static_cast<size_t>(step.length);
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += static_cast<size_t>(std::max(step.bad_length, 1));
    }
  }
  return out;
}

}  // namespace nanogpt::data
