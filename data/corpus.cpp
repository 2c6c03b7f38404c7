// CorpusReader: read(2) into a 1 MiB buffer, decode with an ASCII fast path (8 bytes at a time),
// carry an incomplete sequence at the buffer's end over to the next read.
#include "data/corpus.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "data/utf8.h"

namespace nanogpt::data {
namespace {

namespace fs = std::filesystem;

constexpr size_t kReadBytes = 1 << 20;

bool hidden(const fs::path& path) { return path.filename().string().rfind('.', 0) == 0; }

// Whether `path` lies inside `dir` (both made absolute and normal first).
bool inside(const fs::path& path, const fs::path& dir) {
  if (dir.empty()) return false;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec), d = fs::weakly_canonical(dir, ec);
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty()) continue;  // a trailing slash
    if (pi == p.end() || *pi != *di) return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> corpus_files(const std::vector<std::string>& inputs, const std::string& exclude_dir) {
  if (inputs.empty()) throw std::runtime_error("[data] no input given (pass --input FILE_OR_FOLDER)");
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const auto status = fs::status(input, ec);
    if (!fs::exists(status)) throw std::runtime_error("[data] input file '" + input + "' does not exist (check --input)");
    if (!fs::is_directory(status)) {
      files.push_back(input);
      continue;
    }
    std::vector<std::string> found;
    fs::recursive_directory_iterator it(input, fs::directory_options::follow_directory_symlink, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      if (hidden(it->path())) {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file(ec) && !inside(it->path(), exclude_dir)) found.push_back(it->path().string());
    }
    if (ec) throw std::runtime_error("[data] cannot list folder '" + input + "': " + ec.message());
    if (found.empty()) {
      throw std::runtime_error("[data] input '" + input + "' is a directory without files (put UTF-8 text files in "
                               "it, or pass a text file, e.g. data/shakespeare_char/input.txt)");
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

CorpusReader::CorpusReader(std::vector<std::string> files, std::string separator, Utf8Errors errors)
    : files_(std::move(files)), separator_(std::move(separator)), errors_(errors) {
  try {
    separator_chars_ = decode_utf8(separator_);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("[data] the separator is not valid UTF-8: ") + e.what());
  }
  for (const std::string& file : files_) {
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    if (ec) throw std::runtime_error("[data] cannot read '" + file + "': " + ec.message());
    total_bytes_ += size;
  }
  if (!files_.empty()) total_bytes_ += separator_.size() * (files_.size() - 1);
  buffer_.resize(kReadBytes + 8);
  decoded_.resize(kReadBytes + 8 + separator_chars_.size());
}

CorpusReader::~CorpusReader() {
  if (fd_ >= 0) ::close(fd_);
}

void CorpusReader::open_next() {
  const std::string& path = files_[next_file_++];
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error("[data] cannot read '" + path + "': " + std::strerror(errno));
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  file_offset_ = 0;
  carried_ = 0;
}

bool CorpusReader::next(std::u32string_view& piece) {
  size_t count = 0;  // code points in decoded_
  while (count == 0) {
    if (fd_ < 0) {
      if (next_file_ == files_.size()) return false;
      if (next_file_ > 0) {
        std::copy(separator_chars_.begin(), separator_chars_.end(), decoded_.begin());
        count = separator_chars_.size();
        checksum_.update(separator_);
      }
      open_next();
    }
    ssize_t got = ::read(fd_, &buffer_[carried_], kReadBytes);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw std::runtime_error("[data] cannot read '" + files_[next_file_ - 1] + "': " + std::strerror(errno));
    }
    checksum_.update(&buffer_[carried_], static_cast<size_t>(got));
    const size_t length = carried_ + static_cast<size_t>(got);
    const bool at_end = got == 0;
    size_t written = 0;
    const size_t used = decode(length, at_end, decoded_.data() + count, &written);
    count += written;
    carried_ = length - used;  // at most 3 bytes of a sequence the next read completes
    std::memmove(&buffer_[0], &buffer_[used], carried_);
    file_offset_ += used;
    if (at_end) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  piece = std::u32string_view(decoded_.data(), count);
  return true;
}

// Decodes buffer_[0, length) into `out` (room for `length` code points); returns the bytes used.
size_t CorpusReader::decode(size_t length, bool at_end, char32_t* out, size_t* written) {
  const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data());
  const std::string_view bytes(buffer_.data(), length);
  size_t i = 0, k = 0;
  while (i < length) {
    if (i + 8 <= length) {  // ASCII fast path, a word at a time
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if ((word & 0x8080808080808080ULL) == 0) {
        for (int b = 0; b < 8; ++b) out[k++] = p[i + b];
        i += 8;
        continue;
      }
    }
    if (p[i] < 0x80) {
      out[k++] = p[i++];
      continue;
    }
    const Utf8Step step = decode_utf8_step(bytes, i);
    if (step.length > 0) {
      out[k++] = step.cp;
      i += static_cast<size_t>(step.length);
      continue;
    }
    if (step.truncated && !at_end) break;  // the next read completes it
    if (errors_ == Utf8Errors::strict) {
      std::string why;
      decode_utf8_step(bytes, i, &why);
      throw std::runtime_error(fmt::format("[data] '{}': invalid UTF-8 at byte offset {}: {} (the input must be "
                                           "UTF-8 text: re-save it as UTF-8, or pass --errors=replace)",
                                           files_[next_file_ - 1], file_offset_ + i, why));
    }
    out[k++] = 0xFFFD;
    i += static_cast<size_t>(step.bad_length);
    ++replaced_;
  }
  *written = k;
  return i;
}

}  // namespace nanogpt::data
