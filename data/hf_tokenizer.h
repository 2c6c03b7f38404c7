// A Hugging Face tokenizer read from its tokenizer.json, run as the `tokenizers` library runs it:
// added (special) tokens cut out of the text first, then the normalizer, the pre-tokenizer, the BPE
// model (data/bpe_merges.h) and the post-processor; the decoder on the way back. Two families:
//   byte-level BPE (GPT-2, Llama 3, Qwen): a split pattern (regex_split.h), every byte of a piece
//       written as one printable character (GPT-2's byte map), merges over those characters;
//   SentencePiece-style BPE (Llama 2, Mistral): spaces become '▁' (a Prepend and Replace normalizer,
//       or a Metaspace pre-tokenizer), merges over characters, byte fallback (<0xE4>) for the rest.
// Steps of another kind (NFC or other normalizers, WordPiece, Unigram, ...) are refused by name.
// Invalid UTF-8 is replaced by U+FFFD before encoding, as Python's bytes.decode(errors="replace").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nanogpt::data {

class HfTokenizer {
 public:
  /// Parses tokenizer.json's text. Throws std::runtime_error "[data] tokenizer.json: ..." naming
  /// what it cannot read.
  static std::shared_ptr<const HfTokenizer> load(std::string json_text);
  ~HfTokenizer();

  const std::string& json() const { return json_; }
  /// One more than the largest id (the model's pieces and the added tokens).
  int64_t size() const;

  /// Text -> ids, as tokenizer(text)["input_ids"] (add_special_tokens: the post-processor's tokens,
  /// e.g. Llama's <s> in front).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;
  /// Ids -> text, as tokenizer.decode(ids) (special tokens kept). Throws on an id it does not know.
  std::string decode(const std::vector<int64_t>& ids) const;
  /// The bytes one token stands for, for text streamed token by token: a byte token's byte, a
  /// piece's '▁' as a space (no first-space strip), GPT-2's byte characters as their bytes.
  std::string bytes_of(int64_t id) const;
  /// The token as written in the vocabulary ("Ġthe", "▁the", "<0x0A>", "<|endoftext|>").
  std::string piece(int64_t id) const;
  /// The id of an added token (e.g. "<|endoftext|>", "</s>"), if the file has it.
  std::optional<int64_t> added_token_id(std::string_view content) const;

 private:
  HfTokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string json_;
};

}  // namespace nanogpt::data
