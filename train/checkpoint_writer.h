// Checkpoints written off the training thread. Between two steps the training thread copies what
// the checkpoint holds (weights, optimizer state, RNG and sampler states, the metadata) into host
// buffers kept from one save to the next — on CUDA, pinned ones filled by a device-to-host copy —
// and goes on; one writer thread serialises the copy and writes it atomically (temporary file,
// fsync, rename: io/atomic_file.h). A kill -9 at any moment therefore leaves the previous complete
// checkpoint or the new one, as a save on the training thread does.
//
// At most one save is in flight. A save asked for while the previous one is still being written
// waits for it: saves are never skipped, so the one at an evaluation, on Ctrl-C/SIGTERM and at the
// end all land, each from the state of its own iteration. A write's error reaches the training
// thread at its next check(), save() or finish() as the usual "[ckpt] cannot write ..." exception.
#pragma once

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "train/checkpoint.h"

namespace nanogpt::train {

class CheckpointWriter {
 public:
  /// `background`: write on a thread of its own (checkpoint_async: true); false: save() writes
  /// before it returns. Each finished save logs "[ckpt] saved PATH (iter N, T ms ...)" to `log`.
  CheckpointWriter(std::shared_ptr<spdlog::logger> log, bool background);
  /// Finishes the save in flight (an error of it is logged as a warning), then ends the thread.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Writes `content` (checkpoint_content(): the live tensors) at `iter` to each of `paths`, in
  /// order. In the background it first waits for the previous save and copies the tensors; it
  /// returns the milliseconds the caller was held (the wait, the copy, or the whole write when not in
  /// the background). Throws a previous save's error, or this one's when not in the background.
  double save(const std::vector<std::string>& paths, const CheckpointContent& content, int64_t iter);
  /// Throws the error of a background save that has failed since the last call, if any. Cheap:
  /// the trainer calls it after every step.
  void check();
  /// Waits for the save in flight, then throws its error, if any.
  void finish();
  /// Waits for the save in flight and returns its error message ("" for none): for a caller that is
  /// already failing with an error of its own.
  std::string finish_quietly();

 private:
  struct Job {
    std::vector<std::string> paths;
    CheckpointContent content;  // the snapshot: tensors in buffers_, metadata copied
    int64_t iter = 0;
    double paused_ms = 0;       // what the training thread spent on this save
  };
  void write(const Job& job);   // on the writer thread, or the caller's when not in the background
  void run_thread();
  /// Copies `content`'s tensors into buffers_ (allocated on first use, reused after).
  CheckpointContent snapshot(const CheckpointContent& content);
  void wait_idle(std::unique_lock<std::mutex>& lock);

  std::shared_ptr<spdlog::logger> log_;
  bool background_;
  int pause_ms_ = 0;  // tests: NANOGPT_TEST_CKPT_PAUSE_MS pauses each write half-way (see the .cpp)
  std::vector<torch::Tensor> buffers_;  // the snapshot's host memory, kept between saves
  std::mutex mutex_;
  std::condition_variable changed_;
  std::unique_ptr<Job> job_;  // handed to the thread; null when idle
  bool busy_ = false;         // a job is waiting or being written
  bool stop_ = false;
  std::string error_;         // the last failed write's message, until reported
  std::thread thread_;
};

}  // namespace nanogpt::train
