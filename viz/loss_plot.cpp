// Layout: title and a one-line summary on top, the plot area with grid lines at the ticks, y tick
// labels on the left, x tick labels below, a legend in the top-right corner (loss curves fall from
// the top-left, so that corner is usually empty).
#include "viz/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "viz/axis_ticks.h"
#include "viz/font.h"

namespace nanogpt::viz {
namespace {

constexpr Rgb kText{30, 30, 30};
constexpr Rgb kMutedText{90, 90, 90};
constexpr Rgb kAxis{70, 70, 70};
constexpr Rgb kGrid{228, 228, 228};
constexpr Rgb kTrainRaw{170, 199, 232};
constexpr Rgb kTrainSmooth{31, 119, 180};
constexpr Rgb kTrainEval{44, 160, 44};
constexpr Rgb kVal{224, 90, 20};

constexpr int kLeft = 84, kRight = 24, kTop = 68, kBottom = 60;  // plot-area margins
constexpr int kTickScale = 2;  // tick labels, legend and axis titles: 10x14-pixel glyphs
constexpr int kTitleScale = 3;

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (iter, loss), finite only
  Rgb color;
  double width;
  bool markers;
};

std::vector<std::pair<double, double>> finite_points(const std::vector<io::MetricPoint>& metric_points) {
  std::vector<std::pair<double, double>> points;
  points.reserve(metric_points.size());
  for (const io::MetricPoint& p : metric_points) {
    if (std::isfinite(p.loss)) points.emplace_back(static_cast<double>(p.iter), p.loss);
  }
  return points;
}

// A local linear fit over a window of about 1/40 of the run (clipped at the ends), evaluated at
// each point: a moving average in the middle, but without the lag of a one-sided average or the
// noise of a shrinking window at the ends. Points are taken as evenly spaced (one per log_interval).
std::vector<std::pair<double, double>> smoothed(const std::vector<std::pair<double, double>>& points) {
  const auto n = static_cast<int64_t>(points.size());
  const int64_t half = std::max<int64_t>(1, n / 80);
  std::vector<double> sum_y(points.size() + 1, 0.0), sum_jy(points.size() + 1, 0.0);  // prefix sums
  for (int64_t j = 0; j < n; ++j) {
    sum_y[j + 1] = sum_y[j] + points[j].second;
    sum_jy[j + 1] = sum_jy[j] + static_cast<double>(j) * points[j].second;
  }
  auto sum_u = [](double lo, double hi) { return (lo + hi) * (hi - lo + 1) / 2; };  // sum of lo..hi
  auto sum_u2 = [](double lo, double hi) {                                         // sum of squares
    auto s = [](double m) { return m * (m + 1) * (2 * m + 1) / 6; };
    return lo >= 0 ? s(hi) - s(lo - 1) : (hi <= 0 ? s(-lo) - s(-hi - 1) : s(-lo) + s(hi));
  };
  std::vector<std::pair<double, double>> out;
  out.reserve(points.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = std::max<int64_t>(0, i - half), b = std::min(n - 1, i + half);
    const double count = static_cast<double>(b - a + 1);
    const double lo = static_cast<double>(a - i), hi = static_cast<double>(b - i);  // u = j - i
    const double su = sum_u(lo, hi), suu = sum_u2(lo, hi);
    const double sy = sum_y[b + 1] - sum_y[a];
    const double suy = (sum_jy[b + 1] - sum_jy[a]) - static_cast<double>(i) * sy;
    const double denominator = count * suu - su * su;
    const double slope = denominator > 0 ? (count * suy - su * sy) / denominator : 0.0;
    out.emplace_back(points[i].first, (sy - slope * su) / count);  // the fitted line at u = 0
  }
  return out;
}

std::string format_loss(double loss) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", loss);
  return buf;
}

