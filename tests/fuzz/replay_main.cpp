// A main for a fuzz target without libFuzzer: the normal test build (g++, no sanitizers) links each
// target with it, so the targets keep compiling wherever the code under them changes, and ctest
// runs each one over its kept findings (tests/fuzz/seeds/TARGET) and over a fixed set of
// pseudo-random inputs. Those must pass through the target's checks (expect_clear_error: one
// tagged line, or finding() aborts) as they do under libFuzzer; scripts/fuzz.sh does the fuzzing.
//
//   replay_TARGET [FILE_OR_DIR...] [--random N]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

void run_one(const std::string& bytes) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

void run_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  run_one(std::string(std::istreambuf_iterator<char>(in), {}));
  std::printf("replay: %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  int64_t random_inputs = 0;
  std::vector<std::filesystem::path> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--random" && i + 1 < argc) random_inputs = std::atoll(argv[++i]);
    else paths.emplace_back(arg);
  }
  int64_t files = 0;
  for (const auto& path : paths) {
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path))
        if (entry.is_regular_file()) run_file(entry.path()), ++files;
    } else {
      run_file(path), ++files;
    }
  }
  // Inputs of 0..1023 bytes from a fixed xorshift stream: the same ones on every run.
  uint64_t state = 0x9E3779B97F4A7C15ull;
  const auto next = [&state] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  for (int64_t i = 0; i < random_inputs; ++i) {
    std::string bytes(next() % 1024, '\0');
    for (char& c : bytes) c = static_cast<char>(next() >> 56);
    run_one(bytes);
  }
  std::printf("replay: %lld files and %lld random inputs passed\n", static_cast<long long>(files),
              static_cast<long long>(random_inputs));
  return 0;
}
