// Character vocabulary: the sorted set of Unicode code points of a corpus. Token id = rank.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace nanogpt::data {

/// What encode() does with a character that is not in the vocabulary.
enum class UnknownChars {
  Error,  // throw "[data] character 'x' (U+0078) at position 12 is not in the vocabulary ..."
  Skip,   // drop it (the caller may warn with the list returned through `skipped`)
};

class Vocab {
 public:
  Vocab() = default;
  /// Sorted distinct code points of `utf8_text` (which must be valid UTF-8).
  static Vocab from_text(std::string_view utf8_text);
  /// Sorted distinct code points of already-decoded text.
  static Vocab from_chars(std::u32string_view chars);
  /// Inverse of serialize(). Throws "[data] corrupt vocabulary: ..." on bad input.
  static Vocab deserialize(std::string_view blob);

  /// A self-describing string (stored in meta files and checkpoints): the code points in order,
  /// UTF-8 encoded, after a short versioned prefix.
  std::string serialize() const;

  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  bool contains(char32_t cp) const { return index_.count(cp) != 0; }
  char32_t char_at(int64_t id) const;  // throws on out-of-range id

  /// UTF-8 text -> token ids. `skipped` (optional) receives the dropped characters in Skip mode
  /// (every occurrence, in order). Error positions are character indices, not byte offsets.
  std::vector<int64_t> encode(std::string_view utf8_text, UnknownChars policy = UnknownChars::Error,
                              std::u32string* skipped = nullptr) const;
  /// Same as encode(), on already-decoded text.
  std::vector<int64_t> encode_chars(std::u32string_view chars, UnknownChars policy = UnknownChars::Error,
                                    std::u32string* skipped = nullptr) const;
  /// Token ids -> UTF-8 text (always valid UTF-8). Throws on out-of-range ids.
  std::string decode(const std::vector<int64_t>& ids) const;
  /// One token -> its UTF-8 bytes.
  std::string decode_one(int64_t id) const;

  const std::u32string& chars() const { return chars_; }
  bool operator==(const Vocab& other) const { return chars_ == other.chars_; }

 private:
  std::u32string chars_;                         // sorted, distinct
  std::unordered_map<char32_t, int64_t> index_;  // code point -> id
};

}  // namespace nanogpt::data
