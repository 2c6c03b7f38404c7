// The background checkpoint writer (see checkpoint_writer.h).
#include "train/checkpoint_writer.h"

#include "runtime/threads.h"

#include <fmt/format.h>

#include <pthread.h>
#include <signal.h>  // pthread_sigmask

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <utility>

namespace nanogpt::train {
namespace {

using runtime::Clock;
using runtime::ms_since;

// Tests only: NANOGPT_TEST_CKPT_PAUSE_MS=N makes every checkpoint write pause N ms once half of its
// tensors are in the temporary file, so that a test can kill the process mid-write on purpose.
int pause_from_environment() {
  const char* text = std::getenv("NANOGPT_TEST_CKPT_PAUSE_MS");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long ms = std::strtol(text, &end, 10);
  if (*end != '\0' || ms < 0 || ms > 3600 * 1000)
    throw std::runtime_error(fmt::format("[ckpt] NANOGPT_TEST_CKPT_PAUSE_MS ('{}') must be milliseconds, 0 to 3600000 "
                                         "(a test setting: unset it to train)",
                                         text));
  return static_cast<int>(ms);
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::shared_ptr<spdlog::logger> log, bool background)
    : log_(std::move(log)), background_(background), pause_ms_(pause_from_environment()) {
  if (!background_) return;
  // Ctrl-C and SIGTERM must reach the training thread (train/signals.h), never this one: the thread
  // starts with them blocked (a new thread inherits the signal mask), and this one's mask is restored.
  const sigset_t previous = runtime::block_stop_signals();
  thread_ = std::thread([this] { run_thread(); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

CheckpointWriter::~CheckpointWriter() {
  const std::string error = finish_quietly();
  if (!error.empty()) log_->warn("{}", error);
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

double CheckpointWriter::save(const std::vector<std::string>& paths, const CheckpointContent& content, int64_t iter) {
  const auto t0 = Clock::now();
  if (!background_) {
    write({paths, content, iter, 0});
    return ms_since(t0);
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_idle(lock);
    if (!error_.empty()) throw std::runtime_error(std::exchange(error_, ""));
  }
  // The thread is idle: the buffers are free until the job below is handed over.
  auto job = std::make_unique<Job>();
  job->paths = paths;
  job->content = snapshot(content);
  job->iter = iter;
  job->paused_ms = ms_since(t0);
  const double paused_ms = job->paused_ms;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = std::move(job);
    busy_ = true;
  }
  changed_.notify_all();
  return paused_ms;
}

void CheckpointWriter::check() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.empty()) throw std::runtime_error(std::exchange(error_, ""));
}

void CheckpointWriter::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_idle(lock);
  if (!error_.empty()) throw std::runtime_error(std::exchange(error_, ""));
}

std::string CheckpointWriter::finish_quietly() {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_idle(lock);
  return std::exchange(error_, "");
}

void CheckpointWriter::wait_idle(std::unique_lock<std::mutex>& lock) {
  changed_.wait(lock, [this] { return !busy_; });
}

CheckpointContent CheckpointWriter::snapshot(const CheckpointContent& content) {
  torch::NoGradGuard no_grad;
  CheckpointContent copy;
  copy.metadata = content.metadata;
  buffers_.resize(content.tensors.size());
  for (size_t i = 0; i < content.tensors.size(); ++i) {
    const auto& [name, source] = content.tensors[i];
    torch::Tensor& buffer = buffers_[i];
    if (!buffer.defined() || buffer.sizes() != source.sizes() || buffer.scalar_type() != source.scalar_type())
      // Pinned host memory for a GPU tensor: its copy is one DMA transfer, not staged.
      buffer = torch::empty(source.sizes(), torch::TensorOptions().dtype(source.scalar_type()).pinned_memory(source.is_cuda()));
    buffer.copy_(source);  // from a GPU: waits for the transfer, so the next step cannot change what is copied
    copy.tensors.emplace_back(name, buffer);
  }
  return copy;
}

void CheckpointWriter::write(const Job& job) {
  std::function<void(size_t)> pause;
  if (pause_ms_ > 0) {
    const size_t half = (job.content.tensors.size() + 1) / 2;
    pause = [this, half](size_t written) {
      if (written == half) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms_));
    };
  }
  for (size_t i = 0; i < job.paths.size(); ++i) {
    const auto t0 = Clock::now();
    write_checkpoint(job.paths[i], job.content, pause);
    const double ms = ms_since(t0);
    if (!background_)
      log_->info("[ckpt] saved {} (iter {}, {:.0f} ms)", job.paths[i], job.iter, ms);
    else if (i == 0)
      log_->info("[ckpt] saved {} (iter {}, {:.0f} ms in the background; training paused {:.0f} ms)", job.paths[i],
                 job.iter, ms, job.paused_ms);
    else
      log_->info("[ckpt] saved {} (iter {}, {:.0f} ms in the background)", job.paths[i], job.iter, ms);
  }
}

void CheckpointWriter::run_thread() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stop_ || job_; });
      if (!job_) return;  // stopping, nothing left to write
      job = std::move(job_);
    }
    std::string error;
    try {
      write(*job);
    } catch (const std::exception& e) {
      error = e.what();
    }
    job.reset();  // the snapshot's tensors are buffers_ again before anyone refills them
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error.empty()) error_ = error;
      busy_ = false;
    }
    changed_.notify_all();
  }
}

}  // namespace nanogpt::train
