// Temp file + rename. No fsync: a plot lost to a power cut is redrawn at the next evaluation, and
// fsync on every evaluation would cost more than the plot itself on slow disks.
#include "viz/output_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace nanogpt::viz {
namespace {

[[noreturn]] void fail(const std::string& path, int err) {
  std::string hint = err == ENOENT ? " (does the directory exist?)" : "";
  throw std::runtime_error("[viz] cannot write '" + path + "': " + std::strerror(err) + hint);
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes) {
  // The pid keeps two processes plotting into the same directory from sharing a temp file.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) fail(path, errno);
  const size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
  int err = written == bytes.size() ? 0 : (errno != 0 ? errno : EIO);
  if (std::fclose(f) != 0 && err == 0) err = errno != 0 ? errno : EIO;
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    std::remove(tmp.c_str());
    fail(path, err);
  }
}

}  // namespace nanogpt::viz
