// Which run writes into an out_dir. A run that starts afresh draws an id and writes it to
// out_dir/run_id (atomically) before anything else; its checkpoints carry the same id. A worker
// group that torchrun restarted reads the file back and resumes ckpt_last only when it carries
// that id: never another run's checkpoint, and always its own (docs/checkpoints.md).
#pragma once

#include <string>

namespace nanogpt::train {

constexpr const char* kRunIdFile = "run_id";

/// What out_dir/run_id holds: two lines, `id` then `launch`.
struct RunId {
  std::string id;      // 16 random hex digits; the checkpoints' run_id metadata
  std::string launch;  // TORCHELASTIC_RUN_ID of the torchrun that started the run ("" without torchrun)
};

/// A fresh id: 16 hex digits from the operating system's random source.
std::string new_run_id();

/// out_dir's run, or an empty RunId when out_dir has no readable run_id file.
RunId read_run_id(const std::string& out_dir);

/// Writes out_dir/run_id atomically. Throws "[train] cannot write '.../run_id': reason".
void write_run_id(const std::string& out_dir, const RunId& run);

}  // namespace nanogpt::train
