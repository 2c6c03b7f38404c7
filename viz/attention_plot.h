// Attention heatmaps: one panel per (layer, head), rows = queries, columns = keys, weights drawn
// with viridis on a fixed 0..1 scale; keys after the query (masked by causality) stay blank. The
// axes are labelled with the tokens themselves, in any script (床前明月光), with visible marks for
// spaces and control characters.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "viz/figure.h"

namespace nanogpt::viz {

struct AttentionPanel {
  int64_t layer;
  int64_t head;
  torch::Tensor weights;  // (T, T) float, rows = queries, columns = keys
};

/// Checks that `panels` is non-empty, every weights tensor is (T, T) with
/// T = token_labels.size(), and no (layer, head) repeats; returns T. Throws "[viz] ..." otherwise.
int64_t check_attention_panels(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels);

/// How a token is written on an axis: itself, except that whitespace and control characters get
/// a visible mark: ' ' -> "␣", '\n' -> "⏎", '\t' -> "⇥", other controls -> their Unicode control
/// picture (U+2400 + code, "␡" for DEL); an empty token -> "∅".
std::string attention_axis_label(const std::string& token);

struct PixelRect {
  int x = 0, y = 0, w = 0, h = 0;
};

/// Where draw_attention put things. Cell (query i, key j) of a T-token panel covers
/// x + j * w / T .. x + (j + 1) * w / T (and likewise in y) when w >= T.
struct AttentionLayout {
  std::vector<PixelRect> heatmaps;  // one per panel, in `panels` order
  PixelRect colour_bar;             // viridis(1) at the top row, viridis(0) at the bottom row
};

/// The figure plot_attention() writes: `title` on top, the panels in a grid (layers as rows and
/// heads as columns; a single layer's heads wrap into rows of at most 4), token labels on the axes
/// where cells are large enough to read (position ticks otherwise), a 0..1 colour bar on the right.
/// Cells with key > query are the figure's background. `layout`, when given, receives the geometry.
Figure draw_attention(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                      const std::string& title, AttentionLayout* layout = nullptr);

/// Draws the panels (see draw_attention) and writes them to `out_path` atomically: SVG when it ends
/// in .svg, else PNG. Throws std::runtime_error "[viz] ..." on bad panels or an unwritable path.
void plot_attention(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                    const std::string& out_path, const std::string& title);

}  // namespace nanogpt::viz
