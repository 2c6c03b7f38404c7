// MappedFile: open, fstat, mmap(PROT_READ, MAP_PRIVATE), close the descriptor (the mapping keeps
// the file alive); munmap at destruction. An empty file maps to nothing (mmap refuses length 0).
#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace nanogpt::io {

MappedFile::MappedFile(const std::string& path, std::string_view tag) : path_(path) {
  const auto fail = [&](const std::string& why) {
    return std::runtime_error("[" + std::string(tag) + "] cannot read '" + path + "': " + why);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw fail(std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw fail("not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw fail(std::string("cannot map it into memory: ") + std::strerror(err));
    }
    data_ = static_cast<unsigned char*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

void MappedFile::expect_random_access() const {
  if (data_) ::madvise(data_, size_, MADV_RANDOM);  // advice only: failure changes nothing but speed
}

void MappedFile::release_resident() const {
  // On a read-only file mapping MADV_DONTNEED only unmaps: the next read faults the same bytes back in.
  if (data_) ::madvise(data_, size_, MADV_DONTNEED);
}

}  // namespace nanogpt::io
