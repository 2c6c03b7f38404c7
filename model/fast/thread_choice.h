// Whether the decoder (model/fast/decoder.h) splits a token's products over LibTorch's threads or
// runs them on one, chosen by measuring both while it decodes.
//
// On a quiet machine the threads win (full-preset model: ~180 against ~330 us a token; CPU-preset
// model: 34 against 52 us); on a busy one each of the decoder's barriers can wait a scheduler time
// slice for a thread that lost its core (2 threads ran the CPU-preset model 10-100x slower than one
// while two builds shared the machine). So:
//  - A trial runs kTrial tokens alternating in pairs between all threads and one; only the second
//    token of a pair counts (the first pays for the switch), and the way with the faster counted
//    token is kept. The first trial starts at the first token.
//  - While the threads are kept, a running mean of their time per token that grows more than 10%
//    past the trial's one-thread token, and stays there for kPersist seconds of tokens, switches to
//    one thread. A hiccup (a page-reclaim pass, another tenant's burst) is shorter: right after a
//    server's first trial, one such made its threaded tokens ~2x slower for a few milliseconds and
//    the switch (then at once) kept one thread, 1.7x slower, for 256 tokens in 1 of 5 starts.
//  - With the threads kept, the next trial starts kPeriod tokens after the last one. With one
//    thread kept (by a trial or by the switch), it starts after a wait of kFirstWait tokens that
//    doubles with every such choice, up to kPeriod, and starts from kFirstWait again once a trial
//    is reached with the threads kept all along. So a short slowdown costs a short wait: the
//    switch also fires when another tenant slows both ways for a while (streaming memory through
//    the shared cache), and kept one thread to the end of the period before, which took ~30% off
//    3 of 20 samples of 2,000 tokens of the full-preset model. And a machine that stays busy pays
//    for few trials: a trial's tokens on the threads, and the tokens until the switch, can each
//    wait a time slice.
// The logits do not depend on the choice: each row and head is computed the same way on any thread.
// The decoder asks only for steps of fewer than four sequences (decoder.h: larger ones always take
// the threads).
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

namespace nanogpt::model {

class ThreadChoice {
 public:
  static constexpr int64_t kTrial = 16;       // tokens a trial: short, since a lost one costs a few stalls
  static constexpr int64_t kPeriod = 2048;    // tokens from one trial to the next while the threads are kept
  static constexpr int64_t kFirstWait = 256;  // tokens on one thread before the next trial, at first
  static constexpr double kPersist = 0.05;    // seconds of tokens the threads' mean stays too slow before the switch

  /// Whether the next token should run on all threads.
  bool use_threads() const;

  /// The time of the token just run, and whether it ran on all threads (as use_threads() said, or
  /// not when there was only one thread to run on).
  void record(bool threaded, double seconds);

  /// Whether the next token is part of a trial (for tests and logs).
  bool in_trial() const { return steps_ >= trial_at_ && steps_ - trial_at_ < kTrial; }

 private:
  void keep_one_thread();  // from now to the next trial, which comes after wait_ tokens (doubled)

  static constexpr double kInf = std::numeric_limits<double>::infinity();
  int64_t steps_ = 0;          // tokens recorded
  int64_t trial_at_ = 0;       // the token the current or next trial starts at
  int64_t wait_ = kFirstWait;  // tokens on one thread before the next trial, when one thread is chosen
  bool parallel_ = true;       // the way kept (outside trials)
  double trial_best_[2] = {kInf, kInf};  // [one thread, all threads]: the fastest counted token of this trial
  double serial_best_ = 0.0;             // seconds of the fastest one-thread token at the last trial
  double parallel_mean_ = 0.0;           // running mean of seconds per token on all threads since then
  double slow_seconds_ = 0.0;            // seconds of the tokens since the mean went past the switch's mark
};

/// How the decoder's products split their rows between the threads of a team: by measured speed.
/// An equal split left the faster thread waiting at every barrier for the slower one: on this
/// 2-vCPU host the second thread was the slower one, and the first waited 57-78 us of a ~370 us
/// token at the barriers against its 17-31 (full-preset model, 2,000 tokens). After each token,
/// each thread's fraction moves a fifth of the way to its share of the team's speed (its rows per
/// second of its own work, the barrier waits left out). A thread keeps about a quarter of an equal
/// share at least (the fractions are scaled back to a whole after), so one that stalled still has
/// rows to show it is fast again. Rows change threads only at the boundaries, so most of each
/// thread's weights stay in its caches. The logits do not depend on the split: each row is
/// computed the same way on any thread.
class WorkSplit {
 public:
  static constexpr double kStep = 0.2;        // how far a token moves the fractions toward the speeds
  static constexpr double kMinShare = 0.25;   // of an equal share: the least a thread keeps

