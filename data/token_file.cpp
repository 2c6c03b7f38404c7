// Token files: "NGPTTOK\0", version, width, count, then the tokens, all little-endian.
// Bytes are assembled explicitly so the format does not depend on the host's byte order.
#include "data/token_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "io/atomic_file.h"
#include "io/little_endian.h"
#include "io/mapped_file.h"

namespace nanogpt::data {
namespace {

constexpr char kTokenFileMagic[8] = {'N', 'G', 'P', 'T', 'T', 'O', 'K', '\0'};
constexpr char kHint[] = "re-run `nanogpt prepare` to rebuild it";
constexpr size_t kBufferBytes = 1 << 20;

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw std::runtime_error("[data] '" + path + "': " + what + " (" + kHint + ")");
}

void write_all(int fd, const unsigned char* bytes, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t done = ::write(fd, bytes, n);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) throw std::runtime_error("write to '" + path + "' failed: " + std::strerror(errno));
    bytes += done;
    n -= static_cast<size_t>(done);
  }
}

// The tensor's storage owns the mapping: this deleter (recognised by release_resident) frees it.
void unmap(void* context) { delete static_cast<io::MappedFile*>(context); }

// Reads the tokens once through a small buffer, so a multi-gigabyte check keeps resident memory flat.
void verify_tokens(const std::string& path, uint64_t count, uint64_t width, const TokenFileCheck& check) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("[data] cannot read '" + path + "': " + std::strerror(errno));
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* f) { ::close(*f); delete f; });
  std::vector<unsigned char> buffer(kBufferBytes);  // a multiple of both widths
  Checksum sum;
  const uint64_t ids = check.vocab_size > 0 ? static_cast<uint64_t>(check.vocab_size) : 0;
  uint64_t index = 0, offset = kTokenFileHeaderBytes;
  const uint64_t end = kTokenFileHeaderBytes + count * width;
  while (offset < end) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), end - offset));
    const ssize_t got = ::pread(fd, buffer.data(), want, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) bad_file(path, got < 0 ? std::string("read failed: ") + std::strerror(errno) : "the file shrank while it was read");
    const size_t n = static_cast<size_t>(got) / width * width;  // pread of a regular file returns whole requests
    sum.update(buffer.data(), n);
    for (size_t i = 0; i < n; i += width, ++index) {
      const uint64_t id = width == 2 ? (buffer[i] | (uint64_t{buffer[i + 1]} << 8)) : io::get_le(&buffer[i], 4);
      // An id past the vocabulary would index past the embedding table at the first step.
      if (id >= ids) {
        bad_file(path, fmt::format("token {} at index {} is outside the vocabulary (vocab_size {}): the tokens were "
                                   "not made with this dataset's meta.bin",
                                   id, index, check.vocab_size));
      }
      if (id > static_cast<uint64_t>(INT32_MAX))
        bad_file(path, fmt::format("token {} at index {} does not fit in int32", id, index));
    }
    offset += n;
  }
  if (check.checksum != 0 && sum.value() != check.checksum) {
    bad_file(path, fmt::format("the tokens' checksum is {:016x}, but meta.bin recorded {:016x} when they were "
                               "prepared: the file is damaged or comes from another preparation",
                               sum.value(), check.checksum));
  }
}

}  // namespace

int token_width(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

uint64_t token_file_bytes(int64_t count, int64_t vocab_size) {
  return kTokenFileHeaderBytes + static_cast<uint64_t>(count) * static_cast<uint64_t>(token_width(vocab_size));
}

TokenFileWriter::TokenFileWriter(const std::string& path, uint64_t count, int64_t vocab_size)
    : path_(path), count_(count), count_unknown_(count == kCountAtFinish), vocab_size_(vocab_size), width_(token_width(vocab_size)), buffer_(kBufferBytes) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 32)) {
    throw std::runtime_error(fmt::format("vocab_size {} is out of range (1..4294967296)", vocab_size));
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot create '" + path + "': " + std::strerror(errno));
  unsigned char header[kTokenFileHeaderBytes];
  std::memcpy(header, kTokenFileMagic, sizeof(kTokenFileMagic));
  io::put_le(header + 8, kTokenFileVersion, 4);
  io::put_le(header + 12, static_cast<uint64_t>(width_), 4);
  io::put_le(header + 16, count, 8);
  write_all(fd_, header, sizeof(header), path_);
}

TokenFileWriter::~TokenFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenFileWriter::append(const int32_t* ids, size_t n) {
  if (n > count_ - written_) {
    throw std::runtime_error(fmt::format("more than the {} tokens announced in the header", count_));
  }
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_) {
      throw std::runtime_error(fmt::format("token {} at index {} is outside the vocabulary (size {})", ids[i],
                                           written_ + i, vocab_size_));
    }
  }
  written_ += n;
  while (n > 0) {
    const size_t room = (buffer_.size() - used_) / static_cast<size_t>(width_);
    if (room == 0) {
      flush();
      continue;
    }
    const size_t take = std::min(n, room);
    unsigned char* out = &buffer_[used_];
    // Little-endian, byte by byte: the same file on any host (one loop per width, so it vectorises).
    if (width_ == 2) {
      for (size_t i = 0; i < take; ++i) {
        out[2 * i] = static_cast<unsigned char>(ids[i]);
        out[2 * i + 1] = static_cast<unsigned char>(ids[i] >> 8);
      }
    } else {
      for (size_t i = 0; i < take; ++i) io::put_le(out + 4 * i, static_cast<uint32_t>(ids[i]), 4);
    }
    used_ += take * static_cast<size_t>(width_);
    ids += take;
    n -= take;
  }
}

