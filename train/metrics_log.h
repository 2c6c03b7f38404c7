// metrics.csv: one machine-readable row per logged step and per evaluation.
//   iter,split,loss,lr,ms,tokens_per_sec      split = train | val | train_eval
// Losses are written with 9 significant digits, enough to reproduce an fp32 value exactly, so two
// runs can be compared bit for bit.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace nanogpt::train {

class MetricsLog {
 public:
  /// Opens `path` for appending. On resume (keep_until >= 0) rows that the checkpoint does not
  /// cover are dropped first (atomically): train rows with iter >= keep_until, and eval rows with
  /// iter > keep_until (or == keep_until when !keep_eval_at_end). Otherwise the file starts afresh.
  MetricsLog(const std::string& path, int64_t keep_until, bool keep_eval_at_end);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void row(int64_t iter, const char* split, double loss, double lr, double ms, double tokens_per_sec);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace nanogpt::train
