// Checksum: 8 bytes at a time, each word xor-ed in and multiplied by the FNV prime, with a shift
// feeding the high bits back down; ~1 multiply per 8 bytes, so checking a token file runs at
// memory speed.
#include "data/checksum.h"

#include <cstring>

namespace nanogpt::data {

void Checksum::update(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += n;
  while (pending_bytes_ > 0 && n > 0) {  // finish a word a previous call started
    pending_ |= static_cast<uint64_t>(*p++) << (8 * pending_bytes_++);
    --n;
    if (pending_bytes_ == 8) {
      mix(pending_);
      pending_ = 0;
      pending_bytes_ = 0;
    }
  }
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    word = __builtin_bswap64(word);
#endif
    mix(word);
  }
  while (n > 0) {
    pending_ |= static_cast<uint64_t>(*p++) << (8 * pending_bytes_++);
    --n;
  }
}

uint64_t Checksum::value() const {
  Checksum end = *this;
  if (end.pending_bytes_ > 0) end.mix(end.pending_);
  end.mix(total_);
  return end.hash_;
}

uint64_t checksum_of(std::string_view bytes) {
  Checksum sum;
  sum.update(bytes);
  return sum.value();
}

}  // namespace nanogpt::data
