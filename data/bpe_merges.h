// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}): a vocabulary of
// pieces, merges in order of priority, and for a piece no merge reaches, its bytes as <0xXX> tokens
// (byte_fallback, SentencePiece's way) or an unknown token. Encodes one pre-tokenized word at a time
// exactly as the `tokenizers` library does: the pair of lowest rank merges first, the leftmost of
// equal ranks, until no pair of neighbours is a merge.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace nanogpt::data {

class BpeMerges {
 public:
  /// From tokenizer.json's "model" object. Throws std::runtime_error "[data] tokenizer.json: ..."
  /// naming a setting this model does not implement (dropout, a subword prefix or suffix) or a merge
  /// whose pieces are not in the vocabulary.
  explicit BpeMerges(const nlohmann::json& model);

  /// One word (a piece of text after pre-tokenization, UTF-8) -> token ids, appended to `ids`.
  void encode_word(std::string_view word, std::vector<int64_t>& ids) const;

  /// The piece of `id`, or nullptr if the vocabulary has none.
  const std::string* piece(int64_t id) const;
  std::optional<int64_t> id_of(std::string_view piece) const;
  /// One more than the largest id in the vocabulary.
  int64_t size() const { return static_cast<int64_t>(pieces_.size()); }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int64_t left, int64_t right) {
    return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
  }

  std::unordered_map<std::string, int64_t> ids_;  // piece -> id
  std::vector<std::string> pieces_;               // id -> piece ("" where the vocabulary skips an id)
  std::vector<bool> has_piece_;
  std::unordered_map<uint64_t, Merge> merges_;    // (left id, right id) -> its rank and the merged id
  std::optional<int64_t> unk_id_;
  int64_t byte_ids_[256];  // <0x00> .. <0xFF>, -1 where missing (byte_fallback only)
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
};

/// Throws "[data] tokenizer.json: <what> (a tokenizer this program does not read)".
[[noreturn]] void refuse_tokenizer(const std::string& what);

}  // namespace nanogpt::data