// "iter 5000 | val 1.4921 (best 1.4732 @ 4500) | train_eval 1.2331"
std::string summary_line(const io::Metrics& metrics) {
  int64_t last_iter = 0;
  for (const auto* series : {&metrics.train, &metrics.val, &metrics.train_eval}) {
    if (!series->empty()) last_iter = std::max(last_iter, series->back().iter);
  }
  std::string line = "iter " + std::to_string(last_iter);
  if (!metrics.val.empty()) {
    line += " | val " + format_loss(metrics.val.back().loss);
    const io::MetricPoint* best = nullptr;
    for (const io::MetricPoint& p : metrics.val) {
      if (std::isfinite(p.loss) && (best == nullptr || p.loss < best->loss)) best = &p;
    }
    if (best != nullptr) line += " (best " + format_loss(best->loss) + " @ " + std::to_string(best->iter) + ")";
  }
  if (!metrics.train_eval.empty()) line += " | train_eval " + format_loss(metrics.train_eval.back().loss);
  if (metrics.val.empty() && metrics.train_eval.empty() && !metrics.train.empty()) {
    line += " | train " + format_loss(metrics.train.back().loss);
  }
  return line;
}

double marker_radius(size_t count) {
  if (count <= 40) return 4.0;
  if (count <= 150) return 2.5;
  return 0;  // dense evaluations: the line alone reads better
}

}  // namespace

