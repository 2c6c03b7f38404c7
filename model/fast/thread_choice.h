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
//    past the trial's one-thread token switches to one thread at once.
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
#pragma once

#include <cstdint>
#include <limits>

namespace nanogpt::model {

class ThreadChoice {
 public:
  static constexpr int64_t kTrial = 16;       // tokens a trial: short, since a lost one costs a few stalls
  static constexpr int64_t kPeriod = 2048;    // tokens from one trial to the next while the threads are kept
  static constexpr int64_t kFirstWait = 256;  // tokens on one thread before the next trial, at first

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
};

}  // namespace nanogpt::model
