// Fuzz target (a): the UTF-8 decoder and the character vocabulary.
//
// Properties checked on every input, beyond "no crash, no UB":
//  - decode_utf8 either throws "[data] invalid UTF-8 ..." or round-trips exactly through encode_utf8
//    (a strict decoder accepts only the one canonical encoding of each code point);
//  - for valid text, Vocab::from_text + encode + decode gives the text back, and every id is in range;
//  - a vocabulary built from one half of the input encodes the other half: Error mode throws a clear
//    "[data]" error or succeeds; Skip mode drops exactly the unknown characters;
//  - Vocab::deserialize on the raw bytes throws "[data] ..." or yields a vocabulary that survives
//    serialize -> deserialize unchanged; serialize -> deserialize of any built vocabulary is exact.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "data/utf8.h"
#include "data/vocab.h"
#include "tests/fuzz/fuzz_common.h"

using namespace nanogpt;
using nanogpt::fuzz::expect_clear_error;
using nanogpt::fuzz::finding;

namespace {

void check_vocab_round_trip(const data::Vocab& vocab) {
  const data::Vocab back = data::Vocab::deserialize(vocab.serialize());
  if (!(back == vocab)) finding("Vocab serialize -> deserialize changed the vocabulary");
}

void check_text(std::string_view text) {
  std::u32string chars;
  try {
    chars = data::decode_utf8(text);
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[data] invalid UTF-8 at byte offset ");
    return;
  }
  if (data::encode_utf8(chars) != text) finding("decode_utf8 accepted a non-canonical encoding");

  const data::Vocab vocab = data::Vocab::from_text(text);
  if (vocab.size() > static_cast<int64_t>(chars.size())) finding("vocabulary larger than the text");
  const std::vector<int64_t> ids = vocab.encode(text);
  if (ids.size() != chars.size()) finding("encode returned a different number of ids than characters");
  for (int64_t id : ids)
    if (id < 0 || id >= vocab.size()) finding("encode returned an out-of-range id");
  if (vocab.decode(ids) != text) finding("decode(encode(text)) != text");
  check_vocab_round_trip(vocab);

  // A vocabulary of the first half, used on the second half.
  const std::u32string_view all(chars);
  const data::Vocab half = data::Vocab::from_chars(all.substr(0, all.size() / 2));
  const std::u32string_view rest = all.substr(all.size() / 2);
  std::u32string skipped;
  const auto kept = half.encode_chars(rest, data::UnknownChars::Skip, &skipped);
  size_t unknown = 0;
  for (char32_t c : rest) unknown += half.contains(c) ? 0 : 1;
  if (skipped.size() != unknown || kept.size() + unknown != rest.size()) finding("Skip mode dropped the wrong characters");
  try {
    half.encode_chars(rest);
    if (unknown != 0) finding("Error mode accepted unknown characters");
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[data] character ");
    if (unknown == 0) finding("Error mode threw without unknown characters");
  }
  // Out-of-range ids must throw, not read past the table.
  for (int64_t bad : {int64_t{-1}, vocab.size(), INT64_MIN, INT64_MAX}) {
    try {
      vocab.decode_one(bad);
      finding("decode_one accepted id " + std::to_string(bad));
    } catch (const std::runtime_error& e) {
      expect_clear_error(e, "[data] token id ");
    }
  }
}

void check_deserialize(std::string_view blob) {
  data::Vocab vocab;
  try {
    vocab = data::Vocab::deserialize(blob);
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[data] ");
    return;
  }
  for (int64_t id = 1; id < vocab.size() && vocab.kind() == data::TokenizerKind::Char; ++id)  // bpe has no characters
    if (vocab.char_at(id - 1) >= vocab.char_at(id)) finding("deserialize accepted unsorted characters");
  check_vocab_round_trip(vocab);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  check_text(bytes);
  check_deserialize(bytes);
  // The same bytes behind a valid prefix, so deserialize gets past the header more often.
  std::string prefixed = "nanogpt-vocab/1 ";
  prefixed += bytes;
  check_deserialize(prefixed);
  return 0;
}
