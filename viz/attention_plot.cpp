// Attention figure layout, per panel: a title row ("layer L head H"), then query labels to the
// left of the heatmap and key labels below it. Panels sit in a grid; the colour bar sits to the
// right of the first row.
#include "viz/attention_plot.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "viz/axis_ticks.h"
#include "viz/colormap.h"
#include "viz/font.h"

namespace nanogpt::viz {
namespace {

constexpr Rgb kText{30, 30, 30};
constexpr Rgb kMutedText{90, 90, 90};
constexpr Rgb kFrame{190, 190, 190};
constexpr int kMargin = 16;      // around the figure
constexpr int kPanelGap = 28;    // between panels
constexpr int kBarWidth = 20;    // colour bar
constexpr int kMinLabelCell = 8; // smallest cell (pixels) that gets a token label: 7-pixel glyphs + 1

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

// The largest scale (3, 2, 1) at which `text` fits in `width`, else 1.
int fitting_scale(const std::string& text, int width, int max_scale) {
  for (int scale = max_scale; scale > 1; --scale) {
    if (text_width(text, scale) <= width) return scale;
  }
  return 1;
}

// Fills the heatmap: exact cells when each is at least a pixel, else each pixel shows the largest
// weight of the block it covers (so a sharp attention spike never disappears when shrunk).
void draw_heatmap(Canvas& canvas, const torch::Tensor& weights, const PixelRect& r, int64_t T) {
  const torch::Tensor w = weights.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const auto a = w.accessor<float, 2>();
  if (r.w >= T) {
    const int cell = r.w / static_cast<int>(T);
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        canvas.fill_rect(r.x + static_cast<int>(j) * cell, r.y + static_cast<int>(i) * cell, cell, cell,
                         viridis(a[i][j]));
      }
    }
    return;
  }
  for (int py = 0; py < r.h; ++py) {
    const int64_t i0 = py * T / r.h, i1 = std::max<int64_t>(i0 + 1, (py + 1) * T / r.h);
    for (int px = 0; px < r.w; ++px) {
      const int64_t j0 = px * T / r.w, j1 = std::max<int64_t>(j0 + 1, (px + 1) * T / r.w);
      if (j0 > i1 - 1) continue;  // the whole block lies above the diagonal: masked
      float peak = 0;
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < std::min(j1, i + 1); ++j) peak = std::max(peak, a[i][j]);
      }
      canvas.set_pixel(r.x + px, r.y + py, viridis(peak));
    }
  }
}

}  // namespace

int64_t check_attention_panels(const std::vector<AttentionPanel>& panels,
                               const std::vector<std::string>& token_labels) {
  if (panels.empty()) throw std::runtime_error("[viz] no attention panels to draw (select at least one layer)");
  const auto T = static_cast<int64_t>(token_labels.size());
  if (T == 0) throw std::runtime_error("[viz] no token labels: the prompt must have at least one token");
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const AttentionPanel& p : panels) {
    const std::string name = "layer " + std::to_string(p.layer) + " head " + std::to_string(p.head);
    if (!p.weights.defined()) throw std::runtime_error("[viz] attention panel " + name + " has no weights");
    if (p.weights.dim() != 2 || p.weights.size(0) != T || p.weights.size(1) != T) {
      throw std::runtime_error("[viz] attention panel " + name + " has shape " + c10::str(p.weights.sizes()) +
                               "; expected [" + std::to_string(T) + ", " + std::to_string(T) +
                               "] (one row and column per token label)");
    }
    if (!seen.insert({p.layer, p.head}).second) {
      throw std::runtime_error("[viz] attention panel " + name + " appears twice");
    }
  }
  return T;
}

std::string attention_axis_label(const std::string& token, int64_t position) {
  if (token == "\n") return "\\n";
  if (token == "\t") return "\\t";
  if (token == "\r") return "\\r";
  if (token == " ") return std::string(1, kVisibleSpace);
  const bool printable = !token.empty() && token.size() <= 3 &&
                         std::all_of(token.begin(), token.end(), [](char c) { return c > ' ' && c < 0x7F; });
  return printable ? token : std::to_string(position);
}

