// RegexSplit (see regex_split.h): PCRE2's 8-bit library behind one file.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/regex_split.h"

#include <fmt/format.h>
#include <pcre2.h>

#include <stdexcept>

namespace nanogpt::data {

struct RegexSplit::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

RegexSplit::RegexSplit(const std::string& pattern, bool literal) : code_(std::make_unique<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UTF: the subject and pattern are UTF-8 (checked once by our callers: no per-match check);
  // UCP: \s, \w, \d and the POSIX classes follow Unicode properties, as in Oniguruma.
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0u);
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset,
                              nullptr);
  if (!code_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::runtime_error(fmt::format("[data] the tokenizer's split pattern '{}' does not compile: {} at offset {}",
                                         pattern, reinterpret_cast<const char*>(message), offset));
  }
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);  // where JIT is unavailable the interpreter runs
}

RegexSplit::~RegexSplit() = default;

std::vector<std::string_view> RegexSplit::split(std::string_view text, bool drop_matches) const {
  std::vector<std::string_view> pieces;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0, last_end = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw std::runtime_error(fmt::format("[data] splitting text by the tokenizer's pattern failed: {}",
                                           reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match.get());
    const size_t begin = span[0], end = span[1];
    if (begin > last_end) pieces.push_back(text.substr(last_end, begin - last_end));
    if (end > begin) {
      if (!drop_matches) pieces.push_back(text.substr(begin, end - begin));
      last_end = start = end;
      continue;
    }
    // An empty match: no piece; step over one character (its UTF-8 length) and search again.
    last_end = begin;
    if (begin >= text.size()) break;
    start = begin + 1;
    while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
  }
  if (last_end < text.size()) pieces.push_back(text.substr(last_end));
  return pieces;
}

}  // namespace nanogpt::data
