// Attention figure layout, per panel: a title row ("layer L head H"), then query labels to the
// left of the heatmap and key labels below it. Panels sit in a grid; the colour bar sits to the
// right of the first row.
#include "viz/attention_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "viz/axis_ticks.h"
#include "viz/colormap.h"

namespace nanogpt::viz {
namespace {

constexpr Rgb kFrame{190, 190, 190};
constexpr int kMargin = 16;       // around the figure
constexpr int kHeatmapGap = 28;     // between panels
constexpr int kBarWidth = 20;     // colour bar
constexpr int kMinLabelCell = 9;  // smallest cell (pixels) that gets a token label

struct Placement {
  int row = 0, col = 0;
};

// Layers as rows and heads as columns; a single layer's heads wrap into rows of at most 4.
std::vector<Placement> arrange(const std::vector<AttentionPanel>& panels, int& rows, int& cols) {
  std::set<int64_t> layer_set, head_set;
  for (const AttentionPanel& p : panels) {
    layer_set.insert(p.layer);
    head_set.insert(p.head);
  }
  std::vector<Placement> placements(panels.size());
  if (layer_set.size() == 1) {
    const int n = static_cast<int>(panels.size());
    rows = (n + 3) / 4;
    cols = (n + rows - 1) / rows;
    std::vector<size_t> order(panels.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return panels[a].head < panels[b].head; });
    for (int k = 0; k < n; ++k) placements[order[k]] = {k / cols, k % cols};
    return placements;
  }
  std::map<int64_t, int> layer_row, head_col;
  for (int64_t layer : layer_set) layer_row.emplace(layer, static_cast<int>(layer_row.size()));
  for (int64_t head : head_set) head_col.emplace(head, static_cast<int>(head_col.size()));
  rows = static_cast<int>(layer_row.size());
  cols = static_cast<int>(head_col.size());
  for (size_t i = 0; i < panels.size(); ++i) placements[i] = {layer_row[panels[i].layer], head_col[panels[i].head]};
  return placements;
}

// The heatmap as a side x side raster: exact cells when each is at least a pixel, else each pixel
// shows the largest weight of the block it covers (so a sharp attention spike never disappears
// when shrunk). Masked cells are transparent.
std::vector<std::optional<Rgb>> heatmap_pixels(const torch::Tensor& weights, int side, int64_t T) {
  const torch::Tensor w = weights.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const auto a = w.accessor<float, 2>();
  std::vector<std::optional<Rgb>> pixels(static_cast<size_t>(side) * side);
  for (int py = 0; py < side; ++py) {
    const int64_t i0 = py * T / side, i1 = std::max<int64_t>(i0 + 1, (py + 1) * T / side);
    for (int px = 0; px < side; ++px) {
      const int64_t j0 = px * T / side, j1 = std::max<int64_t>(j0 + 1, (px + 1) * T / side);
      if (j0 > i1 - 1) continue;  // the whole block lies above the diagonal: masked
      float peak = 0;
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < std::min(j1, i + 1); ++j) peak = std::max(peak, a[i][j]);
      }
      pixels[static_cast<size_t>(py) * side + px] = viridis(peak);
    }
  }
  return pixels;
}

// `text` cut at a character boundary, with an ellipsis, so that it fits in `width` pixels.
std::string fit_text(std::string text, const TextStyle& style, double width) {
  if (measure_text(text, style).width <= width) return text;
  while (!text.empty() && measure_text(text + "\u2026", style).width > width) {
    text.pop_back();
    while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
    if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();  // a torn lead byte
  }
  return text + "\u2026";
}

}  // namespace

int64_t check_attention_panels(const std::vector<AttentionPanel>& panels,
                               const std::vector<std::string>& token_labels) {
  if (panels.empty()) throw std::runtime_error("[viz] no attention panels to draw (select at least one layer)");
  const auto T = static_cast<int64_t>(token_labels.size());
  if (T == 0) throw std::runtime_error("[viz] no token labels: the prompt must have at least one token");
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const AttentionPanel& p : panels) {
    const std::string name = fmt::format("layer {} head {}", p.layer, p.head);
    if (!p.weights.defined()) throw std::runtime_error("[viz] attention panel " + name + " has no weights");
    if (p.weights.dim() != 2 || p.weights.size(0) != T || p.weights.size(1) != T) {
      throw std::runtime_error(fmt::format(
          "[viz] attention panel {} has shape {}; expected [{}, {}] (one row and column per token label)", name,
          c10::str(p.weights.sizes()), T, T));
    }
    if (!seen.insert({p.layer, p.head}).second) {
      throw std::runtime_error("[viz] attention panel " + name + " appears twice");
    }
  }
  return T;
}

