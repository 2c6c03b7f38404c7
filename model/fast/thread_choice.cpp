// The decoder's choice of threads (see thread_choice.h).
#include "model/fast/thread_choice.h"

#include <algorithm>

namespace nanogpt::model {

bool ThreadChoice::use_threads() const {
  if (in_trial()) return ((steps_ - trial_at_) / 2) % 2 == 0;  // pairs: all threads, one, all, ...
  return parallel_;
}

void ThreadChoice::keep_one_thread() {
  parallel_ = false;
  trial_at_ = steps_ + wait_;
  wait_ = std::min(2 * wait_, kPeriod);
}

void ThreadChoice::record(bool threaded, double seconds) {
  if (steps_ == trial_at_ && parallel_) wait_ = kFirstWait;  // a trial reached with the threads kept all along
  const bool trial = in_trial();
  const int64_t phase = steps_++ - trial_at_;
  if (trial) {
    // Only the second token of each pair counts: the first after a switch pays for it (the other
    // thread woken from its sleep, or the weights it cached now read by this one). The fastest
    // counted token of each way: a stall only ever adds (measured: 27 us a token, and once 4 ms).
    if (phase % 2 == 1) trial_best_[threaded] = std::min(trial_best_[threaded], seconds);
    if (phase == kTrial - 1) {
      serial_best_ = trial_best_[0];
      parallel_mean_ = trial_best_[1];
      trial_best_[0] = trial_best_[1] = kInf;
      if (parallel_mean_ < serial_best_) {
        parallel_ = true;
        trial_at_ += kPeriod;
      } else {
        keep_one_thread();
      }
    }
  } else if (threaded) {
    // A token counts at most twice the one-thread time: a single stall (a time slice lost, the
    // other thread woken late) does not switch, while a machine that slows every token does within
    // a few. The 10% margin leaves room for the attention's cost growing with the position since
    // the trial.
    parallel_mean_ = 0.9 * parallel_mean_ + 0.1 * std::min(seconds, 2.0 * serial_best_);
    if (parallel_mean_ > 1.1 * serial_best_) keep_one_thread();
  }
}

}  // namespace nanogpt::model
