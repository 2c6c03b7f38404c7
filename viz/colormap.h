// Colour maps for heatmaps.
#pragma once

#include "viz/canvas.h"

namespace nanogpt::viz {

/// Viridis (matplotlib's perceptually uniform map, dark purple -> green -> yellow) at t in [0, 1];
/// t outside is clamped, NaN gives the t = 0 colour.
Rgb viridis(double t);

}  // namespace nanogpt::viz
