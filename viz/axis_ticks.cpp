// Tick placement for the loss plot axes and the attention colour bar and position axes.
#include "viz/axis_ticks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace nanogpt::viz {
namespace {

std::string format_fixed(double value, int decimals) {
  if (std::abs(value) < 1e-12) value = 0;  // no "-0.00"
  return fmt::format("{:.{}f}", value, decimals);
}

// Decimals needed to tell multiples of `step` apart.
int decimals_for(double step) {
  const double exponent = std::floor(std::log10(step) + 1e-9);
  const double mantissa = step / std::pow(10.0, exponent);
  int decimals = std::max(0, static_cast<int>(-exponent));
  if (std::abs(mantissa - 2.5) < 1e-6 && exponent < 1) ++decimals;  // 0.25, 2.5
  return decimals;
}

}  // namespace

Ticks nice_ticks(double lo, double hi, const TickOptions& options) {
  if (lo > hi) std::swap(lo, hi);
  if (!(hi - lo > 1e-12 * std::max(1.0, std::abs(hi)))) {
    const double pad = std::max(std::abs(lo) * 0.05, 0.5);
    lo -= pad;
    hi += pad;
  }
  const int target = std::max(options.target, 2);
  const int exponent = static_cast<int>(std::floor(std::log10((hi - lo) / (target - 1))));
  auto count_for = [&](double step) { return std::floor(hi / step + 1e-9) - std::ceil(lo / step - 1e-9) + 1; };
  Ticks ticks;
  double best_miss = std::numeric_limits<double>::infinity();
  for (int e = exponent - 1; e <= exponent + 1; ++e) {
    for (double m : {1.0, 2.0, 2.5, 5.0}) {
      const double step = m * std::pow(10.0, e);
      if (options.integers && (step < 1 || step != std::floor(step))) continue;
      const double miss = std::abs(count_for(step) - target);
      if (miss <= best_miss) {  // ties go to the larger step: fewer, rounder labels
        best_miss = miss;
        ticks.step = step;
      }
    }
  }
  const double eps = ticks.step * 1e-9;
  for (double k = std::ceil((lo - eps) / ticks.step); k * ticks.step <= hi + eps; ++k) {
    ticks.values.push_back(k * ticks.step);
  }
  const bool in_thousands = options.thousands && std::max(std::abs(lo), std::abs(hi)) >= 10000;
  const double unit = in_thousands ? 1000 : 1;
  const int decimals = decimals_for(ticks.step / unit);
  for (double v : ticks.values) {
    std::string label = format_fixed(v / unit, decimals);
    if (in_thousands) {
      // 2.5k, 10k: trim the zeros that only other labels needed.
      if (label.find('.') != std::string::npos) {
        label.erase(label.find_last_not_of('0') + 1);
        if (label.back() == '.') label.pop_back();
      }
      if (label != "0") label += "k";
    }
    ticks.labels.push_back(label);
  }
  return ticks;
}

}  // namespace nanogpt::viz
