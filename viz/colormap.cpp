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

Rgb mix(Rgb a, Rgb b, double t) {
  t = std::clamp(t, 0.0, 1.0);
  auto channel = [t](uint8_t x, uint8_t y) { return static_cast<uint8_t>(std::lround(x + (y - x) * t)); };
  return {channel(a.r, b.r), channel(a.g, b.g), channel(a.b, b.b)};
}

Rgb viridis(double t) {
  if (std::isnan(t)) t = 0;
  const double pos = std::clamp(t, 0.0, 1.0) * kSegments;
  const int i = std::min(static_cast<int>(pos), kSegments - 1);
  return mix(kViridisAnchors[i], kViridisAnchors[i + 1], pos - i);
}

}  // namespace nanogpt::viz
