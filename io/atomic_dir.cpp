// StagedDir (see atomic_dir.h): mkdtemp beside the destination, rename onto it.
#include "io/atomic_dir.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace nanogpt::io {

namespace fs = std::filesystem;

StagedDir::StagedDir(const std::string& path, std::string_view tag) : path_(path), tag_(tag) {
  auto fail = [&](const std::string& what) { return std::runtime_error("[" + tag_ + "] '" + path_ + "' " + what); };
  std::error_code ec;
  const auto status = fs::status(path_, ec);
  if (fs::exists(status)) {
    if (!fs::is_directory(status)) throw fail("exists and is not a folder (give a new folder: nothing is overwritten)");
    if (!fs::is_empty(path_, ec)) throw fail("is not empty (give a new or empty folder: nothing is overwritten)");
  }
  const fs::path parent = fs::path(path_).lexically_normal().parent_path();
  if (!parent.empty() && !fs::exists(parent, ec)) {
    fs::create_directories(parent, ec);
    if (ec) throw fail("cannot be created: " + ec.message());
  }
  std::string pattern = fs::path(path_).lexically_normal().string();
  while (pattern.size() > 1 && pattern.back() == '/') pattern.pop_back();
  pattern += ".tmp-XXXXXX";
  if (!::mkdtemp(pattern.data())) throw fail("cannot be written: mkdtemp '" + pattern + "': " + std::strerror(errno));
  staging_ = pattern;
}

StagedDir::~StagedDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void StagedDir::commit() {
  ::chmod(staging_.c_str(), 0755);  // mkdtemp's 0700 is for while it is being written
  if (std::rename(staging_.c_str(), path_.c_str()) != 0)
    throw std::runtime_error("[" + tag_ + "] cannot write '" + path_ + "': rename from '" + staging_ +
                             "' failed: " + std::strerror(errno));
  committed_ = true;
}

}  // namespace nanogpt::io
