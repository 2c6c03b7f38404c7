// The decoder's choice of threads (model/fast/thread_choice.h), driven by made-up token times: a
// "machine" says how long a token takes on all threads and on one, token by token, and the tests
// follow what ThreadChoice asks for. Times are those measured for the full-preset model: ~180 us a
// token on two threads and ~330 us on one on a quiet machine; a stalled two-thread token (the other
// thread lost its core) ~4 ms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "model/fast/thread_choice.h"

using nanogpt::model::ThreadChoice;

namespace {

constexpr double kThreads = 180e-6, kOne = 330e-6, kStalled = 4e-3;

// Seconds a token takes at token i, on all threads or on one.
using Machine = std::function<double(int64_t i, bool threaded)>;

struct Decoding {
  std::vector<bool> threaded;  // each token's way
  int64_t trials = 0;          // trials started
  double seconds = 0.0;        // total

  int64_t threaded_in(int64_t from, int64_t to) const {
    int64_t n = 0;
    for (int64_t i = from; i < to; ++i) n += threaded[i];
    return n;
  }
};

Decoding run(const Machine& machine, int64_t tokens) {
  ThreadChoice choice;
  Decoding r;
  bool was_in_trial = false;
  for (int64_t i = 0; i < tokens; ++i) {
    r.trials += choice.in_trial() && !was_in_trial;
    was_in_trial = choice.in_trial();
    const bool threaded = choice.use_threads();
    const double t = machine(i, threaded);
    choice.record(threaded, t);
    r.threaded.push_back(threaded);
    r.seconds += t;
  }
  return r;
}

}  // namespace

TEST(ThreadChoice, AQuietMachineKeepsTheThreadsBetweenPeriodicTrials) {
  const int64_t n = 5000;
  const Decoding r = run([](int64_t, bool threaded) { return threaded ? kThreads : kOne; }, n);
  EXPECT_EQ(r.trials, (n + ThreadChoice::kPeriod - 1) / ThreadChoice::kPeriod);  // one every period
  EXPECT_EQ(r.threaded_in(0, n), n - r.trials * ThreadChoice::kTrial / 2);       // one thread only in trials
}

TEST(ThreadChoice, AShortSlowdownOfBothWaysKeepsTheThreads) {
  // Tokens 800-900 are 2.2x slower either way (another tenant streaming through the shared cache):
  // the threads' running mean passes the one-thread token of the first trial, but for 40 ms of
  // tokens, less than kPersist: the threads stay (they are still the faster way).
  const auto machine = [](int64_t i, bool threaded) {
    const double slow = i >= 800 && i < 900 ? 2.2 : 1.0;
    return slow * (threaded ? kThreads : kOne);
  };
  const Decoding r = run(machine, 2000);
  EXPECT_EQ(r.trials, 1);
  EXPECT_EQ(r.threaded_in(ThreadChoice::kTrial, 2000), 2000 - ThreadChoice::kTrial);
}

TEST(ThreadChoice, ALongSlowdownOfBothWaysCostsOneShortWait) {
  // The same for tokens 800-1300 (200 ms): one thread takes over once the mean has been past the
  // mark for kPersist seconds, but only for kFirstWait tokens: the next trial finds the threads
  // faster. (It used to keep one thread to the end of the period, token 2048.)
  const auto machine = [](int64_t i, bool threaded) {
    const double slow = i >= 800 && i < 1300 ? 2.2 : 1.0;
    return slow * (threaded ? kThreads : kOne);
  };
  const Decoding r = run(machine, 2000);
  EXPECT_EQ(r.trials, 2);  // the first, and one after the wait
  // The mean of 2.2x-slower threads passes 1.1x the one-thread token in 18 tokens, then kPersist.
  const int64_t back = 800 + 20 + static_cast<int64_t>(ThreadChoice::kPersist / (2.2 * kThreads)) + 1 +
                       ThreadChoice::kFirstWait + ThreadChoice::kTrial;
  EXPECT_EQ(r.threaded_in(back, 2000), 2000 - back);
  EXPECT_GE(r.threaded_in(0, 2000), 2000 - ThreadChoice::kFirstWait - 2 * ThreadChoice::kTrial / 2);
}

