// A file mapped read-only into memory: its pages are read from the page cache as they are touched,
// so a multi-gigabyte token file costs address space, not resident memory, and opening it costs
// the same whatever its size.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace nanogpt::io {

class MappedFile {
 public:
  /// Maps the whole of `path` read-only. Throws "[<tag>] cannot read '<path>': reason (hint)".
  explicit MappedFile(const std::string& path, std::string_view tag = "data");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  /// Tells the kernel that reads will be scattered (no read-ahead around each touched page).
  void expect_random_access() const;
  /// Drops the touched pages from this process's resident set; they stay in the page cache, so the
  /// next touch costs a minor fault, not a disk read. Keeps a long run's resident memory flat, as
  /// nanoGPT does by re-creating its np.memmap at every batch.
  void release_resident() const;

 private:
  std::string path_;
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace nanogpt::io
