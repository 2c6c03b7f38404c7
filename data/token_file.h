// Token files (train.bin / val.bin): a small versioned header, then the tokens.
//
// Layout (little-endian):
//   magic    8 bytes  "NGPTTOK\0"
//   version  uint32   1
//   width    uint32   2 (uint16 tokens, vocab <= 65536) or 4 (uint32 tokens)
//   count    uint64   number of tokens
//   tokens   count * width bytes
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace nanogpt::data {

constexpr uint32_t kTokenFileVersion = 1;

/// Writes atomically (temporary file + rename): a crash never leaves a half-written file at `path`.
/// Width is 2 when vocab_size <= 65536, else 4. Throws "[data] cannot write '...': reason".
void write_token_file(const std::string& path, const std::vector<int64_t>& tokens, int64_t vocab_size);

/// Reads and validates a token file: magic, version, width, that the file length matches the count,
/// and that every token is an id of the dataset's vocabulary (< vocab_size; a file prepared from
/// another text is refused here, not deep inside the embedding). Returns a 1-D int32 CPU tensor.
/// Throws "[data] 'path': <what is wrong> (hint)".
torch::Tensor read_token_file(const std::string& path, int64_t vocab_size);

}  // namespace nanogpt::data
