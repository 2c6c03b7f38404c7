// BpeMerges (see bpe_merges.h): the merge loop of the `tokenizers` library's BPE model (a heap of
// candidate merges over a linked list of symbols), so that ties and stale entries resolve alike.
#include "data/bpe_merges.h"

#include <fmt/format.h>

#include <queue>
#include <stdexcept>

namespace nanogpt::data {

void refuse_tokenizer(const std::string& what) {
  throw std::runtime_error("[data] tokenizer.json: " + what + " (a tokenizer this program does not read)");
}

namespace {

bool is_null_or_false(const nlohmann::json& j, const char* key) {
  return !j.contains(key) || j[key].is_null() || (j[key].is_boolean() && !j[key].get<bool>());
}

}  // namespace

BpeMerges::BpeMerges(const nlohmann::json& model) {
  if (model.value("type", std::string()) != "BPE")
    refuse_tokenizer("the model is '" + model.value("type", std::string("none")) + "', not BPE");
  if (!model.contains("dropout") || !model["dropout"].is_null()) {
    if (model.contains("dropout") && !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
      refuse_tokenizer("BPE dropout is set");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty())
      refuse_tokenizer(std::string("the BPE model's ") + key + " is set");
  byte_fallback_ = !is_null_or_false(model, "byte_fallback");
  fuse_unk_ = !is_null_or_false(model, "fuse_unk");
  ignore_merges_ = !is_null_or_false(model, "ignore_merges");
  if (!model.contains("vocab") || !model["vocab"].is_object()) refuse_tokenizer("the BPE model has no vocab object");
  for (const auto& [piece, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 31))
      refuse_tokenizer("the vocabulary's id of '" + piece + "' is not an id");
    const int64_t i = id.get<int64_t>();
    if (i >= static_cast<int64_t>(pieces_.size())) {
      pieces_.resize(i + 1);
      has_piece_.resize(i + 1, false);
    }
    pieces_[i] = piece;
    has_piece_[i] = true;
    ids_[piece] = i;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = ids_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == ids_.end() ? -1 : it->second;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = ids_.find(model["unk_token"].get<std::string>());
    if (it == ids_.end()) refuse_tokenizer("the unknown token '" + model["unk_token"].get<std::string>() + "' is not in the vocabulary");
    unk_id_ = it->second;
  }
  const auto& merges = model.contains("merges") ? model["merges"] : nlohmann::json::array();
  int32_t rank = 0;
  for (const auto& merge : merges) {
    std::string left, right;
    if (merge.is_string()) {  // "left right" (older files)
      const auto text = merge.get<std::string>();
      const auto space = text.find(' ');
      if (space == std::string::npos) refuse_tokenizer("the merge '" + text + "' is not two pieces");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      refuse_tokenizer(fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", rank));
    }
    const auto l = ids_.find(left), r = ids_.find(right), m = ids_.find(left + right);
    if (l == ids_.end() || r == ids_.end() || m == ids_.end())
      refuse_tokenizer("the merge '" + left + "' + '" + right + "' has a piece missing from the vocabulary");
    merges_.emplace(pair_key(l->second, r->second), Merge{rank, static_cast<int32_t>(m->second)});  // the first wins
    ++rank;
  }
}

const std::string* BpeMerges::piece(int64_t id) const {
  return id >= 0 && id < size() && has_piece_[id] ? &pieces_[id] : nullptr;
}

std::optional<int64_t> BpeMerges::id_of(std::string_view piece) const {
  auto it = ids_.find(std::string(piece));
  return it == ids_.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

void BpeMerges::encode_word(std::string_view word, std::vector<int64_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // a word the vocabulary holds whole is that token (Llama 3)
    if (auto it = ids_.find(std::string(word)); it != ids_.end()) return ids.push_back(it->second);
  }
  // The symbols: one a character, or its bytes (byte_fallback), or an unknown token, consecutive
  // unknown characters fused into one when fuse_unk.
  std::vector<int64_t> symbols;
  std::optional<int64_t> pending_unk;
  for (size_t i = 0; i < word.size();) {
    size_t n = 1;
    while (i + n < word.size() && (static_cast<unsigned char>(word[i + n]) & 0xC0) == 0x80) ++n;
    const std::string ch(word.substr(i, n));
    i += n;
    if (auto it = ids_.find(ch); it != ids_.end()) {
      if (pending_unk) symbols.push_back(*pending_unk), pending_unk.reset();
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
      if (all) {  // as the library does: a pending unknown token is not flushed first
        for (unsigned char b : ch) symbols.push_back(byte_ids_[b]);
        continue;
      }
    }
    if (!unk_id_) continue;  // no unknown token: the character is dropped
    if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
    pending_unk = *unk_id_;
  }
  if (pending_unk) symbols.push_back(*pending_unk);

  // Merge: a heap of (rank, position) candidates, lowest rank first and then leftmost; an entry is
  // stale when its symbol was merged away or its right neighbour changed.
  const int64_t n = static_cast<int64_t>(symbols.size());
  std::vector<int64_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int64_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    int32_t rank;
    int64_t pos;
    int32_t new_id;
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate> heap;
  auto consider = [&](int64_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(pair_key(symbols[pos], symbols[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.new_id});
  };
  for (int64_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int64_t right = next[top.pos];
    auto it = merges_.find(pair_key(symbols[top.pos], symbols[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale
    symbols[top.pos] = top.new_id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    consider(prev[top.pos]);
    consider(top.pos);
  }
  for (int64_t i = 0; i < n; ++i)
    if (alive[i]) ids.push_back(symbols[i]);
}

}  // namespace nanogpt::data
