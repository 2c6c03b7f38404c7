// Prometheus text for the server's counters (see metrics.h).
#include "serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace nanogpt::serve {

void Histogram::observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

std::string Histogram::text(const std::string& name, const std::string& help) const {
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
  return out;
}

void Metrics::request(int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[status];
}

void Metrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mutex_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_.observe(seconds);
}

void Metrics::inter_token(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  itl_.observe(seconds);
}

void Metrics::finished(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  duration_.observe(seconds);
}

std::string Metrics::text(int64_t queue_depth, int64_t busy_slots, int64_t slots) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out = "# HELP nanogpt_requests_total HTTP requests answered, by status\n# TYPE nanogpt_requests_total counter\n";
  for (const auto& [status, n] : requests_) out += fmt::format("nanogpt_requests_total{{code=\"{}\"}} {}\n", status, n);
  out += fmt::format(
      "# HELP nanogpt_prompt_tokens_total Prompt tokens taken in\n# TYPE nanogpt_prompt_tokens_total counter\n"
      "nanogpt_prompt_tokens_total {}\n"
      "# HELP nanogpt_generated_tokens_total Tokens generated\n# TYPE nanogpt_generated_tokens_total counter\n"
      "nanogpt_generated_tokens_total {}\n"
      "# HELP nanogpt_queue_depth Sequences waiting for a slot\n# TYPE nanogpt_queue_depth gauge\nnanogpt_queue_depth {}\n"
      "# HELP nanogpt_busy_slots Slots generating\n# TYPE nanogpt_busy_slots gauge\nnanogpt_busy_slots {}\n"
      "# HELP nanogpt_slots Slots in all (--parallel)\n# TYPE nanogpt_slots gauge\nnanogpt_slots {}\n",
      prompt_tokens_, generated_tokens_, queue_depth, busy_slots, slots);
  out += ttft_.text("nanogpt_time_to_first_token_seconds", "From a sequence's arrival to its first token");
  out += itl_.text("nanogpt_inter_token_seconds", "Between two tokens of a sequence");
  out += duration_.text("nanogpt_sequence_seconds", "A sequence's whole time, queue included");
  return out;
}

}  // namespace nanogpt::serve