void TokenFileWriter::flush() {
  checksum_.update(buffer_.data(), used_);
  write_all(fd_, buffer_.data(), used_, path_);
  used_ = 0;
}

uint64_t TokenFileWriter::finish() {
  if (!count_unknown_ && written_ != count_) {
    throw std::runtime_error(fmt::format("{} tokens written, but the header announces {}", written_, count_));
  }
  flush();
  if (count_unknown_) {  // the header's count, now that it is known
    unsigned char count[8];
    io::put_le(count, written_, 8);
    if (::pwrite(fd_, count, sizeof(count), 16) != static_cast<ssize_t>(sizeof(count))) {
      throw std::runtime_error("cannot write the token count into '" + path_ + "': " + std::strerror(errno));
    }
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw std::runtime_error("close of '" + path_ + "' failed: " + std::strerror(errno));
  return checksum_.value();
}

uint64_t write_token_file(const std::string& path, const std::vector<int64_t>& tokens, int64_t vocab_size) {
  uint64_t checksum = 0;
  io::write_file_atomically(path, [&](const std::string& tmp) {
    TokenFileWriter writer(tmp, tokens.size(), vocab_size);
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab_size) {
        throw std::runtime_error(
            fmt::format("token {} at index {} is outside the vocabulary (size {})", tokens[i], i, vocab_size));
      }
      const auto id = static_cast<int32_t>(tokens[i]);
      writer.append(&id, 1);
    }
    checksum = writer.finish();
  });
  return checksum;
}

torch::Tensor map_token_file(const std::string& path, const TokenFileCheck& check) {
  auto file = std::make_unique<io::MappedFile>(path);
  const uint64_t size = file->size();
  if (size == 0) bad_file(path, "the file is empty, not a token file");
  if (size < kTokenFileHeaderBytes) {
    bad_file(path, fmt::format("the file has {} bytes, shorter than the {}-byte token file header", size,
                               kTokenFileHeaderBytes));
  }
  const unsigned char* p = file->data();
  if (std::memcmp(p, kTokenFileMagic, sizeof(kTokenFileMagic)) != 0) bad_file(path, "not a token file (wrong magic number)");
  const uint64_t version = io::get_le(p + 8, 4);
  if (version != kTokenFileVersion) {
    bad_file(path, fmt::format("unsupported token file version {} (this build reads version {})", version,
                               kTokenFileVersion));
  }
  const uint64_t width = io::get_le(p + 12, 4);
  if (width != 2 && width != 4) bad_file(path, fmt::format("invalid token width {} (expected 2 or 4)", width));
  const uint64_t count = io::get_le(p + 16, 8);
  const uint64_t payload = size - kTokenFileHeaderBytes;
  // Compare without multiplying, so a corrupt huge count cannot overflow.
  if (payload % width != 0 || payload / width != count) {
    bad_file(path, fmt::format("the header says {} tokens of {} bytes, but the file holds {} bytes of tokens "
                               "(truncated or corrupt)",
                               count, width, payload));
  }
  if (check.count >= 0 && count != static_cast<uint64_t>(check.count)) {
    bad_file(path, fmt::format("the file holds {} tokens, but meta.bin says {}: the token files and meta.bin come "
                               "from different preparations",
                               count, check.count));
  }
  if (check.full || size <= kAlwaysVerifyBytes) verify_tokens(path, count, width, check);
  file->expect_random_access();

  // The storage's DataPtr owns the mapping; the tensor (and every view of it) keeps the file mapped.
  auto* tokens = const_cast<unsigned char*>(p) + kTokenFileHeaderBytes;
  io::MappedFile* owner = file.release();
  c10::DataPtr data(tokens, owner, &unmap, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(payload), std::move(data),
                       /*allocator=*/nullptr, /*resizable=*/false);
  const auto dtype = width == 2 ? torch::kUInt16 : torch::kInt32;
  return torch::empty({0}, torch::dtype(dtype)).set_(storage, 0, {static_cast<int64_t>(count)}, {1});
}

torch::Tensor read_token_file(const std::string& path, int64_t vocab_size) {
  TokenFileCheck check;
  check.vocab_size = vocab_size;
  check.full = true;
  return map_token_file(path, check).to(torch::kInt32, /*non_blocking=*/false, /*copy=*/true);
}

void release_resident(const torch::Tensor& tokens) {
  if (!tokens.defined() || !tokens.has_storage()) return;
  const c10::DataPtr& data = tokens.storage().data_ptr();
  if (data.get_deleter() == &unmap) static_cast<const io::MappedFile*>(data.get_context())->release_resident();
}

}  // namespace nanogpt::data
