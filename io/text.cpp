// printable and is_utf8 (see text.h).
#include "io/text.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace nanogpt::io {

bool is_utf8(std::string_view text) {
  try {
    (void)nlohmann::json(std::string(text)).dump();  // nlohmann refuses invalid UTF-8 when it writes a string
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

std::string printable(std::string_view text, Escape escape) {
  const bool escape_high = escape == Escape::non_ascii || (escape == Escape::controls_utf8 && !is_utf8(text));
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || (u >= 0x80 && escape_high)) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out;
}

}  // namespace nanogpt::io
