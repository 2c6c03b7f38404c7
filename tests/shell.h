// Running a command line from a test: its exit code (128 + the signal when a signal ended it), and
// its output captured through files.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "train_fixture.h"

namespace nanogpt::testing {

/// The exit code in a std::system status: the program's own, or 128 + the signal that ended it.
inline int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

/// Runs `cmd` through the shell; its exit code.
inline int shell(const std::string& cmd) { return exit_code(std::system(cmd.c_str())); }

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

}  // namespace nanogpt::testing
