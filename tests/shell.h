// Running a command line from a test: its exit code (128 + the signal when a signal ended it), and
// its output captured through files.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "train_fixture.h"

namespace nanogpt::testing {

/// The exit code in a std::system status: the program's own, or 128 + the signal that ended it.
inline int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

/// Runs `cmd` through the shell; its exit code.
inline int shell(const std::string& cmd) { return exit_code(std::system(cmd.c_str())); }

/// The same with the command's output discarded.
inline int shell_quiet(const std::string& cmd) { return shell(cmd + " > /dev/null 2>&1"); }

/// The Python the suite's reference scripts run on: $NANOGPT_PYTHON (e.g. one with another
/// transformers), else the one configured.
inline std::string project_python() {
  const char* env = std::getenv("NANOGPT_PYTHON");
  return env && *env ? env : NANOGPT_PYTHON;
}

struct Outcome {
  int rc = -1;
  std::string out, err;
};

/// Runs `cmd` through the shell with stdin closed, its stdout and stderr captured in files of `dir`.
inline Outcome shell_captured(const std::string& cmd, const std::string& dir) {
  const std::string out = dir + "/stdout", err = dir + "/stderr";
  Outcome r;
  r.rc = shell(cmd + " >" + out + " 2>" + err + " </dev/null");
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

/// The program under test with `args`, its output captured in `dir`; run in folder `cwd` if given.
inline Outcome run_nanogpt(const std::string& args, const std::string& dir, const std::string& cwd = "") {
  const std::string program = std::string(NANOGPT_BINARY) + " " + args;
  return shell_captured(cwd.empty() ? program : "cd '" + cwd + "' && " + program, dir);
}

/// A program started in the background, its stdout and stderr going to the files `out` and `err`.
struct Proc {
  pid_t pid = -1;
  std::string out, err;  // file paths
};

/// Starts argv (argv[0] looked up on PATH) with the environment plus `extra` ("KEY=value", replacing
/// a variable of that name), stdin closed, stdout and stderr to stem.out and stem.err.
inline Proc start(const std::vector<std::string>& argv, const std::vector<std::string>& extra, const std::string& stem) {
  Proc p{-1, stem + ".out", stem + ".err"};
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& x : extra) replaced |= kv.substr(0, kv.find('=') + 1) == x.substr(0, x.find('=') + 1);
    if (!replaced) env_text.push_back(kv);
  }
  for (const auto& x : extra) env_text.push_back(x);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env_text) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int rc = posix_spawnp(&p.pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0]);
  return p;
}

/// Exit status (128 + N for signal N), or -1 after `timeout` (the process is then killed).
inline int wait_for(const Proc& p, std::chrono::seconds timeout = std::chrono::seconds(120)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (::waitpid(p.pid, &status, WNOHANG) == p.pid) return exit_code(status);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace nanogpt::testing
