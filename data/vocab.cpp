// The tokenizer (char or bpe), with a versioned text serialization.
//
// Serialized forms (plain text, so a checkpoint's vocabulary can be read with `less`):
//   char: "nanogpt-vocab/1 <count>\n" followed by the <count> code points, UTF-8 encoded, ascending.
//   bpe:  "nanogpt-vocab/2 bpe <requested vocab_size> <length>\n" followed by the SentencePiece model
//         (its ModelProto bytes) in base64, <length> characters.
//   hf:   "nanogpt-vocab/3 hf <length>\n" followed by tokenizer.json's text, <length> bytes.
#include "data/vocab.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "data/bpe.h"
#include "data/hf_tokenizer.h"
#include "data/utf8.h"

namespace nanogpt::data {
namespace {

constexpr std::string_view kVocabMagic = "nanogpt-vocab/";
constexpr int kVersion = 1;     // char
constexpr int kBpeVersion = 2;  // bpe
constexpr int kHfVersion = 3;   // hf
constexpr std::string_view kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

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

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (size_t k = 0; k < 3; ++k) group = (group << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kBase64[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

std::string base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) corrupt("the bpe model's base64 length is not a multiple of 4");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t group = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      size_t value = 0;
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++pad;
      } else if (pad > 0 || (value = kBase64.find(c)) == std::string_view::npos) {
        corrupt(fmt::format("the bpe model's base64 holds an invalid character at {}", i + k));
      }
      group = (group << 6) | static_cast<uint32_t>(value);
    }
    for (int k = 0; k < 3 - pad; ++k) out += static_cast<char>((group >> (16 - 8 * k)) & 0xFF);
  }
  return out;
}

}  // namespace

Vocab Vocab::from_bpe_model(std::string model_proto, int64_t requested_vocab_size) {
  Vocab vocab;
  vocab.bpe_ = BpeModel::load(std::move(model_proto));
  vocab.requested_vocab_size_ = requested_vocab_size;
  return vocab;
}

Vocab Vocab::from_hf_tokenizer(std::string tokenizer_json) {
  Vocab vocab;
  vocab.hf_ = HfTokenizer::load(std::move(tokenizer_json));
  return vocab;
}

int64_t Vocab::size() const {
  return hf_ ? hf_->size() : bpe_ ? bpe_->size() : static_cast<int64_t>(chars_.size());
}

bool Vocab::contains(char32_t cp) const { return bpe_ || hf_ || index_.count(cp) != 0; }

bool Vocab::operator==(const Vocab& other) const {
  if (kind() != other.kind()) return false;
  if (hf_) return hf_->json() == other.hf_->json();
  return bpe_ ? bpe_->proto() == other.bpe_->proto() : chars_ == other.chars_;
}

void Vocab::require_char(const std::string& tag, const std::string& what, const std::string& hint) const {
  if (!bpe_ && !hf_) return;
  throw std::runtime_error(fmt::format("[{}] {} needs a character vocabulary, but this one is {} ({} subword pieces): {}",
                                       tag, what, kind_name(), size(), hint));
}

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
  if (hf_) return fmt::format("{}{} hf {}\n", kVocabMagic, kHfVersion, hf_->json().size()) + hf_->json();
  if (bpe_) {
    const std::string model = base64_encode(bpe_->proto());
    return fmt::format("{}{} bpe {} {}\n", kVocabMagic, kBpeVersion, requested_vocab_size_, model.size()) + model;
  }
  std::string out = fmt::format("{}{} {}\n", kVocabMagic, kVersion, chars_.size());
  out += encode_utf8(chars_);
  return out;
}

Vocab Vocab::deserialize(std::string_view blob) {
  if (blob.substr(0, kVocabMagic.size()) != kVocabMagic) corrupt("missing the '" + std::string(kVocabMagic) + "' prefix");
  size_t pos = kVocabMagic.size();
  uint64_t version = 0, count = 0;
  if (!parse_number(blob, pos, version)) corrupt("no version number after the prefix");
  if (version != kVersion && version != kBpeVersion && version != kHfVersion) {
    throw std::runtime_error(fmt::format(
        "[data] unsupported vocabulary version {} (this build reads versions {} to {}; use a matching nanogpt build or "
        "re-prepare the data)",
        version, kVersion, kHfVersion));
  }
  if (pos >= blob.size() || blob[pos] != ' ') corrupt("expected a space after the version");
  ++pos;
  if (version == kHfVersion) {
    uint64_t length = 0;
    if (blob.substr(pos, 3) != "hf ") corrupt("expected 'hf' after the version");
    pos += 3;
    if (!parse_number(blob, pos, length) || pos >= blob.size() || blob[pos++] != '\n') corrupt("no tokenizer length");
    if (blob.size() - pos != length)
      corrupt(fmt::format("header says a tokenizer of {} bytes, found {}", length, blob.size() - pos));
    try {
      return from_hf_tokenizer(std::string(blob.substr(pos)));
    } catch (const std::runtime_error& e) {
      corrupt(e.what());
    }
  }
  if (version == kBpeVersion) {
    uint64_t requested = 0, length = 0;
    if (blob.substr(pos, 4) != "bpe ") corrupt("expected 'bpe' after the version");
    pos += 4;
    if (!parse_number(blob, pos, requested) || pos >= blob.size() || blob[pos++] != ' ') corrupt("no vocab_size");
    if (!parse_number(blob, pos, length) || pos >= blob.size() || blob[pos++] != '\n') corrupt("no model length");
    if (blob.size() - pos != length) {
      corrupt(fmt::format("header says a model of {} characters, found {}", length, blob.size() - pos));
    }
    try {
      return from_bpe_model(base64_decode(blob.substr(pos)), static_cast<int64_t>(requested));
    } catch (const std::runtime_error& e) {
      if (std::string_view(e.what()).find("corrupt vocabulary") != std::string_view::npos) throw;
      corrupt(e.what());
    }
  }
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
  require_char("data", "a token's character", "ask for decode_one() or piece() instead");
  if (id < 0 || id >= size()) {
    throw std::runtime_error(fmt::format("[data] token id {} is out of range for a vocabulary of {} characters (valid ids: 0..{})",
                                         id, size(), size() - 1));
  }
  return chars_[static_cast<size_t>(id)];
}

std::vector<int64_t> Vocab::encode(std::string_view utf8_text, UnknownChars policy, std::u32string* skipped) const {
  if (hf_) return hf_->encode(utf8_text);
  if (bpe_) {
    decode_utf8(utf8_text);  // refuses invalid UTF-8, as the char tokenizer does
    return bpe_->encode(utf8_text);
  }
  return encode_chars(decode_utf8(utf8_text), policy, skipped);
}

std::vector<int64_t> Vocab::encode_chars(std::u32string_view chars, UnknownChars policy, std::u32string* skipped) const {
  if (hf_) return hf_->encode(encode_utf8(chars));
  if (bpe_) return bpe_->encode(encode_utf8(chars));
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
  if (hf_) return hf_->decode(ids);
  if (bpe_) return bpe_->decode(ids);
  std::string out;
  out.reserve(ids.size());
  for (int64_t id : ids) append_utf8(out, char_at(id));
  return out;
}

std::string Vocab::decode_one(int64_t id) const {
  if (hf_) return hf_->bytes_of(id);
  if (bpe_) return bpe_->bytes_of(id);
  std::string out;
  append_utf8(out, char_at(id));
  return out;
}

std::string Vocab::piece(int64_t id) const {
  if (hf_) return replace_invalid_utf8(hf_->piece(id));
  return bpe_ ? bpe_->piece(id) : decode_one(id);
}

}  // namespace nanogpt::data
