// HfTokenizer (see hf_tokenizer.h): each step of tokenizer.json read into a small struct, and the
// steps run in the library's order. Comments name the library's behaviour where it is not obvious.
#include "data/hf_tokenizer.h"

#include <fmt/format.h>

#include <array>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_map>

#include "data/bpe_merges.h"
#include "data/regex_split.h"
#include "data/utf8.h"

namespace nanogpt::data {
namespace {

using Json = nlohmann::json;

// GPT-2's split pattern, which the ByteLevel pre-tokenizer uses when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const Json& j) { return j.is_object() ? j.value("type", std::string("?")) : std::string("?"); }

// A step and, when it is a Sequence, the steps inside it, flattened.
std::vector<Json> flatten(const Json& step, const char* list_key) {
  if (step.is_null()) return {};
  if (type_of(step) != "Sequence") return {step};
  std::vector<Json> out;
  for (const auto& inner : step.at(list_key)) {
    auto more = flatten(inner, list_key);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

// GPT-2's byte map: printable bytes stand for themselves, the others for U+0100 onwards, in order.
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<char32_t, unsigned char> to_byte;
  ByteMap() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      append_utf8(to_char[b], cp);
      to_byte[cp] = static_cast<unsigned char>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  for (size_t pos = 0; (pos = text.find(from, pos)) != std::string::npos; pos += to.size()) text.replace(pos, from.size(), to);
  return text;
}

std::string string_pattern(const Json& pattern, const char* where) {
  if (pattern.is_object() && pattern.contains("String")) return pattern["String"].get<std::string>();
  refuse_tokenizer(std::string(where) + " with a regex pattern");
}

struct Normalize {
  enum Kind { prepend, replace } kind;
  std::string a, b;  // prepend: a; replace: a -> b
};

struct PreTokenize {
  enum Kind { byte_level, split, metaspace } kind;
  bool add_prefix_space = false;
  std::shared_ptr<RegexSplit> regex;  // byte_level with use_regex, split
  bool removed = false;               // split: drop the matches (behavior Removed) instead of isolating them
  std::string replacement;            // metaspace: "▁"
  std::string prepend_scheme;         // metaspace: always | first | never
  bool split_words = false;           // metaspace: cut before each replacement
};

struct Decode {
  enum Kind { byte_level, replace, byte_fallback, fuse, strip, metaspace } kind;
  std::string a, b;          // replace: a -> b; strip: the character; metaspace: the replacement
  int start = 0, stop = 0;   // strip
  bool prepend = true;       // metaspace: strip the first token's leading space
};

struct Added {
  int64_t id;
  std::string content;
  bool lstrip, rstrip, special;
};

struct Piece {
  std::string text;
  bool at_start;  // begins at the start of the text (Metaspace's "first" scheme)
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::optional<int> byte_token(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  const int hi = hex(token[3]), lo = hex(token[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return hi * 16 + lo;
}

}  // namespace

struct HfTokenizer::Impl {
  std::unique_ptr<BpeMerges> model;
  std::vector<Normalize> normalizers;
  std::vector<PreTokenize> pre_tokenizers;
  std::vector<Decode> decoders;
  bool has_decoder = false;
  std::vector<Added> added;                          // longest content first
  std::unordered_map<int64_t, size_t> added_by_id;   // id -> index in added
  std::array<bool, 256> added_starts{};              // bytes an added token begins with
  std::vector<int64_t> prefix, suffix;               // the post-processor's tokens around the text
  int64_t size = 0;

  void read_normalizer(const Json& j);
  void read_pre_tokenizer(const Json& j);
  void read_decoder(const Json& j);
  void read_post_processor(const Json& j);

  std::string normalize(std::string text) const;
  std::vector<Piece> pre_tokenize(Piece piece) const;
  void encode_text(const std::string& text, bool at_start, std::vector<int64_t>& ids,
                   std::unordered_map<std::string, std::vector<int64_t>>& cache) const;
  std::string token_of(int64_t id) const;
  std::string run_decoders(std::vector<std::string> tokens, bool streaming) const;
};

void HfTokenizer::Impl::read_normalizer(const Json& j) {
  for (const auto& step : flatten(j, "normalizers")) {
    const auto type = type_of(step);
    if (type == "Prepend") normalizers.push_back({Normalize::prepend, step.at("prepend").get<std::string>(), ""});
    else if (type == "Replace")
      normalizers.push_back({Normalize::replace, string_pattern(step.at("pattern"), "a Replace normalizer"),
                             step.at("content").get<std::string>()});
    else refuse_tokenizer("the normalizer '" + type + "'");
  }
}

void HfTokenizer::Impl::read_pre_tokenizer(const Json& j) {
  for (const auto& step : flatten(j, "pretokenizers")) {
    const auto type = type_of(step);
    PreTokenize p;
    if (type == "ByteLevel") {
      p.kind = PreTokenize::byte_level;
      p.add_prefix_space = step.value("add_prefix_space", false);
      if (step.value("use_regex", true)) p.regex = std::make_shared<RegexSplit>(kGpt2Pattern);
    } else if (type == "Split") {
      p.kind = PreTokenize::split;
      if (step.value("invert", false)) refuse_tokenizer("an inverted Split pre-tokenizer");
      const auto behavior = step.value("behavior", std::string());
      if (behavior != "Isolated" && behavior != "Removed") refuse_tokenizer("a Split pre-tokenizer with behavior '" + behavior + "'");
      p.removed = behavior == "Removed";
      const auto& pattern = step.at("pattern");
      if (pattern.contains("Regex")) p.regex = std::make_shared<RegexSplit>(pattern["Regex"].get<std::string>());
      else p.regex = std::make_shared<RegexSplit>(pattern.at("String").get<std::string>(), /*literal=*/true);
    } else if (type == "Metaspace") {
      p.kind = PreTokenize::metaspace;
      p.replacement = step.value("replacement", std::string("\u2581"));
      p.prepend_scheme = step.value("prepend_scheme", step.value("add_prefix_space", true) ? "always" : "never");
      p.split_words = step.value("split", true);
    } else {
      refuse_tokenizer("the pre-tokenizer '" + type + "'");
    }
    pre_tokenizers.push_back(std::move(p));
  }
}

void HfTokenizer::Impl::read_decoder(const Json& j) {
  has_decoder = !j.is_null();
  for (const auto& step : flatten(j, "decoders")) {
    const auto type = type_of(step);
    Decode d;
    if (type == "ByteLevel") d.kind = Decode::byte_level;
    else if (type == "ByteFallback") d.kind = Decode::byte_fallback;
    else if (type == "Fuse") d.kind = Decode::fuse;
    else if (type == "Replace") {
      d.kind = Decode::replace;
      d.a = string_pattern(step.at("pattern"), "a Replace decoder");
      d.b = step.at("content").get<std::string>();
    } else if (type == "Strip") {
      d.kind = Decode::strip;
      d.a = step.at("content").get<std::string>();
      d.start = step.value("start", 0);
      d.stop = step.value("stop", 0);
    } else if (type == "Metaspace") {
      d.kind = Decode::metaspace;
      d.a = step.value("replacement", std::string("\u2581"));
      d.prepend = step.value("prepend_scheme", step.value("add_prefix_space", true) ? "always" : "never") != "never";
    } else {
      refuse_tokenizer("the decoder '" + type + "'");
    }
    decoders.push_back(std::move(d));
  }
}

void HfTokenizer::Impl::read_post_processor(const Json& j) {
  for (const auto& step : flatten(j, "processors")) {
    const auto type = type_of(step);
    if (type == "ByteLevel") continue;  // it only trims offsets
    if (type != "TemplateProcessing") refuse_tokenizer("the post-processor '" + type + "'");
    bool after = false;
    for (const auto& item : step.at("single")) {
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      const auto name = item.at("SpecialToken").at("id").get<std::string>();
      const auto& special = step.at("special_tokens");
      if (!special.contains(name)) refuse_tokenizer("the post-processor's token '" + name + "' has no ids");
      for (const auto& id : special[name].at("ids")) (after ? suffix : prefix).push_back(id.get<int64_t>());
    }
  }
}

std::string HfTokenizer::Impl::normalize(std::string text) const {
  for (const auto& n : normalizers) {
    if (n.kind == Normalize::prepend) {
      if (!text.empty()) text = n.a + text;
    } else {
      text = replace_all(std::move(text), n.a, n.b);
    }
  }
  return text;
}

std::vector<Piece> HfTokenizer::Impl::pre_tokenize(Piece whole) const {
  std::vector<Piece> pieces{std::move(whole)};
  for (const auto& p : pre_tokenizers) {
    std::vector<Piece> out;
    for (auto& piece : pieces) {
      if (p.kind == PreTokenize::metaspace) {
        std::string text = replace_all(std::move(piece.text), " ", p.replacement);
        const bool prepend = p.prepend_scheme == "always" || (p.prepend_scheme == "first" && piece.at_start);
        if (prepend && text.compare(0, p.replacement.size(), p.replacement) != 0) text = p.replacement + text;
        if (!p.split_words) {
          out.push_back({text, piece.at_start});
          continue;
        }
        size_t begin = 0;  // each word keeps the replacement in front of it (MergedWithNext)
        for (size_t pos = text.find(p.replacement, 1); pos != std::string::npos; pos = text.find(p.replacement, pos + 1)) {
          if (pos == begin) continue;
          out.push_back({text.substr(begin, pos - begin), piece.at_start && begin == 0});
          begin = pos;
        }
        if (begin < text.size()) out.push_back({text.substr(begin), piece.at_start && begin == 0});
        continue;
      }
      std::string text = std::move(piece.text);
      if (p.kind == PreTokenize::byte_level && p.add_prefix_space && text.compare(0, 1, " ") != 0) text = " " + text;
      std::vector<std::string> parts;
      if (p.regex) {
        for (auto part : p.regex->split(text, p.removed)) parts.emplace_back(part);
      } else {
        parts.push_back(text);
      }
      for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].empty()) continue;
        if (p.kind == PreTokenize::byte_level) {  // every byte as its printable character
          std::string mapped;
          for (unsigned char b : parts[i]) mapped += byte_map().to_char[b];
          parts[i] = std::move(mapped);
        }
        out.push_back({std::move(parts[i]), piece.at_start && i == 0});
      }
    }
    pieces = std::move(out);
  }
  return pieces;
}

void HfTokenizer::Impl::encode_text(const std::string& text, bool at_start, std::vector<int64_t>& ids,
                                    std::unordered_map<std::string, std::vector<int64_t>>& cache) const {
  std::string normalized = normalize(text);
  if (normalized.empty()) return;
  for (const auto& piece : pre_tokenize({std::move(normalized), at_start})) {
    if (piece.text.size() > 64) {  // long words (a whole text without a pre-tokenizer) are not cached
      model->encode_word(piece.text, ids);
      continue;
    }
    auto it = cache.find(piece.text);
    if (it == cache.end()) {
      std::vector<int64_t> word;
      model->encode_word(piece.text, word);
      it = cache.emplace(piece.text, std::move(word)).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
}

std::string HfTokenizer::Impl::token_of(int64_t id) const {
  if (auto it = added_by_id.find(id); it != added_by_id.end()) return added[it->second].content;
  if (const std::string* piece = model->piece(id)) return *piece;
  throw std::runtime_error(fmt::format("[data] token id {} is not in the tokenizer's vocabulary of {} (valid ids: 0..{})",
                                       id, size, size - 1));
}

std::string HfTokenizer::Impl::run_decoders(std::vector<std::string> tokens, bool streaming) const {
  if (!has_decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const auto& d : decoders) {
    std::vector<std::string> out;
    switch (d.kind) {
      case Decode::byte_level: {  // a token all of whose characters are in the byte map is its bytes
        std::string bytes;
        for (const auto& token : tokens) {
          std::string mapped;
          bool all = true;
          for (char32_t cp : decode_utf8(token)) {
            auto it = byte_map().to_byte.find(cp);
            if (it == byte_map().to_byte.end()) {
              all = false;
              break;
            }
            mapped += static_cast<char>(it->second);
          }
          bytes += all ? mapped : token;
        }
        out.push_back(streaming ? bytes : replace_invalid_utf8(bytes));
        break;
      }
      case Decode::replace:
        for (auto& token : tokens) out.push_back(replace_all(std::move(token), d.a, d.b));
        break;
      case Decode::byte_fallback: {  // runs of byte tokens as their text, or one U+FFFD a byte if not UTF-8
        std::string run;
        int run_tokens = 0;
        auto flush = [&] {
          if (run_tokens == 0) return;
          bool valid = true;
          try {
            decode_utf8(run);
          } catch (const std::runtime_error&) {
            valid = false;
          }
          if (valid || streaming) out.push_back(run);
          else for (int i = 0; i < run_tokens; ++i) out.push_back("\uFFFD");
          run.clear();
          run_tokens = 0;
        };
        for (auto& token : tokens) {
          if (auto byte = byte_token(token)) {
            run += static_cast<char>(*byte);
            ++run_tokens;
          } else {
            flush();
            out.push_back(std::move(token));
          }
        }
        flush();
        break;
      }
      case Decode::fuse: {
        std::string all;
        for (const auto& token : tokens) all += token;
        out.push_back(std::move(all));
        break;
      }
      case Decode::strip:
        for (auto& token : tokens) {
          if (!streaming) {
            size_t cut = 0;
            for (int i = 0; i < d.start && token.compare(cut, d.a.size(), d.a) == 0; ++i) cut += d.a.size();
            token.erase(0, cut);
            for (int i = 0; i < d.stop && token.size() >= d.a.size() &&
                            token.compare(token.size() - d.a.size(), d.a.size(), d.a) == 0;
                 ++i)
              token.erase(token.size() - d.a.size());
          }
          out.push_back(std::move(token));
        }
        break;
      case Decode::metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string token = replace_all(std::move(tokens[i]), d.a, " ");
          if (i == 0 && d.prepend && !streaming && token.compare(0, 1, " ") == 0) token.erase(0, 1);
          out.push_back(std::move(token));
        }
        break;
    }
    tokens = std::move(out);
  }
  std::string text;
  for (const auto& token : tokens) text += token;
  return text;
}

HfTokenizer::HfTokenizer() : impl_(std::make_unique<Impl>()) {}
HfTokenizer::~HfTokenizer() = default;

std::shared_ptr<const HfTokenizer> HfTokenizer::load(std::string json_text) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw std::runtime_error(std::string("[data] tokenizer.json is not JSON: ") + e.what());
  }
  std::shared_ptr<HfTokenizer> tokenizer(new HfTokenizer());
  Impl& impl = *tokenizer->impl_;
  try {
    if (!j.is_object() || !j.contains("model")) refuse_tokenizer("no model");
    impl.model = std::make_unique<BpeMerges>(j["model"]);
    impl.read_normalizer(j.value("normalizer", Json()));
    impl.read_pre_tokenizer(j.value("pre_tokenizer", Json()));
    impl.read_decoder(j.value("decoder", Json()));
    impl.read_post_processor(j.value("post_processor", Json()));
    impl.size = impl.model->size();
    for (const auto& a : j.value("added_tokens", Json::array())) {
      if (a.value("single_word", false)) refuse_tokenizer("the added token '" + a.value("content", std::string()) + "' is single_word");
      Added added{a.at("id").get<int64_t>(), a.at("content").get<std::string>(), a.value("lstrip", false),
                  a.value("rstrip", false), a.value("special", false)};
      if (added.content.empty()) refuse_tokenizer("an added token is empty");
      impl.size = std::max(impl.size, added.id + 1);
      impl.added.push_back(std::move(added));
    }
  } catch (const Json::exception& e) {
    throw std::runtime_error(std::string("[data] tokenizer.json: ") + e.what());
  }
  // Longest first: where two added tokens match at one place the longer wins (leftmost-longest).
  std::stable_sort(impl.added.begin(), impl.added.end(),
                   [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  for (size_t i = 0; i < impl.added.size(); ++i) {
    impl.added_by_id.emplace(impl.added[i].id, i);
    impl.added_starts[static_cast<unsigned char>(impl.added[i].content[0])] = true;
  }
  tokenizer->json_ = std::move(json_text);
  return tokenizer;
}

int64_t HfTokenizer::size() const { return impl_->size; }

std::vector<int64_t> HfTokenizer::encode(std::string_view raw, bool add_special_tokens) const {
  const std::string text = replace_invalid_utf8(raw);
  std::vector<int64_t> ids;
  if (add_special_tokens) ids = impl_->prefix;
  std::unordered_map<std::string, std::vector<int64_t>> cache;
  // Added tokens are cut out first (leftmost, then longest); the text between them is encoded on
  // its own, each stretch normalized separately as the library does.
  size_t done = 0;  // text[done..] is not encoded yet
  size_t pos = 0;
  while (pos < text.size()) {
    const Added* hit = nullptr;
    if (impl_->added_starts[static_cast<unsigned char>(text[pos])]) {
      for (const auto& a : impl_->added)
        if (text.compare(pos, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + hit->content.size();
    if (hit->lstrip)
      while (begin > done && is_space(text[begin - 1])) --begin;
    if (hit->rstrip)
      while (end < text.size() && is_space(text[end])) ++end;
    impl_->encode_text(text.substr(done, begin - done), done == 0, ids, cache);
    ids.push_back(hit->id);
    done = pos = end;
  }
  impl_->encode_text(text.substr(done), done == 0, ids, cache);
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) tokens.push_back(impl_->token_of(id));
  return impl_->run_decoders(std::move(tokens), /*streaming=*/false);
}

std::string HfTokenizer::bytes_of(int64_t id) const { return impl_->run_decoders({impl_->token_of(id)}, true); }

std::string HfTokenizer::piece(int64_t id) const { return impl_->token_of(id); }

std::optional<int64_t> HfTokenizer::added_token_id(std::string_view content) const {
  for (const auto& a : impl_->added)
    if (a.content == content) return a.id;
  return std::nullopt;
}

}  // namespace nanogpt::data
