// Token files (train.bin / val.bin): a small versioned header, then the tokens.
//
// Layout (little-endian):
//   magic    8 bytes  "NGPTTOK\0"
//   version  uint32   1
//   width    uint32   2 (uint16 tokens, vocab <= 65536) or 4 (uint32 tokens)
//   count    uint64   number of tokens
//   tokens   count * width bytes
//
// Training maps the files into memory (map_token_file): opening one costs the same whatever its
// size, and only the windows drawn are ever read. meta.bin records each file's token count and the
// checksum of its token bytes, taken as prepare writes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "data/checksum.h"

namespace nanogpt::data {

constexpr uint32_t kTokenFileVersion = 1;
constexpr uint64_t kTokenFileHeaderBytes = 24;
/// Token files up to this size are checked token by token at every opening (it takes milliseconds);
/// larger ones only when asked (TokenFileCheck::full, train's --verify_data).
constexpr uint64_t kAlwaysVerifyBytes = 64 << 20;

/// Bytes per token for a vocabulary: 2 up to 65536 ids, else 4.
int token_width(int64_t vocab_size);
/// The size of a token file of `count` tokens for this vocabulary.
uint64_t token_file_bytes(int64_t count, int64_t vocab_size);

/// Streams a token file of a known number of tokens: the header first, then the tokens as they come.
/// Writes to `path` directly: give it io::write_file_atomically's temporary path.
class TokenFileWriter {
 public:
  /// `count` may be kCountAtFinish: the header's count is then written by finish() (a tokenizer
  /// whose token count is known only once the text is encoded).
  TokenFileWriter(const std::string& path, uint64_t count, int64_t vocab_size);
  static constexpr uint64_t kCountAtFinish = ~uint64_t{0};
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  /// Appends ids (each must be < vocab_size). Throws past `count` tokens or on a write error.
  void append(const int32_t* ids, size_t n);
  uint64_t written() const { return written_; }
  /// Flushes and closes; throws unless exactly `count` tokens came (any number for kCountAtFinish). Returns the checksum of the
  /// token bytes (what meta.bin records and TokenFileCheck::checksum compares).
  uint64_t finish();

 private:
  void flush();
  std::string path_;
  int fd_ = -1;
  uint64_t count_, written_ = 0;
  bool count_unknown_;
  int64_t vocab_size_;
  int width_;
  std::vector<unsigned char> buffer_;
  size_t used_ = 0;
  Checksum checksum_;
};

/// Writes atomically (temporary file + rename): a crash never leaves a half-written file at `path`.
/// Width is 2 when vocab_size <= 65536, else 4. Throws "[data] cannot write '...': reason".
/// Returns the checksum of the token bytes.
uint64_t write_token_file(const std::string& path, const std::vector<int64_t>& tokens, int64_t vocab_size);

/// What map_token_file checks beyond the header and the length.
struct TokenFileCheck {
  int64_t vocab_size = 0;  // every id must be below it
  int64_t count = -1;      // the token count meta.bin records (-1: not known)
  uint64_t checksum = 0;   // the checksum meta.bin records (0: not known)
  bool full = false;       // read every token (ids, checksum) whatever the size; see kAlwaysVerifyBytes
};

/// Maps a token file read-only and checks, without reading the tokens: magic, version, width, that
/// the length matches the header's count, and the count against `check.count`. Files up to
/// kAlwaysVerifyBytes, or every file when `check.full`, are then read once in small pieces (resident
/// memory stays flat): every id must be < vocab_size (a file prepared from another text is refused
/// here, not deep inside the embedding) and the checksum must match. Returns a 1-D CPU tensor over
/// the mapping (uint16 for width 2, int32 for width 4) that keeps the file mapped while it lives.
/// Throws "[data] 'path': <what is wrong> (hint)".
torch::Tensor map_token_file(const std::string& path, const TokenFileCheck& check);

/// Reads a token file whole and checks every token (map_token_file with `full`). Returns a 1-D
/// int32 CPU tensor in memory.
torch::Tensor read_token_file(const std::string& path, int64_t vocab_size);

/// When `tokens` is (a view of) map_token_file's tensor, drops the pages read so far from this
/// process's resident memory (they stay in the page cache); otherwise does nothing.
void release_resident(const torch::Tensor& tokens);

}  // namespace nanogpt::data
