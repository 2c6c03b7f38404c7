// A folder written all at once: its files are made in a sibling staging folder, which is renamed
// onto the destination when complete. A reader, or a crash at any moment, sees no folder (or the
// empty one that was there) or the complete one, never half of it.
#pragma once

#include <string>
#include <string_view>

namespace nanogpt::io {

class StagedDir {
 public:
  /// Checks that `path` does not exist or is an empty folder (rename(2) replaces only those, so
  /// nothing is ever overwritten), creates its parent folders, and makes the staging folder
  /// `path`.tmp-XXXXXX beside it. Throws std::runtime_error "[<tag>] '<path>' ..." otherwise.
  StagedDir(const std::string& path, std::string_view tag);
  /// Removes the staging folder and everything in it unless commit() ran.
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  /// The path of `name` inside the staging folder.
  std::string operator/(const std::string& name) const { return staging_ + "/" + name; }
  /// The staging folder itself.
  const std::string& staging() const { return staging_; }
  /// Renames the staging folder onto the destination (permissions 0755). Throws "[<tag>] ..." on failure.
  void commit();

 private:
  std::string path_, staging_, tag_;
  bool committed_ = false;
};

}  // namespace nanogpt::io
