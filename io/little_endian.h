// Little-endian integers in byte buffers, assembled a byte at a time so that a file reads the same on
// any host: the token files' and the dataset meta file's headers, safetensors' header length.
#pragma once

#include <cstdint>
#include <string>

namespace nanogpt::io {

/// Writes the low `bytes` bytes of `value` to `out`, least significant first.
inline void put_le(unsigned char* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>((value >> (8 * i)) & 0xFF);
}

/// Appends the low `bytes` bytes of `value` to `out`, least significant first.
inline void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

/// The unsigned integer in the `bytes` bytes at `p`, least significant first.
inline uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

}  // namespace nanogpt::io
