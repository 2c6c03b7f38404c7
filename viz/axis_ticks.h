// Round-number axis ticks ("nice numbers") and their labels.
#pragma once

#include <string>
#include <vector>

namespace nanogpt::viz {

struct Ticks {
  double step = 1;             // 1, 2, 2.5 or 5 times a power of ten
  std::vector<double> values;  // multiples of step inside [lo, hi], ascending
  std::vector<std::string> labels;  // one per value, with the decimals the step needs
};

struct TickOptions {
  int target = 6;          // wanted number of ticks; the step giving the closest count wins
  bool integers = false;   // only whole-number steps (iterations, positions)
  bool thousands = false;  // label ranges reaching 10000 as 2.5k, 10k, ...
};

/// Ticks covering [lo, hi] (swapped if reversed; a zero-width range is widened).
Ticks nice_ticks(double lo, double hi, const TickOptions& options = {});

}  // namespace nanogpt::viz
