// Atomic file replacement (temp sibling + fsync + rename) and whole-file reads, on POSIX calls so
// every failure carries errno's reason.
#include "io/atomic_file.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace nanogpt::io {
namespace {

std::string tagged(std::string_view tag) { return "[" + std::string(tag) + "] "; }

// The reason a system call failed, as an exception message body.
std::runtime_error sys_error(const std::string& what) { return std::runtime_error(what + ": " + std::strerror(errno)); }

// Unique per process and call, so concurrent writers of the same path never share a temp file.
std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
}

bool all_digits(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
}

// The writer's process id in a name temp_path_for made (`NAME.tmp.PID.N`), or 0 for another name.
pid_t temp_file_writer(const std::string& name) {
  const auto counter_dot = name.rfind('.');
  if (counter_dot == std::string::npos || !all_digits(name.substr(counter_dot + 1))) return 0;
  const auto pid_dot = name.rfind('.', counter_dot - 1);
  if (pid_dot == std::string::npos || pid_dot < 4 || name.compare(pid_dot - 4, 4, ".tmp") != 0) return 0;
  const std::string pid = name.substr(pid_dot + 1, counter_dot - pid_dot - 1);
  if (!all_digits(pid) || pid.size() > 9) return 0;
  return static_cast<pid_t>(std::stol(pid));
}

// Whether process `pid` exists (EPERM: it does, another user's).
bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw sys_error("cannot reopen '" + path + "' to sync it");
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  // Some file systems refuse to fsync a directory; the rename itself has happened by then.
  if (rc != 0 && !(flags & O_DIRECTORY)) throw sys_error("fsync failed");
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(const std::string& tmp_path)>& write,
                           std::string_view tag) {
  const std::string tmp = temp_path_for(path);
  try {
    write(tmp);
    fsync_path(tmp, O_RDONLY);
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw sys_error("rename from '" + tmp + "' failed");
  } catch (const std::exception& e) {
    ::unlink(tmp.c_str());  // may not exist; nothing else to do if this fails too
    throw std::runtime_error(tagged(tag) + "cannot write '" + path + "': " + e.what());
  }
  // Make the rename itself durable. Best effort: the file's content is already complete.
  try {
    fsync_path(parent_dir(path), O_RDONLY | O_DIRECTORY);
  } catch (const std::exception&) {
  }
}

void write_bytes_atomically(const std::string& path, std::string_view bytes, std::string_view tag) {
  write_file_atomically(
      path,
      [&](const std::string& tmp) {
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) throw sys_error("cannot create '" + tmp + "'");
        size_t done = 0;
        while (done < bytes.size()) {
          const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) {
            const int saved = errno;
            ::close(fd);
            errno = saved;
            throw sys_error("write failed");
          }
          done += static_cast<size_t>(n);
        }
        if (::close(fd) != 0) throw sys_error("close failed");
      },
      tag);
}

RemovedTempFiles remove_dead_temp_files(const std::string& dir) {
  RemovedTempFiles removed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const pid_t writer = temp_file_writer(entry.path().filename().string());
    if (writer <= 0 || writer == ::getpid() || process_alive(writer) || !entry.is_regular_file(ec)) continue;
    const auto bytes = entry.file_size(ec);
    if (ec || !std::filesystem::remove(entry.path(), ec)) continue;  // gone already, or not ours to remove
    ++removed.files;
    removed.bytes += static_cast<int64_t>(bytes);
  }
  return removed;
}

std::string read_file(const std::string& path, std::string_view tag) {
  const std::string prefix = tagged(tag) + "cannot read '" + path + "': ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(prefix + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int saved = errno;
    ::close(fd);
    throw std::runtime_error(prefix + std::strerror(saved));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(prefix + "is a directory, not a file");
  }
  std::string bytes;
  if (S_ISREG(st.st_mode)) bytes.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      ::close(fd);
      throw std::runtime_error(prefix + std::strerror(saved));
    }
    if (n == 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return bytes;
}

}  // namespace nanogpt::io
