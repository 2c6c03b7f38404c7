// Atomic file replacement: write a temporary sibling, fsync, rename over the target. A reader
// (or a crash at any moment) sees either the old file or the complete new one, never a mix.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace nanogpt::io {

/// Calls `write(tmp_path)` to produce the content, then fsyncs and renames it onto `path`.
/// On any failure the temporary file is removed, `path` is untouched, and the error is rethrown
/// as std::runtime_error "[<tag>] cannot write '<path>': <reason>".
void write_file_atomically(const std::string& path, const std::function<void(const std::string& tmp_path)>& write,
                           std::string_view tag = "data");

/// Convenience: atomically writes `bytes` to `path`.
void write_bytes_atomically(const std::string& path, std::string_view bytes, std::string_view tag = "data");

/// What remove_dead_temp_files removed.
struct RemovedTempFiles {
  int64_t files = 0;
  int64_t bytes = 0;
};

/// Removes the temporary files in `dir` (`NAME.tmp.PID.N`) that a writer left when it was killed:
/// those whose process is gone. A live process's files, this process's included, stay.
RemovedTempFiles remove_dead_temp_files(const std::string& dir);

/// Reads a whole file. Throws "[<tag>] cannot read '<path>': reason" (missing, directory, unreadable).
std::string read_file(const std::string& path, std::string_view tag = "data");

}  // namespace nanogpt::io
