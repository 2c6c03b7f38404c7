// The trainer's metrics log, out_dir/metrics.csv, written, truncated on resume and read in one place:
//   iter,split,loss,lr,ms,tokens_per_sec
// one row per logged training step (split "train") and per evaluation ("val", "train_eval").
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace nanogpt::io {

constexpr const char* kMetricsHeader = "iter,split,loss,lr,ms,tokens_per_sec";

struct MetricPoint {
  int64_t iter = 0;
  double loss = 0;            // may be NaN or inf (a diverged run): plots skip those
  double lr = 0;              // NaN when the field is empty
  double ms = 0;              // NaN when the field is empty
  double tokens_per_sec = 0;  // NaN when the field is empty
};

/// One series per split, sorted by iter. When an iteration appears twice in a split (a resumed
/// run re-logs the steps after its checkpoint), the later row wins.
struct Metrics {
  std::vector<MetricPoint> train;
  std::vector<MetricPoint> val;
  std::vector<MetricPoint> train_eval;
};

/// Parses `path`. Blank lines and repeated header lines are skipped; an unterminated last line
/// that does not parse is taken as a write in progress and ignored. Throws std::runtime_error:
///   "[viz] cannot read 'path': No such file or directory"
///   "[viz] 'path' does not start with the metrics header 'iter,split,...' (found '...')"
///   "[viz] 'path' line 7: expected 6 comma-separated fields, found 4: '...'"
///   "[viz] 'path' line 9: split 'test' is not one of train, val, train_eval"
Metrics read_metrics_csv(const std::string& path);

/// The writer. Losses are written with 9 significant digits, enough to reproduce an fp32 value
/// exactly, so two runs can be compared bit for bit.
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

}  // namespace nanogpt::io
