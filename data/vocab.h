// The tokenizer of a dataset and its checkpoints. Two kinds behind one API:
//   char: the sorted set of Unicode code points of a corpus; token id = rank (the default).
//   bpe:  subword pieces, a SentencePiece model trained on the corpus (data/bpe.h); byte fallback,
//         so every text encodes.
//   hf:   an imported Hugging Face tokenizer.json (data/hf_tokenizer.h): GPT-2's, Llama's, ...
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace nanogpt::data {

class BpeModel;
class HfTokenizer;

enum class TokenizerKind { Char, Bpe, Hf };

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
  /// A bpe tokenizer from a serialized SentencePiece model (data/bpe.h's train_bpe) trained for
  /// `requested_vocab_size` pieces. Throws "[data] ..." if the bytes are not a model.
  static Vocab from_bpe_model(std::string model_proto, int64_t requested_vocab_size);
  /// An hf tokenizer from tokenizer.json's text. Throws "[data] tokenizer.json: ..." if it cannot be read.
  static Vocab from_hf_tokenizer(std::string tokenizer_json);
  /// Inverse of serialize(). Throws "[data] corrupt vocabulary: ..." on bad input.
  static Vocab deserialize(std::string_view blob);

  /// A self-describing string (stored in meta files and checkpoints), plain UTF-8 text after a short
  /// versioned prefix: char: the code points in order; bpe: the SentencePiece model in base64.
  std::string serialize() const;

  TokenizerKind kind() const { return hf_ ? TokenizerKind::Hf : bpe_ ? TokenizerKind::Bpe : TokenizerKind::Char; }
  const char* kind_name() const { return hf_ ? "hf" : bpe_ ? "bpe" : "char"; }
  /// The imported tokenizer (hf only; nullptr otherwise).
  const HfTokenizer* hf_tokenizer() const { return hf_.get(); }
  /// The vocab_size a bpe tokenizer was trained for (its size() may be smaller); 0 for char.
  int64_t requested_vocab_size() const { return requested_vocab_size_; }

  int64_t size() const;
  bool contains(char32_t cp) const;    // char: in the vocabulary; bpe, hf: always (byte fallback or bytes)
  char32_t char_at(int64_t id) const;  // char only; throws on out-of-range id, or naming a bpe tokenizer
  /// Throws "[<tag>] <what> needs a character vocabulary, but this one is bpe ... (<hint>)" unless char.
  void require_char(const std::string& tag, const std::string& what, const std::string& hint) const;

  /// UTF-8 text -> token ids. `skipped` (optional) receives the dropped characters in Skip mode
  /// (every occurrence, in order). Error positions are character indices, not byte offsets. A bpe
  /// tokenizer knows every character (byte fallback): the policy does not arise. An hf tokenizer
  /// encodes as tokenizer(text) does in transformers (its special tokens added; invalid UTF-8
  /// replaced by U+FFFD).
  std::vector<int64_t> encode(std::string_view utf8_text, UnknownChars policy = UnknownChars::Error,
                              std::u32string* skipped = nullptr) const;
  /// Same as encode(), on already-decoded text.
  std::vector<int64_t> encode_chars(std::u32string_view chars, UnknownChars policy = UnknownChars::Error,
                                    std::u32string* skipped = nullptr) const;
  /// Token ids -> UTF-8 text (always valid UTF-8). Throws on out-of-range ids.
  std::string decode(const std::vector<int64_t>& ids) const;
  /// One token -> its bytes: concatenated over a sequence they give decode()'s text (a bpe byte
  /// piece alone is one byte, maybe not valid UTF-8 by itself).
  std::string decode_one(int64_t id) const;
  /// One token as a label for a person (valid UTF-8): the character; a bpe piece with its spaces,
  /// or a byte piece as <0xE6>.
  std::string piece(int64_t id) const;

  const std::u32string& chars() const { return chars_; }  // char only (empty for bpe)
  bool operator==(const Vocab& other) const;

 private:
  std::u32string chars_;                         // char: sorted, distinct
  std::unordered_map<char32_t, int64_t> index_;  // char: code point -> id
  std::shared_ptr<const BpeModel> bpe_;          // bpe: the model (shared: copies are cheap)
  std::shared_ptr<const HfTokenizer> hf_;        // hf: the tokenizer (shared)
  int64_t requested_vocab_size_ = 0;
};

}  // namespace nanogpt::data