Canvas draw_attention(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                      const std::string& title, std::vector<PixelRect>* heatmap_rects) {
  const int64_t T = check_attention_panels(panels, token_labels);
  int rows = 0, cols = 0;
  const std::vector<Placement> placements = arrange(panels, rows, cols);

  // Heatmap side: whole pixels per cell, smaller targets for wider grids; pooled when T is larger.
  const int target = cols <= 1 ? 520 : cols <= 2 ? 440 : cols <= 4 ? 360 : 260;
  const int cell = T <= target ? std::min<int>(target / static_cast<int>(T), 40) : 0;
  const int side = cell > 0 ? cell * static_cast<int>(T) : target;

  // Axis labels: the tokens where a cell is large enough, else position ticks.
  std::vector<std::string> labels;
  for (int64_t i = 0; i < T; ++i) labels.push_back(attention_axis_label(token_labels[i], i));
  const int label_scale = cell >= 16 ? 2 : cell >= kMinLabelCell ? 1 : 0;
  std::vector<int64_t> tick_positions;
  int tick_scale = side >= 200 ? 2 : 1;
  int max_label_w = 0;
  if (label_scale > 0) {
    for (const std::string& l : labels) max_label_w = std::max(max_label_w, text_width(l, label_scale));
  } else {
    for (double v : nice_ticks(0, static_cast<double>(T - 1), {5, /*integers=*/true}).values) {
      if (v >= 0 && v <= T - 1 && v == std::floor(v)) tick_positions.push_back(static_cast<int64_t>(v));
    }
    max_label_w = text_width(std::to_string(T - 1), tick_scale);
  }
  // Key labels stand upright where they fit in their column, else turn to read bottom to top.
  auto upright = [&](const std::string& label) { return text_width(label, label_scale) <= cell; };
  const int left_w = max_label_w + 8;
  int below_h = kGlyphHeight * (label_scale == 0 ? tick_scale : label_scale) + 10;
  for (const std::string& l : labels) {
    if (label_scale > 0 && !upright(l)) below_h = std::max(below_h, text_width(l, label_scale) + 8);
  }

  const int panel_title_scale = side >= 100 ? 2 : 1;
  const int panel_title_h = kGlyphHeight * panel_title_scale + 8;
  const int title_w = text_width("layer 00 head 00", panel_title_scale);
  const int block_w = left_w + std::max(side, title_w) + kPanelGap;
  const int block_h = panel_title_h + side + below_h + kPanelGap;

  // Figure header and colour bar geometry.
  const std::string subtitle = "rows: queries, columns: keys, blank: future keys (masked)";
  const int bar_h = std::clamp(side, 100, 360);
  const int bar_tick_scale = 2;
  const int bar_area_w = kBarWidth + 8 + text_width("0.25", bar_tick_scale) + kMargin;
  std::string drawable_title = to_drawable(title);
  int width = kMargin + cols * block_w + bar_area_w;
  width = std::max(width, std::min(text_width(drawable_title, 2), 2400) + 2 * kMargin);
  width = std::max(width, text_width(subtitle, 1) + 2 * kMargin);
  const int max_title_chars = (width - 2 * kMargin) / kGlyphAdvance;
  if (static_cast<int>(drawable_title.size()) > max_title_chars) {
    drawable_title = drawable_title.substr(0, std::max(max_title_chars - 3, 0)) + "...";
  }
  const int title_scale = fitting_scale(drawable_title, width - 2 * kMargin, 3);
  const int subtitle_scale = fitting_scale(subtitle, width - 2 * kMargin, 2);
  const int header_h = kMargin + kCapHeight * title_scale + 10 + kGlyphHeight * subtitle_scale + 14;
  const int bar_bottom = header_h + panel_title_h + bar_h + 10 + kGlyphHeight * bar_tick_scale;  // caption below
  const int height = std::max(header_h + rows * block_h, bar_bottom + kMargin) + kMargin / 2;

  Canvas canvas(width, height, kWhite);
  canvas.draw_text(kMargin, kMargin, drawable_title, kText, title_scale);
  canvas.draw_text(kMargin, kMargin + kCapHeight * title_scale + 10, subtitle, kMutedText, subtitle_scale);

  if (heatmap_rects != nullptr) heatmap_rects->assign(panels.size(), PixelRect{});
  for (size_t k = 0; k < panels.size(); ++k) {
    const AttentionPanel& panel = panels[k];
    const int bx = kMargin + placements[k].col * block_w, by = header_h + placements[k].row * block_h;
    const PixelRect r{bx + left_w, by + panel_title_h, side, side};
    if (heatmap_rects != nullptr) (*heatmap_rects)[k] = r;

    const std::string panel_title = "layer " + std::to_string(panel.layer) + " head " + std::to_string(panel.head);
    canvas.draw_text(r.x + (side - text_width(panel_title, panel_title_scale)) / 2, by, panel_title, kText,
                     panel_title_scale);
    draw_heatmap(canvas, panel.weights, r, T);
    canvas.stroke_rect(r.x - 1, r.y - 1, side + 2, side + 2, kFrame);

    if (label_scale > 0) {
      const int glyph_h = kCapHeight * label_scale;
      for (int64_t i = 0; i < T; ++i) {
        const std::string& l = labels[i];
        const int w = text_width(l, label_scale);
        const int offset = static_cast<int>(i) * cell;
        canvas.draw_text(r.x - 5 - w, r.y + offset + (cell - glyph_h) / 2, l, kText, label_scale);
        if (upright(l)) {
          canvas.draw_text(r.x + offset + (cell - w) / 2, r.y + side + 5, l, kText, label_scale);
        } else {
          canvas.draw_text_up(r.x + offset + (cell - glyph_h) / 2, r.y + side + 5 + w, l, kText, label_scale);
        }
      }
    } else {
      const int glyph_h = kCapHeight * tick_scale;
      for (int64_t p : tick_positions) {
        const std::string l = std::to_string(p);
        const int w = text_width(l, tick_scale);
        const int centre = static_cast<int>((p + 0.5) * side / T);
        canvas.fill_rect(r.x - 5, r.y + centre, 4, 1, kText);
        canvas.draw_text(r.x - 8 - w, r.y + centre - glyph_h / 2, l, kText, tick_scale);
        canvas.fill_rect(r.x + centre, r.y + side + 1, 1, 4, kText);
        canvas.draw_text(r.x + centre - w / 2, r.y + side + 8, l, kText, tick_scale);
      }
    }
  }

  // Colour bar, 0 at the bottom, 1 at the top.
  const int bar_x = kMargin + cols * block_w, bar_y = header_h + panel_title_h;
  for (int y = 0; y < bar_h; ++y) canvas.fill_rect(bar_x, bar_y + y, kBarWidth, 1, viridis(1.0 - (y + 0.5) / bar_h));
  canvas.stroke_rect(bar_x - 1, bar_y - 1, kBarWidth + 2, bar_h + 2, kFrame);
  canvas.draw_text(bar_x, bar_y + bar_h + 10, "weight", kText, bar_tick_scale);
  const Ticks bar_ticks = nice_ticks(0, 1, {5});
  for (size_t i = 0; i < bar_ticks.values.size(); ++i) {
    const int y = bar_y + static_cast<int>(std::lround((1 - bar_ticks.values[i]) * (bar_h - 1)));
    canvas.fill_rect(bar_x + kBarWidth, y, 4, 1, kText);
    canvas.draw_text(bar_x + kBarWidth + 7, y - kCapHeight * bar_tick_scale / 2, bar_ticks.labels[i], kText,
                     bar_tick_scale);
  }
  return canvas;
}

void plot_attention(const std::vector<AttentionPanel>& panels, const std::vector<std::string>& token_labels,
                    const std::string& png_path, const std::string& title) {
  draw_attention(panels, token_labels, title).save_png(png_path);
}

}  // namespace nanogpt::viz