TEST(ThreadChoice, AHiccupRightAfterATrialKeepsTheThreads) {
  // Right after the first trial, 8 threaded tokens stall (32 ms: the machine paused, as once at a
  // server's start). The old switch fired at once and kept one thread, 1.8x slower, for 256
  // tokens; the threads now stay.
  const auto machine = [](int64_t i, bool threaded) {
    return threaded ? (i >= 20 && i < 28 ? kStalled : kThreads) : kOne;
  };
  const Decoding r = run(machine, 1000);
  EXPECT_EQ(r.trials, 1);
  EXPECT_EQ(r.threaded_in(ThreadChoice::kTrial, 1000), 1000 - ThreadChoice::kTrial);
}

TEST(ThreadChoice, AnotherProgramOnTheOtherCoreMovesToOneThreadWithinAFewTokens) {
  // From token 500 the second thread stalls every token.
  const auto machine = [](int64_t i, bool threaded) { return threaded ? (i < 500 ? kThreads : kStalled) : kOne; };
  const Decoding r = run(machine, 2000);
  int64_t switched = 500;
  while (switched < 2000 && r.threaded[switched]) ++switched;
  EXPECT_LE(switched - 500, 10 + static_cast<int64_t>(ThreadChoice::kPersist / kStalled) + 1);  // kPersist: 13 tokens
  // After the switch only the later trials run on the threads, half their tokens each.
  EXPECT_EQ(r.threaded_in(switched, 2000), (r.trials - 1) * ThreadChoice::kTrial / 2);
  EXPECT_EQ(r.trials, 3);  // after waits of 256 and 512 tokens; the next, after 1,024, is past the end
}

TEST(ThreadChoice, ABusyMachineIsCheckedLessAndLessOften) {
  // The threads always stall: every trial keeps one thread, and the wait to the next one doubles
  // from kFirstWait to kPeriod, so the trials (each with a few stalled tokens) grow with the log of
  // the run's length until the waits reach kPeriod.
  const int64_t n = 20000;
  const Decoding r = run([](int64_t, bool threaded) { return threaded ? kStalled : kOne; }, n);
  int64_t expected = 1, at = ThreadChoice::kTrial, wait = ThreadChoice::kFirstWait;  // `at`: the end of a trial
  while (at + wait < n) {
    at += wait + ThreadChoice::kTrial;
    wait = std::min(2 * wait, ThreadChoice::kPeriod);
    ++expected;
  }
  EXPECT_EQ(r.trials, expected);
  EXPECT_LE(r.trials, 1 + static_cast<int64_t>(std::log2(static_cast<double>(ThreadChoice::kPeriod) /
                                                         ThreadChoice::kFirstWait)) +
                          n / ThreadChoice::kPeriod);
  EXPECT_EQ(r.threaded_in(0, n), r.trials * ThreadChoice::kTrial / 2);
}

TEST(ThreadChoice, ALuckyTrialCostsAFewStalledTokens) {
  // The threads stall on every token but one of each trial's counted ones (the other core's
  // program happened to sleep): the trial keeps the threads, the running mean switches to one
  // thread within a few tokens and kPersist, and the waits still double, so the lucky trials stay few.
  const int64_t n = 20000;
  int64_t threaded_tokens = 0;
  const auto machine = [&](int64_t, bool threaded) {
    if (!threaded) return kOne;
    return ++threaded_tokens % (ThreadChoice::kTrial / 2) == 2 ? kThreads : kStalled;  // the first counted
  };
  const Decoding r = run(machine, n);
  EXPECT_LE(r.trials, 1 + static_cast<int64_t>(std::log2(static_cast<double>(ThreadChoice::kPeriod) /
                                                         ThreadChoice::kFirstWait)) +
                          n / ThreadChoice::kPeriod);
  const int64_t switch_within = 10 + static_cast<int64_t>(ThreadChoice::kPersist / kStalled) + 1;
  EXPECT_LE(r.threaded_in(0, n), r.trials * (ThreadChoice::kTrial / 2 + switch_within));
}

