// Running another program (the Python side of the nanoGPT bridge): an argument vector, never a
// shell command line, so paths with spaces or quotes pass through unchanged.
#pragma once

#include <string>
#include <vector>

namespace nanogpt::runtime {

struct ProcessResult {
  int exit_code = 0;   // the program's exit status; 128 + N when killed by signal N
  std::string output;  // its standard output and standard error, interleaved
};

/// Runs argv[0] (a path, or a name looked up in PATH) with `argv` and waits for it. Throws
/// std::runtime_error "cannot run '<program>': <reason>" when it cannot be started (no such
/// file, not executable); a program that runs and fails is a result, not an error.
ProcessResult run_process(const std::vector<std::string>& argv);

}  // namespace nanogpt::runtime
