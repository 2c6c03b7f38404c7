// Token files: "NGPTTOK\0", version, width, count, then the tokens, all little-endian.
// Bytes are assembled explicitly so the format does not depend on the host's byte order.
#include "data/token_file.h"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "io/atomic_file.h"

namespace nanogpt::data {
namespace {

constexpr char kMagic[8] = {'N', 'G', 'P', 'T', 'T', 'O', 'K', '\0'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8;
constexpr char kHint[] = "re-run `nanogpt prepare` to rebuild it";

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw std::runtime_error("[data] '" + path + "': " + what + " (" + kHint + ")");
}

}  // namespace

void write_token_file(const std::string& path, const std::vector<int64_t>& tokens, int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 32)) {
    throw std::runtime_error(
        fmt::format("[data] cannot write '{}': vocab_size {} is out of range (1..4294967296)", path, vocab_size));
  }
  const int width = vocab_size <= 65536 ? 2 : 4;
  std::string bytes;
  bytes.reserve(kHeaderBytes + tokens.size() * static_cast<size_t>(width));
  bytes.append(kMagic, sizeof(kMagic));
  put_le(bytes, kTokenFileVersion, 4);
  put_le(bytes, static_cast<uint64_t>(width), 4);
  put_le(bytes, tokens.size(), 8);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      throw std::runtime_error(
          fmt::format("[data] cannot write '{}': token {} at index {} is outside the vocabulary (size {})", path,
                      tokens[i], i, vocab_size));
    }
    put_le(bytes, static_cast<uint64_t>(tokens[i]), width);
  }
  io::write_bytes_atomically(path, bytes);
}

torch::Tensor read_token_file(const std::string& path, int64_t vocab_size) {
  const std::string bytes = io::read_file(path);
  if (bytes.empty()) bad_file(path, "the file is empty, not a token file");
  if (bytes.size() < kHeaderBytes) {
    bad_file(path, fmt::format("the file has {} bytes, shorter than the {}-byte token file header", bytes.size(),
                               kHeaderBytes));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) bad_file(path, "not a token file (wrong magic number)");
  const uint64_t version = get_le(p + 8, 4);
  if (version != kTokenFileVersion) {
    bad_file(path, fmt::format("unsupported token file version {} (this build reads version {})", version,
                               kTokenFileVersion));
  }
  const uint64_t width = get_le(p + 12, 4);
  if (width != 2 && width != 4) bad_file(path, fmt::format("invalid token width {} (expected 2 or 4)", width));
  const uint64_t count = get_le(p + 16, 8);
  const uint64_t payload = bytes.size() - kHeaderBytes;
  // Compare without multiplying, so a corrupt huge count cannot overflow.
  if (payload % width != 0 || payload / width != count) {
    bad_file(path, fmt::format("the header says {} tokens of {} bytes, but the file holds {} bytes of tokens "
                               "(truncated or corrupt)",
                               count, width, payload));
  }
  auto tokens = torch::empty({static_cast<int64_t>(count)}, torch::kInt32);
  int32_t* out = tokens.data_ptr<int32_t>();
  const unsigned char* in = p + kHeaderBytes;
  const uint64_t ids = vocab_size > 0 ? static_cast<uint64_t>(vocab_size) : 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t id = get_le(in + width * i, static_cast<int>(width));
    // An id past the vocabulary would index past the embedding table at the first step.
    if (id >= ids) {
      bad_file(path, fmt::format("token {} at index {} is outside the vocabulary (vocab_size {}): the tokens were "
                                 "not made with this dataset's meta.bin",
                                 id, i, vocab_size));
    }
    if (id > static_cast<uint64_t>(INT32_MAX))
      bad_file(path, fmt::format("token {} at index {} does not fit in int32", id, i));
    out[i] = static_cast<int32_t>(id);
  }
  return tokens;
}

}  // namespace nanogpt::data
