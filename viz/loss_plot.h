// The loss plot drawn at every evaluation: per-step training loss (raw and smoothed) and the
// evaluation losses (train_eval, val) against the iteration.
#pragma once

#include <string>

#include "viz/canvas.h"
#include "io/metrics_csv.h"

namespace nanogpt::viz {

constexpr int kLossPlotWidth = 900;
constexpr int kLossPlotHeight = 560;

/// Draws the curves of `metrics` with axes, ticks, a legend and a title on a
/// kLossPlotWidth x kLossPlotHeight canvas. Throws "[viz] ... no finite losses ..." when there is
/// nothing to draw.
Canvas draw_loss_curves(const io::Metrics& metrics);

/// Reads `metrics_csv` (io/metrics_csv.h) and writes the plot to `png_path` atomically.
/// Throws std::runtime_error "[viz] ..." on any failure; cheap enough to call at every evaluation.
void plot_loss_curves(const std::string& metrics_csv, const std::string& png_path);

}  // namespace nanogpt::viz
