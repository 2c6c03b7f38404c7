// Small things every long-lived part of the program (the training loop, the checkpoint writer, the
// server) needs about time and threads: elapsed milliseconds on the steady clock, and starting a
// thread that never receives Ctrl-C or SIGTERM (those go to one chosen thread, which decides what
// stopping means: train/signals.h for training, a watcher thread for `serve`).
#pragma once

#include <chrono>
#include <csignal>

namespace nanogpt::runtime {

using Clock = std::chrono::steady_clock;

/// Milliseconds from t0 to now.
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// The set {SIGINT, SIGTERM}.
inline sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

/// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread it starts afterwards, which
/// inherits the mask); returns the mask before, for pthread_sigmask(SIG_SETMASK, &previous, nullptr).
inline sigset_t block_stop_signals() {
  const sigset_t set = stop_signal_set();
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &set, &previous);
  return previous;
}

}  // namespace nanogpt::runtime
