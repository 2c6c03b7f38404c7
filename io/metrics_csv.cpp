// metrics.csv: parsing is strict about the header and each complete line, lenient with a torn last
// line; the writer appends and flushes one row per call.
#include "io/metrics_csv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "io/atomic_file.h"

namespace nanogpt::io {
namespace {

constexpr size_t kFieldCount = 6;

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    fields.push_back(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return fields;
    start = comma + 1;
  }
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// A malformed line; the caller adds the file and line number.
struct LineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double parse_number(const std::string& field, const char* name, bool optional) {
  const std::string text = trim(field);
  if (text.empty()) {
    if (optional) return std::numeric_limits<double>::quiet_NaN();
    throw LineError(std::string(name) + " is empty");
  }
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) throw LineError(std::string(name) + " '" + text + "' is not a number");
  return value;  // nan / inf / overflow are kept: the loss of a diverged run is still a data point
}

int64_t parse_iter(const std::string& field) {
  const std::string text = trim(field);
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || value < 0) {
    throw LineError("iter '" + text + "' is not a non-negative integer");
  }
  return value;
}

// Sorts by iter, keeping the last-read row of each iteration.
void sort_keep_last(std::vector<MetricPoint>& points) {
  std::stable_sort(points.begin(), points.end(),
                   [](const MetricPoint& a, const MetricPoint& b) { return a.iter < b.iter; });
  std::vector<MetricPoint> unique;
  unique.reserve(points.size());
  for (const MetricPoint& p : points) {
    if (!unique.empty() && unique.back().iter == p.iter) {
      unique.back() = p;
    } else {
      unique.push_back(p);
    }
  }
  points.swap(unique);
}

}  // namespace

Metrics read_metrics_csv(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw std::runtime_error("[viz] cannot read '" + path + "': it is a directory (pass out_dir/metrics.csv)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("[viz] cannot read '" + path + "': " + std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  Metrics metrics;
  size_t pos = 0;
  int64_t line_number = 0;
  bool saw_header = false;
  while (pos < text.size()) {
    const size_t newline = text.find('\n', pos);
    const bool terminated = newline != std::string::npos;
    std::string line = text.substr(pos, terminated ? newline - pos : std::string::npos);
    pos = terminated ? newline + 1 : text.size();
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 BOM

    if (!saw_header) {
      if (trim(line) != kMetricsHeader) {
        throw std::runtime_error("[viz] '" + path + "' does not start with the metrics header '" + kMetricsHeader +
                                 "' (found '" + line.substr(0, 80) + "'); is it a nanogpt metrics.csv?");
      }
      saw_header = true;
      continue;
    }
    if (trim(line).empty() || trim(line) == kMetricsHeader) continue;

    try {
      const std::vector<std::string> fields = split_fields(line);
      if (fields.size() != kFieldCount) {
        throw LineError(fmt::format("expected {} comma-separated fields, found {}", kFieldCount, fields.size()));
      }
      MetricPoint point;
      point.iter = parse_iter(fields[0]);
      point.loss = parse_number(fields[2], "loss", /*optional=*/false);
      point.lr = parse_number(fields[3], "lr", true);
      point.ms = parse_number(fields[4], "ms", true);
      point.tokens_per_sec = parse_number(fields[5], "tokens_per_sec", true);
      const std::string split = trim(fields[1]);
      if (split == "train") {
        metrics.train.push_back(point);
      } else if (split == "val") {
        metrics.val.push_back(point);
      } else if (split == "train_eval") {
        metrics.train_eval.push_back(point);
      } else {
        throw LineError("split '" + split + "' is not one of train, val, train_eval");
      }
    } catch (const LineError& e) {
      if (!terminated) break;  // the writer is mid-line; the rest arrives with the next flush
      throw std::runtime_error(fmt::format("[viz] '{}' line {}: {}: '{}'", path, line_number, e.what(), line.substr(0, 120)));
    }
  }
  if (!saw_header) {
    throw std::runtime_error("[viz] '" + path + "' is empty; expected the header '" + std::string(kMetricsHeader) +
                             "' (has training logged anything yet?)");
  }
  sort_keep_last(metrics.train);
  sort_keep_last(metrics.val);
  sort_keep_last(metrics.train_eval);
  return metrics;
}

MetricsLog::MetricsLog(const std::string& path, int64_t keep_until, bool keep_eval_at_end) : path_(path) {
  std::string kept = std::string(kMetricsHeader) + "\n";
  if (keep_until >= 0) {
    std::ifstream in(path);
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
      if (first) {
        first = false;
        continue;  // header
      }
      const std::vector<std::string> fields = split_fields(line);  // the reader's parsing, above
      if (fields.size() < 2) continue;
      int64_t iter = 0;
      try {
        iter = parse_iter(fields[0]);
      } catch (const LineError&) {
        continue;
      }
      const std::string& split = fields[1];
      const bool keep = split == "train" ? iter < keep_until : (iter < keep_until || (iter == keep_until && keep_eval_at_end));
      if (keep) kept += line + "\n";
    }
  }
  write_bytes_atomically(path, kept, "train");
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw std::runtime_error("[train] cannot open '" + path + "' for appending: " + std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::row(int64_t iter, const char* split, double loss, double lr, double ms, double tokens_per_sec) {
  std::fprintf(file_, "%lld,%s,%.9g,%.6g,%.4f,%.1f\n", static_cast<long long>(iter), split, loss, lr, ms, tokens_per_sec);
  std::fflush(file_);
}

}  // namespace nanogpt::io
