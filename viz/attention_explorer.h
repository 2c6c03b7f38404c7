// The attention explorer: one self-contained HTML page (no network) for looking at every head's
// attention interactively: pick a layer and head or see all heads side by side, hover or click a
// token to shade the text by its attention, step through a sampled continuation token by token.
// The page itself is viz/attention_explorer.html, built into the program.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace nanogpt::viz {

struct ExplorerData {
  std::string title;
  std::vector<std::string> tokens;  // decoded, one per position (T)
  int64_t prompt_tokens = 0;        // the first prompt_tokens were given; the rest were sampled
  std::vector<torch::Tensor> layers;  // per layer: (n_head, T, T) weights, rows = queries
};

/// The page's data as JSON: {title, tokens, prompt, layers: [layer][head] the lower triangle of the
/// (T, T) weights row by row, rounded to 4 decimals} (`nanogpt serve`'s POST /v1/attention hands it
/// out). Throws "[viz] ..." when the shapes disagree, as below.
nlohmann::json attention_explorer_json(const ExplorerData& data);

/// The page with `data` embedded as JSON (weights rounded to 4 decimals). Throws "[viz] ..." when
/// the shapes disagree (no layers, a layer not (n_head, T, T), heads differing between layers,
/// prompt_tokens outside 1..T).
std::string attention_explorer_html(const ExplorerData& data);

/// Writes attention_explorer_html(data) to `path` atomically. Throws "[viz] ..." as above or on an
/// unwritable path.
void write_attention_explorer(const ExplorerData& data, const std::string& path);

}  // namespace nanogpt::viz
