// Character vocabulary: sorted distinct code points, with a versioned text serialization.
//
// Serialized form: "nanogpt-vocab/1 <count>\n" followed by the <count> code points, UTF-8 encoded,
// in ascending order. It is plain text, so a checkpoint's vocabulary can be read with `less`.
#include "data/vocab.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "data/utf8.h"

namespace nanogpt::data {
namespace {

constexpr std::string_view kMagic = "nanogpt-vocab/";
constexpr int kVersion = 1;
constexpr char32_t kMaxCodePoint = 0x10FFFF;

[[noreturn]] void corrupt(const std::string& what) {
  throw std::runtime_error("[data] corrupt vocabulary: " + what +
                           " (the meta file or checkpoint is damaged or was not written by nanogpt)");
}

// Parses a non-negative decimal number at `pos`, advancing it; false if none or too large.
bool parse_number(std::string_view s, size_t& pos, uint64_t& value) {
  const size_t start = pos;
  value = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
    if (pos - start >= 9) return false;  // far above any vocabulary size
    value = value * 10 + static_cast<uint64_t>(s[pos] - '0');
    ++pos;
  }
  return pos > start;
}

}  // namespace

Vocab Vocab::from_text(std::string_view utf8_text) { return from_chars(decode_utf8(utf8_text)); }

Vocab Vocab::from_chars(std::u32string_view chars) {
  // A bitmap over all code points: one pass, no hashing, already in sorted order.
  std::vector<bool> seen(kMaxCodePoint + 1, false);
  for (char32_t cp : chars) {
    if (cp > kMaxCodePoint) throw std::runtime_error("[data] code point " + describe_char(cp) + " is above U+10FFFF");
    seen[cp] = true;
  }
  Vocab vocab;
  for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
    if (seen[cp]) vocab.chars_.push_back(cp);
  }
  vocab.index_.reserve(vocab.chars_.size());
  for (size_t id = 0; id < vocab.chars_.size(); ++id) vocab.index_.emplace(vocab.chars_[id], static_cast<int64_t>(id));
  return vocab;
}

std::string Vocab::serialize() const {
  std::string out = fmt::format("{}{} {}\n", kMagic, kVersion, chars_.size());
  out += encode_utf8(chars_);
  return out;
}

Vocab Vocab::deserialize(std::string_view blob) {
  if (blob.substr(0, kMagic.size()) != kMagic) corrupt("missing the '" + std::string(kMagic) + "' prefix");
  size_t pos = kMagic.size();
  uint64_t version = 0, count = 0;
  if (!parse_number(blob, pos, version)) corrupt("no version number after the prefix");
  if (version != kVersion) {
    throw std::runtime_error(fmt::format(
        "[data] unsupported vocabulary version {} (this build reads version {}; use a matching nanogpt build or re-prepare the data)",
        version, kVersion));
  }
  if (pos >= blob.size() || blob[pos] != ' ') corrupt("expected a space after the version");
  ++pos;
  if (!parse_number(blob, pos, count)) corrupt("no character count");
  if (pos >= blob.size() || blob[pos] != '\n') corrupt("expected a newline after the character count");
  ++pos;

  std::u32string chars;
  try {
    chars = decode_utf8(blob.substr(pos));
  } catch (const std::exception& e) {
    corrupt(std::string("characters are not valid UTF-8: ") + e.what());
  }
  if (chars.size() != count) {
    corrupt(fmt::format("header says {} characters, found {}", count, chars.size()));
  }
  for (size_t i = 1; i < chars.size(); ++i) {
    if (chars[i - 1] >= chars[i]) corrupt(fmt::format("characters are not sorted and distinct at index {}", i));
  }
  Vocab vocab;
  vocab.chars_ = std::move(chars);
  vocab.index_.reserve(vocab.chars_.size());
  for (size_t id = 0; id < vocab.chars_.size(); ++id) vocab.index_.emplace(vocab.chars_[id], static_cast<int64_t>(id));
  return vocab;
}

char32_t Vocab::char_at(int64_t id) const {
  if (id < 0 || id >= size()) {
    throw std::runtime_error(fmt::format("[data] token id {} is out of range for a vocabulary of {} characters (valid ids: 0..{})",
                                         id, size(), size() - 1));
  }
  return chars_[static_cast<size_t>(id)];
}

std::vector<int64_t> Vocab::encode(std::string_view utf8_text, UnknownChars policy, std::u32string* skipped) const {
  return encode_chars(decode_utf8(utf8_text), policy, skipped);
}

std::vector<int64_t> Vocab::encode_chars(std::u32string_view chars, UnknownChars policy, std::u32string* skipped) const {
  std::vector<int64_t> ids;
  ids.reserve(chars.size());
  for (size_t pos = 0; pos < chars.size(); ++pos) {
    const auto it = index_.find(chars[pos]);
    if (it != index_.end()) {
      ids.push_back(it->second);
    } else if (policy == UnknownChars::Skip) {
      if (skipped) skipped->push_back(chars[pos]);
    } else {
      throw std::runtime_error(fmt::format(
          "[data] character {} at position {} is not in the vocabulary of {} characters (use text from the training "
          "corpus, or skip unknown characters)",
          describe_char(chars[pos]), pos, size()));
    }
  }
  return ids;
}

std::string Vocab::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int64_t id : ids) append_utf8(out, char_at(id));
  return out;
}

std::string Vocab::decode_one(int64_t id) const {
  std::string out;
  append_utf8(out, char_at(id));
  return out;
}

}  // namespace nanogpt::data