Canvas draw_loss_curves(const io::Metrics& metrics) {
  std::vector<Series> series;
  const auto train = finite_points(metrics.train);
  if (!train.empty()) {
    const bool smooth = train.size() >= 20;
    series.push_back({smooth ? "train (per step)" : "train", train, smooth ? kTrainRaw : kTrainSmooth, 1.0, false});
    if (smooth) series.push_back({"train (smoothed)", smoothed(train), kTrainSmooth, 2.0, false});
  }
  const auto train_eval = finite_points(metrics.train_eval);
  if (!train_eval.empty()) series.push_back({"train_eval", train_eval, kTrainEval, 2.0, true});
  const auto val = finite_points(metrics.val);
  if (!val.empty()) series.push_back({"val", val, kVal, 2.0, true});
  if (series.empty()) {
    throw std::runtime_error("[viz] the metrics have no finite losses to plot yet (" +
                             std::to_string(metrics.train.size() + metrics.val.size() + metrics.train_eval.size()) +
                             " rows, all NaN/inf or none)");
  }

  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  for (const Series& s : series) {
    for (const auto& [x, y] : s.points) {
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  if (x_hi - x_lo < 1) x_hi = x_lo + 1;
  if (y_hi - y_lo < 1e-6) {
    y_lo -= 0.05;
    y_hi += 0.05;
  }
  const double x_pad = (x_hi - x_lo) * 0.02, y_pad = (y_hi - y_lo) * 0.06;
  x_lo -= x_pad;
  x_hi += x_pad;
  y_lo = std::max(y_lo - y_pad, y_lo >= 0 ? 0.0 : y_lo - y_pad);  // a loss axis need not go below 0
  y_hi += y_pad;

  Canvas canvas(kLossPlotWidth, kLossPlotHeight, kWhite);
  const int px0 = kLeft, py0 = kTop, px1 = kLossPlotWidth - kRight, py1 = kLossPlotHeight - kBottom;
  auto to_px = [&](double x) { return px0 + (x - x_lo) / (x_hi - x_lo) * (px1 - px0); };
  auto to_py = [&](double y) { return py1 - (y - y_lo) / (y_hi - y_lo) * (py1 - py0); };
  const int glyph_h = kCapHeight * kTickScale;

  // Title and summary.
  const std::string title = "Loss curves";
  canvas.draw_text((kLossPlotWidth - text_width(title, kTitleScale)) / 2, 10, title, kText, kTitleScale);
  const std::string summary = summary_line(metrics);
  const int summary_scale = text_width(summary, kTickScale) <= kLossPlotWidth - 20 ? kTickScale : 1;
  canvas.draw_text((kLossPlotWidth - text_width(summary, summary_scale)) / 2, 10 + kCapHeight * kTitleScale + 8,
                   summary, kMutedText, summary_scale);

  // Grid, ticks and tick labels.
  const Ticks y_ticks = nice_ticks(y_lo, y_hi, {7});
  for (size_t i = 0; i < y_ticks.values.size(); ++i) {
    const int y = static_cast<int>(std::lround(to_py(y_ticks.values[i])));
    canvas.fill_rect(px0, y, px1 - px0, 1, kGrid);
    canvas.fill_rect(px0 - 5, y, 5, 1, kAxis);
    const std::string& label = y_ticks.labels[i];
    canvas.draw_text(px0 - 9 - text_width(label, kTickScale), y - glyph_h / 2, label, kText, kTickScale);
  }
  const Ticks x_ticks = nice_ticks(x_lo, x_hi, {8, /*integers=*/true, /*thousands=*/true});
  for (size_t i = 0; i < x_ticks.values.size(); ++i) {
    const int x = static_cast<int>(std::lround(to_px(x_ticks.values[i])));
    canvas.fill_rect(x, py0, 1, py1 - py0, kGrid);
    canvas.fill_rect(x, py1, 1, 5, kAxis);
    const std::string& label = x_ticks.labels[i];
    canvas.draw_text(x - text_width(label, kTickScale) / 2, py1 + 10, label, kText, kTickScale);
  }
  canvas.stroke_rect(px0 - 1, py0 - 1, px1 - px0 + 2, py1 - py0 + 2, kAxis);

  // Axis titles.
  const std::string x_title = "iteration";
  canvas.draw_text((px0 + px1 - text_width(x_title, kTickScale)) / 2, py1 + 10 + glyph_h + 12, x_title, kText,
                   kTickScale);
  const std::string y_title = "loss";
  canvas.draw_text_up(8, (py0 + py1 + text_width(y_title, kTickScale)) / 2, y_title, kText, kTickScale);

  // Curves, clipped to the plot area.
  canvas.set_clip(px0, py0, px1 - px0, py1 - py0);
  for (const Series& s : series) {
    std::vector<std::pair<double, double>> pixels;
    pixels.reserve(s.points.size());
    for (const auto& [x, y] : s.points) pixels.emplace_back(to_px(x), to_py(y));
    canvas.draw_polyline(pixels, s.color, s.width);
    const double radius = s.markers ? marker_radius(pixels.size()) : 0;
    if (radius > 0) {
      for (const auto& [x, y] : pixels) {
        canvas.fill_circle(x, y, radius + 1.2, kWhite);
        canvas.fill_circle(x, y, radius, s.color);
      }
    }
  }
  canvas.reset_clip();

  // Legend.
  const int swatch = 30, pad = 10, row_h = glyph_h + 10;
  int label_w = 0;
  for (const Series& s : series) label_w = std::max(label_w, text_width(s.label, kTickScale));
  const int box_w = pad + swatch + 8 + label_w + pad, box_h = pad + static_cast<int>(series.size()) * row_h - 10 + pad;
  const int bx = px1 - box_w - 10, by = py0 + 10;
  canvas.fill_rect(bx, by, box_w, box_h, kWhite);
  canvas.stroke_rect(bx, by, box_w, box_h, {190, 190, 190});
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const int ty = by + pad + static_cast<int>(i) * row_h;
    const double cy = ty + glyph_h / 2.0;
    canvas.draw_line(bx + pad, cy, bx + pad + swatch, cy, s.color, std::max(s.width, 2.0));
    if (s.markers) canvas.fill_circle(bx + pad + swatch / 2.0, cy, 4.0, s.color);
    canvas.draw_text(bx + pad + swatch + 8, ty, s.label, kText, kTickScale);
  }
  return canvas;
}

void plot_loss_curves(const std::string& metrics_csv, const std::string& png_path) {
  draw_loss_curves(io::read_metrics_csv(metrics_csv)).save_png(png_path);
}

}  // namespace nanogpt::viz
