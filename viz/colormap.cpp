// Viridis from nine of its own samples (t = 0, 1/8, ..., 1), linearly interpolated: close to
// matplotlib's 256-entry table to the eye, and small enough to read.
#include "viz/colormap.h"

#include <algorithm>
#include <cmath>

namespace nanogpt::viz {
namespace {

constexpr Rgb kViridisAnchors[] = {
    {68, 1, 84},   {72, 40, 120},  {62, 73, 137},  {49, 104, 142}, {38, 130, 142},
    {31, 158, 137}, {53, 183, 121}, {110, 206, 88}, {253, 231, 37},
};
constexpr int kSegments = static_cast<int>(sizeof(kViridisAnchors) / sizeof(kViridisAnchors[0])) - 1;

}  // namespace

Rgb viridis(double t) {
  if (std::isnan(t)) t = 0;
  const double pos = std::clamp(t, 0.0, 1.0) * kSegments;
  const int i = std::min(static_cast<int>(pos), kSegments - 1);
  return mix(kViridisAnchors[i], kViridisAnchors[i + 1], pos - i);
}

}  // namespace nanogpt::viz