TEST(ThreadChoice, TheThreadsComeBackWhenTheMachineQuietens) {
  // Busy until token 1000, quiet after: the threads are back after the wait under way at 1000, which
  // is at most kPeriod, and stay.
  const auto machine = [](int64_t i, bool threaded) { return threaded ? (i < 1000 ? kStalled : kThreads) : kOne; };
  const int64_t n = 6000, by = 1000 + ThreadChoice::kPeriod + ThreadChoice::kTrial;
  const Decoding r = run(machine, n);
  const int64_t trials_after = (n - by) / ThreadChoice::kPeriod + 1;  // one a period from there on
  EXPECT_GE(r.threaded_in(by, n), n - by - trials_after * ThreadChoice::kTrial / 2);
}

// The decoder's split of the rows between its threads (WorkSplit), driven by made-up busy times.

using nanogpt::model::WorkSplit;

namespace {

// One token on threads of the given speeds (rows per second, relative): each thread's busy time is
// its fraction over its speed.
void token(WorkSplit& split, const std::vector<double>& speed) {
  std::vector<double> busy(speed.size());
  for (size_t t = 0; t < speed.size(); ++t) busy[t] = split.fraction(static_cast<int>(t)) / speed[t];
  split.update(busy.data());
}

}  // namespace

TEST(WorkSplit, SharesTileTheItemsInOrderInWholeUnits) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> speed(0.2, 5.0);
  for (int team = 1; team <= 4; ++team) {
    WorkSplit split(team);
    for (int round = 0; round < 20; ++round) {
      for (int64_t n : {1, 3, 5, 65, 384, 1152, 1536})
        for (int64_t unit : {1, 4}) {
          int64_t next = 0;
          for (int t = 0; t < team; ++t) {
            const auto [begin, end] = split.share(n, unit, t);
            EXPECT_EQ(begin, next) << team << " threads, n " << n << ", thread " << t;
            EXPECT_LE(begin, end);
            EXPECT_TRUE(begin % unit == 0 || begin == n);
            next = end;
          }
          EXPECT_EQ(next, n) << team << " threads, n " << n;
        }
      std::vector<double> speeds(team);
      for (auto& s : speeds) s = speed(rng);
      token(split, speeds);
    }
  }
}

// Items of unequal cost (the attention's kv heads, each costing its cache's positions) are split by
// cost: the ranges tile the items in order, and each thread's cost is its fraction of the total
// within one item's cost (the largest). Sorted long-first, as serving's slots often are, an equal
// count of items would give the first of two threads most of the cost.
TEST(WorkSplit, ItemsOfUnequalCostAreSplitByCost) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> cost(1, 300);
  for (int team = 1; team <= 4; ++team) {
    WorkSplit split(team);
    for (int round = 0; round < 20; ++round) {
      for (int64_t n : {1, 2, 7, 96}) {
        std::vector<double> costs(n), ends(n);
        for (auto& c : costs) c = cost(rng);
        if (round % 2) std::sort(costs.rbegin(), costs.rend());
        for (int64_t i = 0; i < n; ++i) ends[i] = (i ? ends[i - 1] : 0.0) + costs[i];
        const double largest = *std::max_element(costs.begin(), costs.end());
        int64_t next = 0;
        for (int t = 0; t < team; ++t) {
          const auto [begin, end] = split.share_costs(ends, t);
          const auto [b2, e2] = WorkSplit::equal_share_costs(ends, t, team);
          EXPECT_EQ(begin, next) << team << " threads, n " << n << ", thread " << t;
          EXPECT_LE(begin, end);
          EXPECT_LE(b2, e2);
          const double mine = (end > 0 ? ends[end - 1] : 0.0) - (begin > 0 ? ends[begin - 1] : 0.0);
          EXPECT_NEAR(mine, split.fraction(t) * ends.back(), largest) << team << " threads, n " << n << ", thread " << t;
          next = end;
        }
        EXPECT_EQ(next, n) << team << " threads, n " << n;
      }
      std::vector<double> speeds(team);
      for (auto& s : speeds) s = std::uniform_real_distribution<double>(0.2, 5.0)(rng);
      token(split, speeds);
    }
  }
  // Long caches first: an even count of 8 items gives the first of two threads 4 x 200 of 1,000;
  // by cost it gets 2 or 3 of them.
  const std::vector<double> ends{200, 400, 600, 800, 850, 900, 950, 1000};
  const auto [begin, end] = WorkSplit::equal_share_costs(ends, 0, 2);
  EXPECT_EQ(begin, 0);
  EXPECT_LE(end, 3);
}