  /// Equal fractions for `team` threads.
  explicit WorkSplit(int team = 1) { reset(team); }
  void reset(int team);
  int team() const { return static_cast<int>(bounds_.size()) - 1; }

  /// Thread `tid`'s items [begin, end) of n, in whole units of `unit` (the last unit may be short):
  /// the threads' ranges tile [0, n) in order.
  std::pair<int64_t, int64_t> share(int64_t n, int64_t unit, int tid) const {
    return range(n, unit, bounds_[tid], bounds_[tid + 1]);
  }
  /// The same for an equal split of `team` threads, without a WorkSplit.
  static std::pair<int64_t, int64_t> equal_share(int64_t n, int64_t unit, int tid, int team) {
    return range(n, unit, static_cast<double>(tid) / team, static_cast<double>(tid + 1) / team);
  }

  /// Thread `tid`'s items [begin, end) of items whose costs add up to `ends` (ends[i]: the cost of
  /// items 0 .. i), so that each thread's share of the cost follows its fraction: an item goes to
  /// the thread whose range holds the middle of its cost. The threads' ranges tile the items in order.
  std::pair<int64_t, int64_t> share_costs(const std::vector<double>& ends, int tid) const {
    return cost_range(ends, bounds_[tid], bounds_[tid + 1]);
  }
  /// The same for an equal split of `team` threads, without a WorkSplit.
  static std::pair<int64_t, int64_t> equal_share_costs(const std::vector<double>& ends, int tid, int team) {
    return cost_range(ends, static_cast<double>(tid) / team, static_cast<double>(tid + 1) / team);
  }

  /// Thread t's fraction of the rows.
  double fraction(int t) const { return bounds_[t + 1] - bounds_[t]; }

  /// After a token: busy[t], the seconds thread t spent working in it (not waiting), for every thread of the team.
  void update(const double* busy);

 private:
  /// The items [begin, end) of n, in whole units, between the cumulative fractions lo and hi.
  static std::pair<int64_t, int64_t> range(int64_t n, int64_t unit, double lo, double hi);
  /// The items whose costs' middles lie in [lo, hi) of the total (the last range ends at the last item).
  static std::pair<int64_t, int64_t> cost_range(const std::vector<double>& ends, double lo, double hi);

  std::vector<double> bounds_;  // team + 1 cumulative fractions: 0, ..., 1
};

/// A barrier for the threads of one OpenMP parallel region: each thread publishes, on a cache line
/// of its own, how many barriers it has passed, and waits until every other thread has passed as
/// many. Between the two cores of the project's VM `#pragma omp barrier` (libgomp) took ~275 ns and
/// this ~135 (docs/perf-log.md); the decoder passes 5 a layer. A waiting thread spins, and after
/// kSpins checks yields its core at each further one (a thread that lost its core to another
/// process can only come back if the waiting one lets it).
/// Usage: reset(team) outside the region, then every thread of a region of exactly `team` threads
/// calls wait(its index) the same number of times.
class TeamBarrier {
 public:
  static constexpr int64_t kSpins = 1 << 11;

  void reset(int team);
  int team() const { return team_; }
  void wait(int tid);

 private:
  struct alignas(64) Slot {
    std::atomic<int64_t> passed{0};
  };
  std::unique_ptr<Slot[]> slots_;
  int team_ = 0, capacity_ = 0;
};

}  // namespace nanogpt::model
