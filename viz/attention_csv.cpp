// Attention CSV writer: one long-format row per (panel, query, key <= query).
#include "viz/attention_csv.h"

#include <fmt/format.h>

#include <iterator>

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
  auto out = std::back_inserter(csv);
  for (const AttentionPanel& panel : panels) {
    const torch::Tensor w = panel.weights.detach().to(torch::kCPU, torch::kFloat).contiguous();
    const auto a = w.accessor<float, 2>();
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        fmt::format_to(out, "{},{},{},{},{},{},{:.8g}\n", panel.layer, panel.head, i, j, tokens[i], tokens[j],
                       static_cast<double>(a[i][j]));
      }
    }
  }
  io::write_bytes_atomically(csv_path, csv, "viz");
}

}  // namespace nanogpt::viz
