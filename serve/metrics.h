// The server's counters for GET /metrics, in Prometheus's text format: requests by status,
// tokens, queue depth, busy slots and latency histograms. Every method is thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace nanogpt::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double value);
  /// `name`_bucket{le=...}, _sum and _count lines.
  std::string text(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  void request(int status);              // one HTTP request answered with `status`
  void tokens(int64_t prompt, int64_t generated);
  void first_token(double seconds);      // time from a sequence's arrival to its first token
  void inter_token(double seconds);      // between two tokens of a sequence
  void finished(double seconds);         // a sequence's whole time
  /// Everything, with the gauges given by the caller.
  std::string text(int64_t queue_depth, int64_t busy_slots, int64_t slots) const;

 private:
  mutable std::mutex mutex_;
  std::map<int, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  Histogram itl_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
  Histogram duration_{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}};
};

}  // namespace nanogpt::serve
