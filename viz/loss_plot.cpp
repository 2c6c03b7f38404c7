// Layout: title and a one-line summary on top; then panels stacked on one iteration axis (the
// loss with its legend in the top-right corner, where falling loss curves leave room; then the
// learning rate and tokens/s when metrics.csv has them), each with grid lines at the ticks and y
// tick labels on the left; x tick labels and the axis title under the last panel.
#include "viz/loss_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "viz/axis_ticks.h"

namespace nanogpt::viz {
namespace {

constexpr Rgb kAxis{70, 70, 70};
constexpr Rgb kGrid{228, 228, 228};
constexpr Rgb kTrainRaw{170, 199, 232};
constexpr Rgb kTrainSmooth{31, 119, 180};
constexpr Rgb kTrainEval{44, 160, 44};
constexpr Rgb kVal{224, 90, 20};
constexpr Rgb kLr{148, 103, 189};
constexpr Rgb kSpeedRaw{222, 200, 180};
constexpr Rgb kSpeed{140, 86, 75};

constexpr int kLeft = 84, kRight = 24, kTop = 68, kBottom = 60;  // figure margins around the panels
constexpr int kStackGap = 24;                                     // between stacked panels
const TextStyle kTickStyle{13, kText};
const TextStyle kAxisTitleStyle{14, kText};

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (iter, value), finite only
  Rgb color;
  double width;
  bool markers;
};

struct Panel {
  std::string y_title;
  std::vector<Series> series;
  bool legend = false;
  bool from_zero = false;  // the y axis starts at 0 (throughput, learning rate)
};

// (iter, field) of each point whose field is finite.
std::vector<std::pair<double, double>> finite_points(const std::vector<io::MetricPoint>& metric_points,
                                                     double io::MetricPoint::*field) {
  std::vector<std::pair<double, double>> points;
  points.reserve(metric_points.size());
  for (const io::MetricPoint& p : metric_points) {
    if (std::isfinite(p.*field)) points.emplace_back(static_cast<double>(p.iter), p.*field);
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

std::string format_loss(double loss) { return fmt::format("{:.4f}", loss); }

// "iter 5000 | val 1.4921 (best 1.4732 @ 4500) | train_eval 1.2331"
std::string summary_line(const io::Metrics& metrics) {
  int64_t last_iter = 0;
  for (const auto* series : {&metrics.train, &metrics.val, &metrics.train_eval}) {
    if (!series->empty()) last_iter = std::max(last_iter, series->back().iter);
  }
  std::string line = fmt::format("iter {}", last_iter);
  if (!metrics.val.empty()) {
    line += " | val " + format_loss(metrics.val.back().loss);
    const io::MetricPoint* best = nullptr;
    for (const io::MetricPoint& p : metrics.val) {
      if (std::isfinite(p.loss) && (best == nullptr || p.loss < best->loss)) best = &p;
    }
    if (best != nullptr) line += fmt::format(" (best {} @ {})", format_loss(best->loss), best->iter);
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

// Scales y values so tick labels stay short: learning rates as multiples of a power of ten
// ("3.0" with "x1e-4" in the axis title), throughputs from 10000 up in thousands.
double y_unit(double y_hi) {
  if (y_hi > 0 && y_hi < 0.01) return std::pow(10.0, std::floor(std::log10(y_hi)));
  if (y_hi >= 10000) return 1000;
  return 1;
}

std::string unit_suffix(double unit) {
  if (unit == 1) return "";
  if (unit == 1000) return " (thousands)";
  return fmt::format(" (\u00d71e{})", static_cast<int>(std::lround(std::log10(unit))));
}

// One panel in the plot area [px0, px1] x [py0, py1], on the shared iteration range.
void draw_panel(Figure& fig, const Panel& panel, double px0, double py0, double px1, double py1, double x_lo,
                double x_hi, bool x_labels) {
  double y_lo = std::numeric_limits<double>::infinity(), y_hi = -y_lo;
  for (const Series& s : panel.series) {
    for (const auto& point : s.points) {
      y_lo = std::min(y_lo, point.second);
      y_hi = std::max(y_hi, point.second);
    }
  }
  if (y_hi - y_lo < 1e-6 * std::max(1.0, std::abs(y_hi))) {
    const double pad = std::max(std::abs(y_hi) * 0.05, 1e-12);
    y_lo -= pad;
    y_hi += pad;
  }
  const double y_pad = (y_hi - y_lo) * 0.06;
  y_lo = panel.from_zero && y_lo >= 0 ? 0.0 : std::max(y_lo - y_pad, y_lo >= 0 ? 0.0 : y_lo - y_pad);
  y_hi += y_pad;
  auto to_px = [&](double x) { return px0 + (x - x_lo) / (x_hi - x_lo) * (px1 - px0); };
  auto to_py = [&](double y) { return py1 - (y - y_lo) / (y_hi - y_lo) * (py1 - py0); };

  const double unit = y_unit(y_hi);
  const Ticks y_ticks = nice_ticks(y_lo / unit, y_hi / unit, {py1 - py0 > 200 ? 7 : 4});
  for (size_t i = 0; i < y_ticks.values.size(); ++i) {
    const double y = std::round(to_py(y_ticks.values[i] * unit)) + 0.5;
    fig.line(px0, y, px1, y, kGrid);
    fig.line(px0 - 5, y, px0, y, kAxis);
    fig.text(px0 - 9, y, y_ticks.labels[i], kTickStyle, Anchor::End);
  }
  const Ticks x_ticks = nice_ticks(x_lo, x_hi, {8, /*integers=*/true, /*thousands=*/true});
  for (size_t i = 0; i < x_ticks.values.size(); ++i) {
    const double x = std::round(to_px(x_ticks.values[i])) + 0.5;
    fig.line(x, py0, x, py1, kGrid);
    fig.line(x, py1, x, py1 + 5, kAxis);
    if (x_labels) fig.text(x, py1 + 16, x_ticks.labels[i], kTickStyle, Anchor::Middle);
  }
  fig.stroke_rect(px0 - 1, py0 - 1, px1 - px0 + 2, py1 - py0 + 2, kAxis);
  fig.text(20, (py0 + py1) / 2, panel.y_title + unit_suffix(unit), kAxisTitleStyle, Anchor::Middle, -90);

  fig.clip(px0, py0, px1 - px0, py1 - py0);
  for (const Series& s : panel.series) {
    std::vector<std::pair<double, double>> pixels;
    pixels.reserve(s.points.size());
    for (const auto& [x, y] : s.points) pixels.emplace_back(to_px(x), to_py(y));
    fig.polyline(pixels, s.color, s.width);
    const double radius = s.markers ? marker_radius(pixels.size()) : 0;
    if (radius > 0) {
      for (const auto& [x, y] : pixels) {
        fig.fill_circle(x, y, radius + 1.2, kWhite);
        fig.fill_circle(x, y, radius, s.color);
      }
    }
  }
  fig.reset_clip();
  if (!panel.legend) return;

  const double swatch = 30, pad = 10, row_h = 22;
  double label_w = 0;
  for (const Series& s : panel.series) label_w = std::max(label_w, fig.measure(s.label, kTickStyle).width);
  const double box_w = pad + swatch + 8 + label_w + pad, box_h = 2 * pad + panel.series.size() * row_h - 6;
  const double bx = px1 - box_w - 10, by = py0 + 10;
  fig.fill_rect(bx, by, box_w, box_h, kWhite);
  fig.stroke_rect(bx, by, box_w, box_h, {190, 190, 190});
  for (size_t i = 0; i < panel.series.size(); ++i) {
    const Series& s = panel.series[i];
    const double cy = by + pad + 8 + i * row_h;
    fig.line(bx + pad, cy, bx + pad + swatch, cy, s.color, std::max(s.width, 2.0));
    if (s.markers) fig.fill_circle(bx + pad + swatch / 2, cy, 4.0, s.color);
    fig.text(bx + pad + swatch + 8, cy, s.label, kTickStyle);
  }
}

}  // namespace

Figure draw_loss_curves(const io::Metrics& metrics) {
  Panel loss{"loss", {}, /*legend=*/true};
  const auto train = finite_points(metrics.train, &io::MetricPoint::loss);
  if (!train.empty()) {
    const bool smooth = train.size() >= 20;
    loss.series.push_back({smooth ? "train (per step)" : "train", train, smooth ? kTrainRaw : kTrainSmooth, 1.0, false});
    if (smooth) loss.series.push_back({"train (smoothed)", smoothed(train), kTrainSmooth, 2.0, false});
  }
  const auto train_eval = finite_points(metrics.train_eval, &io::MetricPoint::loss);
  if (!train_eval.empty()) loss.series.push_back({"train_eval", train_eval, kTrainEval, 2.0, true});
  const auto val = finite_points(metrics.val, &io::MetricPoint::loss);
  if (!val.empty()) loss.series.push_back({"val", val, kVal, 2.0, true});
  if (loss.series.empty()) {
    throw std::runtime_error(fmt::format(
        "[viz] the metrics have no finite losses to plot yet ({} rows, all NaN/inf or none)",
        metrics.train.size() + metrics.val.size() + metrics.train_eval.size()));
  }
  std::vector<Panel> panels{loss};
  const auto lr = finite_points(metrics.train, &io::MetricPoint::lr);
  if (!lr.empty()) panels.push_back({"learning rate", {{"lr", lr, kLr, 2.0, false}}, false, true});
  const auto speed = finite_points(metrics.train, &io::MetricPoint::tokens_per_sec);
  if (!speed.empty()) {
    Panel throughput{"tokens/s", {{"tokens/s", speed, speed.size() >= 20 ? kSpeedRaw : kSpeed, 1.0, false}}, false, true};
    if (speed.size() >= 20) throughput.series.push_back({"smoothed", smoothed(speed), kSpeed, 2.0, false});
    panels.push_back(throughput);
  }

  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  for (const Panel& panel : panels) {
    for (const Series& s : panel.series) {
      for (const auto& point : s.points) {
        x_lo = std::min(x_lo, point.first);
        x_hi = std::max(x_hi, point.first);
      }
    }
  }
  if (x_hi - x_lo < 1) x_hi = x_lo + 1;
  const double x_pad = (x_hi - x_lo) * 0.02;
  x_lo -= x_pad;
  x_hi += x_pad;

  const int extra = static_cast<int>(panels.size()) - 1;
  Figure fig(kLossPlotWidth, kLossPanelHeight + extra * kExtraPanelHeight, kWhite);
  fig.text(kLossPlotWidth / 2.0, 22, "Training curves", {20, kText, /*bold=*/true}, Anchor::Middle);
  fig.text(kLossPlotWidth / 2.0, 48, summary_line(metrics), {13, kMutedText}, Anchor::Middle);

  const double px0 = kLeft, px1 = kLossPlotWidth - kRight;
  double py0 = kTop;
  for (size_t i = 0; i < panels.size(); ++i) {
    const double h = i == 0 ? kLossPanelHeight - kTop - kBottom : kExtraPanelHeight - kStackGap;
    const bool last = i + 1 == panels.size();
    draw_panel(fig, panels[i], px0, py0, px1, py0 + h, x_lo, x_hi, last);
    py0 += h + kStackGap;
  }
  fig.text((px0 + px1) / 2, fig.height() - 18, "iteration", kAxisTitleStyle, Anchor::Middle);
  return fig;
}

void plot_loss_curves(const std::string& metrics_csv, const std::string& out_path) {
  draw_loss_curves(io::read_metrics_csv(metrics_csv)).save(out_path);
}

}  // namespace nanogpt::viz
