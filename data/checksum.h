// A fast streaming 64-bit checksum of a byte stream (meta.bin records one per token file and one of
// the input): it finds damaged, truncated or swapped files, not tampering. Byte order and how the
// stream is cut into update() calls do not change the value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace nanogpt::data {

class Checksum {
 public:
  void update(const void* bytes, size_t n);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  /// The checksum of everything so far (the length included); update() may continue afterwards.
  uint64_t value() const;
  uint64_t bytes() const { return total_; }

 private:
  void mix(uint64_t word) { hash_ = ((hash_ ^ word) * 0x100000001b3ULL) ^ (hash_ >> 29); }
  uint64_t hash_ = 0xcbf29ce484222325ULL;
  uint64_t pending_ = 0;  // bytes of the current word not yet mixed, little-endian
  int pending_bytes_ = 0;
  uint64_t total_ = 0;
};

/// Checksum of one buffer.
uint64_t checksum_of(std::string_view bytes);

}  // namespace nanogpt::data
