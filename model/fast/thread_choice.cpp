// The decoder's choice of threads (see thread_choice.h).
#include "model/fast/thread_choice.h"

#include <algorithm>
#include <cmath>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace nanogpt::model {

bool ThreadChoice::use_threads() const {
  if (in_trial()) return ((steps_ - trial_at_) / 2) % 2 == 0;  // pairs: all threads, one, all, ...
  return parallel_;
}

void ThreadChoice::keep_one_thread() {
  parallel_ = false;
  slow_seconds_ = 0.0;
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
      slow_seconds_ = 0.0;
      if (parallel_mean_ < serial_best_) {
        parallel_ = true;
        trial_at_ += kPeriod;
      } else {
        keep_one_thread();
      }
    }
  } else if (threaded) {
    // A token counts at most twice the one-thread time: a single stall (a time slice lost, the
    // other thread woken late) does not switch, while a machine that slows every token does, once
    // it has for kPersist seconds (a hiccup ends sooner). The 10% margin leaves room for the
    // attention's cost growing with the position since the trial.
    parallel_mean_ = 0.9 * parallel_mean_ + 0.1 * std::min(seconds, 2.0 * serial_best_);
    if (parallel_mean_ <= 1.1 * serial_best_) slow_seconds_ = 0.0;
    else if ((slow_seconds_ += seconds) >= kPersist) keep_one_thread();
  }
}

void WorkSplit::reset(int team) {
  bounds_.resize(team + 1);
  for (int t = 0; t <= team; ++t) bounds_[t] = static_cast<double>(t) / team;
}

std::pair<int64_t, int64_t> WorkSplit::range(int64_t n, int64_t unit, double lo, double hi) {
  const int64_t units = (n + unit - 1) / unit;
  const auto at = [&](double f) { return std::min<int64_t>(n, std::llround(f * static_cast<double>(units)) * unit); };
  return {at(lo), at(hi)};
}

std::pair<int64_t, int64_t> WorkSplit::cost_range(const std::vector<double>& ends, double lo, double hi) {
  const int64_t n = static_cast<int64_t>(ends.size());
  if (n == 0) return {0, 0};
  const double total = ends.back();
  const auto first_from = [&](double f) {  // the first item whose middle is at or past f of the total
    if (f >= 1.0 - 1e-9) return n;
    int64_t a = 0, b = n;
    while (a < b) {
      const int64_t m = (a + b) / 2;
      const double middle = ends[m] - 0.5 * (ends[m] - (m > 0 ? ends[m - 1] : 0.0));
      if (middle >= f * total) b = m;
      else a = m + 1;
    }
    return a;
  };
  return {lo <= 0.0 ? 0 : first_from(lo), first_from(hi)};
}

void WorkSplit::update(const double* busy) {
  const int n = team();
  if (n < 2) return;
  std::vector<double> speed(n);
  double total = 0.0;
  for (int t = 0; t < n; ++t) {
    if (!(busy[t] > 0.0) || !std::isfinite(busy[t])) return;  // no usable time: keep the split
    speed[t] = fraction(t) / busy[t];
    total += speed[t];
  }
  const double least = kMinShare / n;
  std::vector<double> f(n);
  double sum = 0.0;
  for (int t = 0; t < n; ++t) {
    f[t] = std::max(least, fraction(t) + kStep * (speed[t] / total - fraction(t)));
    sum += f[t];
  }
  for (int t = 0; t < n; ++t) bounds_[t + 1] = bounds_[t] + f[t] / sum;
  bounds_[n] = 1.0;
}

void TeamBarrier::reset(int team) {
  if (team > capacity_) {  // (the decoder's thread trials switch between 1 and all threads)
    slots_ = std::make_unique<Slot[]>(static_cast<size_t>(team));
    capacity_ = team;
  }
  team_ = team;
  for (int t = 0; t < team_; ++t) slots_[t].passed.store(0, std::memory_order_relaxed);
}

void TeamBarrier::wait(int tid) {
  auto& mine = slots_[tid].passed;
  const int64_t n = mine.load(std::memory_order_relaxed) + 1;  // only this thread writes its slot
  mine.store(n, std::memory_order_release);                     // what it wrote before, to the others
  for (int t = 0; t < team_; ++t) {
    if (t == tid) continue;
    for (int64_t spins = 0; slots_[t].passed.load(std::memory_order_acquire) < n; ++spins) {
      if (spins >= kSpins) {
        std::this_thread::yield();
        continue;
      }
#if defined(__x86_64__)
      _mm_pause();
#endif
    }
  }
}

}  // namespace nanogpt::model
