// The run id file (see run_id.h).
#include "train/run_id.h"

#include <fmt/format.h>

#include <fstream>
#include <random>

#include "io/atomic_file.h"

namespace nanogpt::train {

std::string new_run_id() {
  std::random_device source;  // /dev/urandom: two runs started in the same instant still differ
  const uint64_t bits = (static_cast<uint64_t>(source()) << 32) ^ source();
  return fmt::format("{:016x}", bits);
}

RunId read_run_id(const std::string& out_dir) {
  RunId run;
  std::ifstream in(out_dir + "/" + kRunIdFile);
  if (!std::getline(in, run.id)) return {};
  std::getline(in, run.launch);
  return run;
}

void write_run_id(const std::string& out_dir, const RunId& run) {
  io::write_bytes_atomically(out_dir + "/" + kRunIdFile, run.id + "\n" + run.launch + "\n", "train");
}

}  // namespace nanogpt::train
