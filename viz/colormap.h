// Colours and colour maps for plots.
#pragma once

#include <cstdint>

namespace nanogpt::viz {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(Rgb a, Rgb b) { return a.r == b.r && a.g == b.g && a.b == b.b; }
  friend bool operator!=(Rgb a, Rgb b) { return !(a == b); }
};

constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kBlack{0, 0, 0};

/// Linear blend: t = 0 gives a, t = 1 gives b.
Rgb mix(Rgb a, Rgb b, double t);

/// Viridis (matplotlib's perceptually uniform map, dark purple -> green -> yellow) at t in [0, 1];
/// t outside is clamped, NaN gives the t = 0 colour.
Rgb viridis(double t);

}  // namespace nanogpt::viz
