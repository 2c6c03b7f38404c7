// The subword tokenizer: a SentencePiece BPE model, trained at prepare time on the training split.
// Byte fallback gives every byte its own piece, so no character is ever unknown (a Chinese character
// the training text lacked becomes its three UTF-8 bytes); the text is taken as it is (no
// normalisation, no added or removed spaces) and a newline is a piece of its own, so decoding the
// ids gives back exactly the text encoded. SentencePiece stays behind this file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nanogpt::data {

class BpeModel {
 public:
  /// Loads a serialized SentencePiece model (ModelProto bytes). Throws "[data] ..." if they are not one.
  static std::shared_ptr<const BpeModel> load(std::string model_proto);
  ~BpeModel();

  int64_t size() const;  // pieces, byte pieces and <unk> included
  const std::string& proto() const { return proto_; }

  /// UTF-8 text -> ids (never fails on valid UTF-8: unknown characters become byte pieces).
  std::vector<int64_t> encode(std::string_view utf8_text) const;
  /// ids -> text; byte pieces that do not form valid UTF-8 become U+FFFD. Throws on out-of-range ids.
  std::string decode(const std::vector<int64_t>& ids) const;
  /// The bytes one id stands for (a byte piece: that single byte, maybe not valid UTF-8 alone).
  std::string bytes_of(int64_t id) const;
  /// The piece as text for a person: '▁' shown as a space, a byte piece as <0xE6>.
  std::string piece(int64_t id) const;

 private:
  BpeModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string proto_;
};

/// Trains a BPE model of `vocab_size` pieces on the sentences `next_sentence` hands out (it returns
/// false at the end). Returns the serialized model. Throws "[data] ..." with SentencePiece's reason.
std::string train_bpe(const std::function<bool(std::string&)>& next_sentence, int64_t vocab_size);

/// How many distinct characters a bpe vocabulary of `vocab_size` keeps whole: half of the learned
/// pieces (merges get the rest). Training sees only the most frequent this many (sentences are cut
/// at any other), so every other character falls back to its bytes.
int64_t bpe_char_budget(int64_t vocab_size);

/// Pieces every bpe vocabulary holds besides the learned ones: <unk>, the newline and 256 bytes.
constexpr int64_t kBpeReservedPieces = 258;

}  // namespace nanogpt::data