TEST(WorkSplit, ASlowerThreadGetsFewerRowsUntilTheBusyTimesMatch) {
  WorkSplit split(2);
  for (int i = 0; i < 20; ++i) token(split, {1.0, 1.0});  // equal speeds: equal shares
  EXPECT_DOUBLE_EQ(split.fraction(0), 0.5);
  for (int i = 0; i < 60; ++i) token(split, {1.0, 0.5});  // the second thread at half speed
  EXPECT_NEAR(split.fraction(0), 2.0 / 3.0, 1e-4);
  EXPECT_NEAR(split.fraction(0) / 1.0, split.fraction(1) / 0.5, 1e-3);  // the same busy time
  for (int i = 0; i < 60; ++i) token(split, {1.0, 1.0});  // and back
  EXPECT_NEAR(split.fraction(0), 0.5, 1e-4);
  WorkSplit three(3);
  for (int i = 0; i < 80; ++i) token(three, {1.0, 2.0, 1.0});
  EXPECT_NEAR(three.fraction(1), 0.5, 1e-4);
}

TEST(WorkSplit, AStalledThreadKeepsSomeRows) {
  WorkSplit split(2);
  for (int i = 0; i < 100; ++i) token(split, {1.0, 1e-4});  // the second thread all but stopped
  EXPECT_GE(split.fraction(1), 0.8 * WorkSplit::kMinShare / 2);
  EXPECT_LT(split.fraction(1), 1.2 * WorkSplit::kMinShare / 2);
  for (int i = 0; i < 60; ++i) token(split, {1.0, 1.0});
  EXPECT_NEAR(split.fraction(1), 0.5, 1e-3);  // it has rows to show it is fast again
}

TEST(WorkSplit, UnusableTimesLeaveTheSplitAsItIs) {
  WorkSplit split(2);
  token(split, {1.0, 0.5});
  const double before = split.fraction(0);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    const double busy[2] = {1e-4, bad};
    split.update(busy);
    EXPECT_EQ(split.fraction(0), before) << bad;
  }
}

// TeamBarrier: no thread leaves a barrier before every thread has reached it, and what each wrote
// before it is what the others read after it: in every round each thread writes the round into its
// cell, passes a barrier, checks every cell, and passes another before the next round writes. More
// threads than the machine's cores too (the waiting threads must yield theirs), and a barrier reset
// for a smaller team.
TEST(TeamBarrier, EveryThreadSeesWhatTheOthersWroteBeforeIt) {
  using nanogpt::model::TeamBarrier;
  TeamBarrier barrier;
  for (int team : {2, 4, 3}) {
    barrier.reset(team);
    ASSERT_EQ(barrier.team(), team);
    constexpr int kRounds = 2000;
    std::vector<int> cell(team, -1), wrong(team, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < team; ++t)
      threads.emplace_back([&, t] {
        for (int round = 0; round < kRounds; ++round) {
          cell[t] = round;
          barrier.wait(t);
          for (int u = 0; u < team; ++u) wrong[t] += cell[u] != round;
          barrier.wait(t);
        }
      });
    for (auto& th : threads) th.join();
    for (int t = 0; t < team; ++t) EXPECT_EQ(wrong[t], 0) << "team " << team << ", thread " << t;
  }
}
