// Splitting text by a regular expression with Unicode classes (\p{L}, \p{N}, \s), as the
// pre-tokenizers of Hugging Face tokenizers do (GPT-2's, Llama 3's and Qwen's split patterns). PCRE2
// does the matching, in UTF mode with Unicode properties (UCP), JIT-compiled where it can be.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nanogpt::data {

class RegexSplit {
 public:
  /// Compiles `pattern` (a regular expression, or with `literal` a plain string). Throws
  /// std::runtime_error "[data] ..." with PCRE2's reason and the offset where it failed.
  explicit RegexSplit(const std::string& pattern, bool literal = false);
  ~RegexSplit();
  RegexSplit(const RegexSplit&) = delete;
  RegexSplit& operator=(const RegexSplit&) = delete;

  /// `text` (valid UTF-8) cut into its matches and the stretches between them, in order and
  /// nothing lost: the "Isolated" behaviour. With `drop_matches` the matches are left out ("Removed").
  std::vector<std::string_view> split(std::string_view text, bool drop_matches = false) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace nanogpt::data