std::string attention_axis_label(const std::string& token) {
  if (token.empty()) return "\u2205";
  std::string out;
  for (char c : token) {
    const auto u = static_cast<unsigned char>(c);
    if (c == ' ') {
      out += "\u2423";
    } else if (c == '\n') {
      out += "\u23CE";
    } else if (c == '\t') {
      out += "\u21E5";
    } else if (u < 0x20) {
      const char picture[] = {'\xE2', '\x90', static_cast<char>(0x80 + u), '\0'};  // U+2400 + u in UTF-8
      out += picture;
    } else if (u == 0x7F) {
      out += "\u2421";
    } else {
      out += c;
    }
  }
  return out;
}

Figure draw_attention(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                      const std::string& title, AttentionLayout* layout) {
  const int64_t T = check_attention_panels(panels, token_labels);
  int rows = 0, cols = 0;
  const std::vector<Placement> placements = arrange(panels, rows, cols);

  // Heatmap side: whole pixels per cell, smaller targets for wider grids; pooled when T is larger.
  const int target = cols <= 1 ? 520 : cols <= 2 ? 440 : cols <= 4 ? 360 : 260;
  const int cell = T <= target ? std::min<int>(target / static_cast<int>(T), 40) : 0;
  const int side = cell > 0 ? cell * static_cast<int>(T) : target;

  // Axis labels: the tokens where cells are large enough to read, else position ticks.
  std::vector<std::string> labels;
  for (const std::string& token : token_labels) labels.push_back(attention_axis_label(token));
  const bool token_labels_fit = cell >= kMinLabelCell;
  const TextStyle label_style{std::clamp(cell * 0.7, 8.0, 18.0), kText};
  const TextStyle tick_style{side >= 200 ? 13.0 : 10.0, kText};
  std::vector<int64_t> tick_positions;
  std::vector<double> label_w;  // per token
  double max_label_w = 0, label_h = 0;
  if (token_labels_fit) {
    for (const std::string& l : labels) {
      const TextExtent e = measure_text(l, label_style);
      label_w.push_back(e.width);
      max_label_w = std::max(max_label_w, e.width);
      label_h = std::max(label_h, e.height);
    }
  } else {
    for (double v : nice_ticks(0, static_cast<double>(T - 1), {5, /*integers=*/true}).values) {
      if (v >= 0 && v <= T - 1 && v == std::floor(v)) tick_positions.push_back(static_cast<int64_t>(v));
    }
    const TextExtent e = measure_text(std::to_string(T - 1), tick_style);
    max_label_w = e.width;
    label_h = e.height;
  }
  // Key labels stand upright where they fit in their column, else turn to read bottom to top.
  auto upright = [&](size_t i) { return label_w[i] <= cell + 1; };
  const int left_w = static_cast<int>(std::ceil(max_label_w)) + 10;
  int below_h = static_cast<int>(std::ceil(label_h)) + 10;
  for (size_t i = 0; i < label_w.size(); ++i) {
    if (!upright(i)) below_h = std::max(below_h, static_cast<int>(std::ceil(label_w[i])) + 10);
  }

  const TextStyle panel_title_style{side >= 100 ? 14.0 : 11.0, kText};
  const int panel_title_h = static_cast<int>(std::ceil(measure_text("layer 0", panel_title_style).height)) + 6;
  const int title_w = static_cast<int>(std::ceil(measure_text("layer 00 head 00", panel_title_style).width));
  const int block_w = left_w + std::max(side, title_w) + kHeatmapGap;
  const int block_h = panel_title_h + side + below_h + kHeatmapGap;

  // Figure header and colour bar geometry.
  const std::string subtitle = "rows: queries, columns: keys, blank: future keys (masked)";
  const TextStyle title_style{18, kText, /*bold=*/true}, subtitle_style{13, kMutedText}, bar_style{13, kText};
  const int bar_h = std::clamp(side, 100, 360);
  const int bar_area_w = kBarWidth + 10 + static_cast<int>(measure_text("0.25", bar_style).width) + kMargin;
  int width = kMargin + cols * block_w + bar_area_w;
  width = std::max(width, static_cast<int>(std::min(measure_text(title, title_style).width, 2400.0)) + 2 * kMargin);
  width = std::max(width, static_cast<int>(measure_text(subtitle, subtitle_style).width) + 2 * kMargin);
  const std::string shown_title = fit_text(title, title_style, width - 2 * kMargin);
  const int title_h = static_cast<int>(std::ceil(measure_text(shown_title, title_style).height));
  const int subtitle_h = static_cast<int>(std::ceil(measure_text(subtitle, subtitle_style).height));
  const int header_h = kMargin + title_h + 4 + subtitle_h + 14;
  const int bar_bottom = header_h + panel_title_h + bar_h + 12 + 20;  // caption below
  const int height = std::max(header_h + rows * block_h, bar_bottom + kMargin) + kMargin / 2;

  Figure fig(width, height, kWhite);
  fig.text(kMargin, kMargin + title_h / 2.0, shown_title, title_style);
  fig.text(kMargin, kMargin + title_h + 4 + subtitle_h / 2.0, subtitle, subtitle_style);

  if (layout != nullptr) layout->heatmaps.assign(panels.size(), PixelRect{});
  for (size_t k = 0; k < panels.size(); ++k) {
    const AttentionPanel& panel = panels[k];
    const int bx = kMargin + placements[k].col * block_w, by = header_h + placements[k].row * block_h;
    const PixelRect r{bx + left_w, by + panel_title_h, side, side};
    if (layout != nullptr) layout->heatmaps[k] = r;

    const std::string panel_title = fmt::format("layer {} head {}", panel.layer, panel.head);
    fig.text(r.x + side / 2.0, by + panel_title_h / 2.0 - 2, panel_title, panel_title_style, Anchor::Middle);
    fig.raster(r.x, r.y, side, side, heatmap_pixels(panel.weights, side, T));
    fig.stroke_rect(r.x - 1, r.y - 1, side + 2, side + 2, kFrame);

    if (token_labels_fit) {
      for (int64_t i = 0; i < T; ++i) {
        const std::string& l = labels[i];
        const double centre = (i + 0.5) * cell;
        fig.text(r.x - 5, r.y + centre, l, label_style, Anchor::End);
        if (upright(i)) {
          fig.text(r.x + centre, r.y + side + 5 + label_h / 2, l, label_style, Anchor::Middle);
        } else {
          fig.text(r.x + centre, r.y + side + 5, l, label_style, Anchor::End, -90);
        }
      }
    } else {
      for (int64_t p : tick_positions) {
        const std::string l = std::to_string(p);
        const double centre = std::floor((p + 0.5) * side / T) + 0.5;
        fig.line(r.x - 5, r.y + centre, r.x - 1, r.y + centre, kText);
        fig.text(r.x - 8, r.y + centre, l, tick_style, Anchor::End);
        fig.line(r.x + centre, r.y + side + 1, r.x + centre, r.y + side + 5, kText);
        fig.text(r.x + centre, r.y + side + 8 + label_h / 2, l, tick_style, Anchor::Middle);
      }
    }
  }

  // Colour bar, 1 at the top, 0 at the bottom.
  const int bar_x = kMargin + cols * block_w, bar_y = header_h + panel_title_h;
  std::vector<std::optional<Rgb>> bar(static_cast<size_t>(kBarWidth) * bar_h);
  for (int y = 0; y < bar_h; ++y) {
    const Rgb c = viridis(1.0 - static_cast<double>(y) / (bar_h - 1));
    std::fill(bar.begin() + static_cast<size_t>(y) * kBarWidth, bar.begin() + static_cast<size_t>(y + 1) * kBarWidth, c);
  }
  fig.raster(bar_x, bar_y, kBarWidth, bar_h, bar);
  if (layout != nullptr) layout->colour_bar = {bar_x, bar_y, kBarWidth, bar_h};
  fig.stroke_rect(bar_x - 1, bar_y - 1, kBarWidth + 2, bar_h + 2, kFrame);
  fig.text(bar_x, bar_y + bar_h + 20, "weight", bar_style);
  const Ticks bar_ticks = nice_ticks(0, 1, {5});
  for (size_t i = 0; i < bar_ticks.values.size(); ++i) {
    const double y = bar_y + std::round((1 - bar_ticks.values[i]) * (bar_h - 1)) + 0.5;
    fig.line(bar_x + kBarWidth, y, bar_x + kBarWidth + 4, y, kText);
    fig.text(bar_x + kBarWidth + 7, y, bar_ticks.labels[i], bar_style);
  }
  return fig;
}

void plot_attention(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                    const std::string& out_path, const std::string& title) {
  draw_attention(panels, token_labels, title).save(out_path);
}

}  // namespace nanogpt::viz
