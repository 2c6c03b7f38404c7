// metrics.csv writer (see metrics_log.h).
#include "train/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "data/atomic_file.h"

namespace nanogpt::train {

static constexpr const char* kHeader = "iter,split,loss,lr,ms,tokens_per_sec\n";

MetricsLog::MetricsLog(const std::string& path, int64_t keep_until, bool keep_eval_at_end) : path_(path) {
  std::string kept = kHeader;
  if (keep_until >= 0) {
    std::ifstream in(path);
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
      if (first) {
        first = false;
        continue;  // header
      }
      std::istringstream fields(line);
      std::string iter_text, split;
      if (!std::getline(fields, iter_text, ',') || !std::getline(fields, split, ',')) continue;
      int64_t iter = 0;
      try {
        iter = std::stoll(iter_text);
      } catch (const std::exception&) {
        continue;
      }
      const bool keep = split == "train" ? iter < keep_until : (iter < keep_until || (iter == keep_until && keep_eval_at_end));
      if (keep) kept += line + "\n";
    }
  }
  data::write_bytes_atomically(path, kept, "train");
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

}  // namespace nanogpt::train
