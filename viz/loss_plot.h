// The training-curves figure drawn at every evaluation and by `nanogpt plot`: per-step training
// loss (raw and smoothed) and the evaluation losses (train_eval, val) against the iteration, and
// under them, on the same iteration axis, the learning-rate schedule and the throughput (tokens/s).
#pragma once

#include <string>

#include "io/metrics_csv.h"
#include "viz/figure.h"

namespace nanogpt::viz {

constexpr int kLossPlotWidth = 900;
constexpr int kLossPanelHeight = 560;  // the figure's height with the loss panel alone
constexpr int kExtraPanelHeight = 170;  // added per panel under it (learning rate, tokens/s)

/// Draws the curves of `metrics` with axes, ticks, a legend and a title: the loss panel, then a
/// learning-rate panel and a tokens/s panel when the train rows carry finite values for them.
/// kLossPlotWidth wide, kLossPanelHeight + kExtraPanelHeight per extra panel high. Throws
/// "[viz] ... no finite losses ..." when there is nothing to draw.
Figure draw_loss_curves(const io::Metrics& metrics);

/// Reads `metrics_csv` (io/metrics_csv.h) and writes the figure to `out_path` atomically: SVG when
/// it ends in .svg, else PNG. Throws std::runtime_error "[viz] ..." on any failure; cheap enough to
/// call at every evaluation.
void plot_loss_curves(const std::string& metrics_csv, const std::string& out_path);

}  // namespace nanogpt::viz
