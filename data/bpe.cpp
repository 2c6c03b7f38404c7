// SentencePiece behind one file: training (trainer settings chosen for text as it is, in any script)
// and the processor that encodes and decodes.
#include "data/bpe.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "data/utf8.h"

namespace nanogpt::data {
namespace {

// Feeds SentencePiece's trainer from a callback.
class CallbackSentences : public sentencepiece::SentenceIterator {
 public:
  explicit CallbackSentences(const std::function<bool(std::string&)>& next) : next_(next) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !next_(sentence_); }
  const std::string& value() const override { return sentence_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::function<bool(std::string&)>& next_;
  std::string sentence_;
  bool done_ = false;
};

}  // namespace

struct BpeModel::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

BpeModel::BpeModel() : impl_(std::make_unique<Impl>()) {}
BpeModel::~BpeModel() = default;

std::shared_ptr<const BpeModel> BpeModel::load(std::string model_proto) {
  std::shared_ptr<BpeModel> model(new BpeModel());
  const auto status = model->impl_->sp.LoadFromSerializedProto(model_proto);
  if (!status.ok()) throw std::runtime_error("[data] not a SentencePiece model: " + status.ToString());
  if (model->impl_->sp.GetPieceSize() < 1) throw std::runtime_error("[data] the SentencePiece model has no pieces");
  model->proto_ = std::move(model_proto);
  return model;
}

int64_t BpeModel::size() const { return impl_->sp.GetPieceSize(); }

std::vector<int64_t> BpeModel::encode(std::string_view utf8_text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(std::string(utf8_text), &ids);
  if (!status.ok()) throw std::runtime_error("[data] SentencePiece could not encode the text: " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string BpeModel::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id >= size()) {
      throw std::runtime_error(fmt::format(
          "[data] token id {} is out of range for a bpe vocabulary of {} pieces (valid ids: 0..{})", id, size(), size() - 1));
    }
    narrow.push_back(static_cast<int>(id));
  }
  std::string text;
  const auto status = impl_->sp.Decode(narrow, &text);
  if (!status.ok()) throw std::runtime_error("[data] SentencePiece could not decode the ids: " + status.ToString());
  return text;
}

std::string BpeModel::bytes_of(int64_t id) const {
  if (id < 0 || id >= size()) decode({id});  // throws the range error
  const int i = static_cast<int>(id);
  const std::string& piece = impl_->sp.IdToPiece(i);
  if (impl_->sp.IsByte(i)) return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));  // <0xE6>
  if (impl_->sp.IsUnknown(i)) return "\xEF\xBF\xBD";  // U+FFFD
  if (impl_->sp.IsControl(i)) return "";
  std::string out;
  constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.compare(pos, kSpace.size(), kSpace) == 0) {
      out += ' ';
      pos += kSpace.size();
    } else {
      out += piece[pos++];
    }
  }
  return out;
}

std::string BpeModel::piece(int64_t id) const {
  if (id < 0 || id >= size()) decode({id});  // throws the range error
  const int i = static_cast<int>(id);
  if (impl_->sp.IsByte(i) || impl_->sp.IsUnknown(i) || impl_->sp.IsControl(i)) return impl_->sp.IdToPiece(i);
  return bytes_of(id);
}

int64_t bpe_char_budget(int64_t vocab_size) { return std::max<int64_t>(1, (vocab_size - kBpeReservedPieces) / 2); }

std::string train_bpe(const std::function<bool(std::string&)>& next_sentence, int64_t vocab_size) {
  if (vocab_size <= kBpeReservedPieces) {
    throw std::runtime_error(fmt::format(
        "[data] vocab_size ({}) is too small for a bpe tokenizer: it must exceed the {} reserved pieces (<unk>, the "
        "newline, 256 bytes); try 512 or more",
        vocab_size, kBpeReservedPieces));
  }
  const std::unordered_map<std::string, std::string> settings = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", "false"},        // a short text may not fill vocab_size: take fewer pieces
      {"byte_fallback", "true"},            // no character is ever unknown
      {"character_coverage", "1.0"},      // the caller chose the characters (bpe_char_budget)
      {"normalization_rule_name", "identity"},  // the text as it is: decode(encode(x)) == x
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},  // runs of spaces (indentation) are pieces too
      {"user_defined_symbols", "\n"},       // a newline is one piece, and no piece crosses a line
      {"split_digits", "true"},
      {"max_sentence_length", "65536"},     // bytes; prepare hands out lines cut shorter than this
      {"input_sentence_size", "2000000"},   // sentences sampled for training, at most
      {"shuffle_input_sentence", "true"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"num_threads", "2"},
      {"minloglevel", "2"},  // errors only: the trainer's progress would flood the terminal
  };
  CallbackSentences sentences(next_sentence);
  std::string proto;
  const auto status = sentencepiece::SentencePieceTrainer::Train(settings, &sentences, &proto);
  if (!status.ok()) {
    throw std::runtime_error("[data] training the bpe tokenizer failed: " + escape_controls(status.ToString()) +
                             " (try another vocab_size, or more text)");
  }
  return proto;
}

}  // namespace nanogpt::data
