// Helpers shared by the libFuzzer targets (tests/fuzz/fuzz_*.cpp).
//
// Every reader promises "throws std::runtime_error (or invalid_argument) '[tag] ...' on bad input,
// never crashes". A target calls the reader, lets ASan/UBSan catch memory errors and undefined
// behaviour, and checks each error with expect_clear_error(): anything that is not the promised
// one-line tagged message aborts, so libFuzzer records the input as a finding.
#pragma once

#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace nanogpt::fuzz {

/// Prints a finding and aborts (libFuzzer saves the input as crash-*).
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// An error must be one line starting with `tag` ("[data] ", "[ckpt] ", ...).
/// NANOGPT_FUZZ_VERBOSE=1 prints each one (to triage a finding: run the target on that input).
inline void expect_clear_error(const std::exception& e, std::string_view tag) {
  const std::string_view what = e.what();
  static const bool verbose = std::getenv("NANOGPT_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "expected error: %s\n", e.what());
  if (what.substr(0, tag.size()) != tag) finding("error without the '" + std::string(tag) + "' tag: " + std::string(what));
  if (what.find('\n') != std::string_view::npos) finding("multi-line error message: " + std::string(what));
}

/// A per-process scratch directory (on /dev/shm when present: no disk I/O per input), removed at exit.
inline const std::string& scratch_dir() {
  struct ScratchDir {
    std::string path;
    ScratchDir() {
      const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
      path = std::string(base) + "/nanogpt_fuzz_XXXXXX";
      if (!::mkdtemp(path.data())) finding("mkdtemp failed");
    }
    ~ScratchDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const ScratchDir dir;
  return dir.path;
}

/// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) finding("cannot write " + path);
  return path;
}

/// LibTorch set-up for a fuzzing process: one thread, no extra workers.
inline void init_torch() {
  torch::set_num_threads(1);
  at::set_num_interop_threads(1);
}

}  // namespace nanogpt::fuzz
