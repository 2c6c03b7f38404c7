// A corpus as users have it: one text file, several, or folders of them, read as one stream of
// code points in fixed-size pieces (memory stays flat whatever the size), with files joined by a
// separator and invalid UTF-8 refused (naming the file and byte offset) or replaced by U+FFFD.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/checksum.h"

namespace nanogpt::data {

enum class Utf8Errors {
  strict,   // "[data] 'a.txt': invalid UTF-8 at byte offset N: ..."
  replace,  // each maximal invalid subsequence becomes U+FFFD, as Python's errors="replace"
};

/// The files of a corpus, in reading order: each input that is a file, and for each input that is a
/// folder every file beneath it (recursively, sorted by path; names starting with '.' are skipped).
/// Files under `exclude_dir` (prepare's output folder) are left out. Throws "[data] ..." for an input
/// that does not exist or a folder without files.
std::vector<std::string> corpus_files(const std::vector<std::string>& inputs, const std::string& exclude_dir = "");

class CorpusReader {
 public:
  /// `separator` (UTF-8) goes between two files' texts. Throws on an invalid separator or an
  /// unreadable file.
  CorpusReader(std::vector<std::string> files, std::string separator, Utf8Errors errors);
  ~CorpusReader();
  CorpusReader(const CorpusReader&) = delete;
  CorpusReader& operator=(const CorpusReader&) = delete;

  /// Points `piece` at the next piece of the corpus (the code points of at most ~1 MiB of input;
  /// valid until the next call); false at the end.
  bool next(std::u32string_view& piece);

  uint64_t bytes_read() const { return checksum_.bytes(); }  // input bytes so far, separators included
  uint64_t total_bytes() const { return total_bytes_; }      // file sizes when opened, plus separators
  uint64_t checksum() const { return checksum_.value(); }    // of the bytes so far (see checksum.h)
  uint64_t replaced() const { return replaced_; }            // invalid sequences replaced so far

 private:
  void open_next();
  size_t decode(size_t length, bool at_end, char32_t* out, size_t* written);

  std::vector<std::string> files_;
  std::string separator_;
  std::u32string separator_chars_;
  Utf8Errors errors_;
  uint64_t total_bytes_ = 0;
  size_t next_file_ = 0;
  int fd_ = -1;
  uint64_t file_offset_ = 0;   // offset in the current file of buffer_[0]
  std::string buffer_;
  std::vector<char32_t> decoded_;  // the current piece
  size_t carried_ = 0;         // bytes of an incomplete sequence kept at the buffer's start
  Checksum checksum_;
  uint64_t replaced_ = 0;
};

}  // namespace nanogpt::data
