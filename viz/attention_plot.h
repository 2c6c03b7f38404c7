// Attention heatmaps: one panel per (layer, head), rows = queries, columns = keys, weights drawn
// with viridis on a fixed 0..1 scale; keys after the query (masked by causality) stay blank.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "viz/canvas.h"

namespace nanogpt::viz {

struct AttentionPanel {
  int64_t layer;
  int64_t head;
  torch::Tensor weights;  // (T, T) float, rows = queries, columns = keys
};

/// Checks that `panels` is non-empty, every weights tensor is (T, T) with
/// T = token_labels.size(), and no (layer, head) repeats; returns T. Throws "[viz] ..." otherwise.
int64_t check_attention_panels(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels);

/// How a token is written on an axis: printable ASCII as itself, "\n" -> "\\n", "\t" -> "\\t",
/// a space as an open box (font kVisibleSpace), anything else (CJK, other control characters)
/// as its position, since the bitmap font is ASCII only.
std::string attention_axis_label(const std::string& token, int64_t position);

/// The figure plot_attention() writes: `title` on top, the panels in a grid (layers as rows and
/// heads as columns; a single layer's heads wrap into rows of at most 4), token labels on the axes
/// where a cell is at least 8 pixels (position ticks otherwise), a 0..1 colour bar on the right.
/// Cells with key > query are the canvas background. `heatmap_rects`, when given, receives each
/// panel's heatmap area (in `panels` order): cell (query i, key j) of a T-token panel covers
/// x + j * w / T .. x + (j + 1) * w / T (and likewise in y) when w >= T.
struct PixelRect {
  int x = 0, y = 0, w = 0, h = 0;
};
Canvas draw_attention(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                      const std::string& title, std::vector<PixelRect>* heatmap_rects = nullptr);

/// Draws the panels (see draw_attention) and writes a PNG to `png_path` atomically.
/// Throws std::runtime_error "[viz] ..." on bad panels or an unwritable path.
void plot_attention(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                    const std::string& png_path, const std::string& title);

}  // namespace nanogpt::viz
