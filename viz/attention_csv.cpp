// Attention CSV writer: one long-format row per (panel, query, key <= query).
#include "viz/attention_csv.h"

#include <cstdio>

#include "io/atomic_file.h"

namespace nanogpt::viz {
namespace {

// A token as a quoted CSV field, one line per row even for a newline token.
std::string csv_token(const std::string& token) {
  std::string out = "\"";
  for (char c : token) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\\': out += "\\\\"; break;
      case '"': out += "\"\""; break;
      default: out += c;
    }
  }
  return out + "\"";
}

}  // namespace

void write_attention_csv(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                         const std::string& csv_path) {
  const int64_t T = check_attention_panels(panels, token_labels);
  std::vector<std::string> tokens;
  for (const std::string& label : token_labels) tokens.push_back(csv_token(label));

  std::string csv = std::string(kAttentionCsvHeader) + "\n";
  char number[64];
  for (const AttentionPanel& panel : panels) {
    const torch::Tensor w = panel.weights.detach().to(torch::kCPU, torch::kFloat).contiguous();
    const auto a = w.accessor<float, 2>();
    const std::string prefix = std::to_string(panel.layer) + "," + std::to_string(panel.head) + ",";
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        std::snprintf(number, sizeof(number), "%.8g", static_cast<double>(a[i][j]));
        csv += prefix;
        csv += std::to_string(i) + "," + std::to_string(j) + "," + tokens[i] + "," + tokens[j] + ",";
        csv += number;
        csv += '\n';
      }
    }
  }
  io::write_bytes_atomically(csv_path, csv, "viz");
}

}  // namespace nanogpt::viz
