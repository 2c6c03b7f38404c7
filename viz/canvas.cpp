// Canvas drawing and PNG output (stb_image_write, compiled here and only here, as static functions).
#include "viz/canvas.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "viz/font.h"
#include "io/atomic_file.h"

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb_image_write.h>
#pragma GCC diagnostic pop

namespace nanogpt::viz {
namespace {

constexpr int kMaxSide = 16384;

uint8_t lerp_channel(uint8_t a, uint8_t b, double t) {
  return static_cast<uint8_t>(std::lround(a + (static_cast<double>(b) - a) * t));
}

// Pixel index range [lo, hi] of a span, clamped to [0, limit) so absurd coordinates cost nothing.
std::pair<int, int> clamped_span(double lo, double hi, int limit) {
  return {static_cast<int>(std::clamp(std::floor(lo), -1.0, static_cast<double>(limit))),
          static_cast<int>(std::clamp(std::ceil(hi), -1.0, static_cast<double>(limit)))};
}

// Calls fn(x, y, coverage) for every pixel of the width x height canvas within width/2 (+ half a
// pixel of anti-aliasing) of the segment. Scans a band around the line, not its bounding box, so
// long diagonals stay cheap.
template <typename Fn>
void for_each_segment_pixel(double x0, double y0, double x1, double y1, double width, int canvas_w, int canvas_h,
                            Fn fn) {
  if (!std::isfinite(x0) || !std::isfinite(y0) || !std::isfinite(x1) || !std::isfinite(y1)) return;
  const double r = std::clamp(width, 0.5, 1000.0) / 2.0;
  const double dx = x1 - x0, dy = y1 - y0;
  const double len2 = dx * dx + dy * dy;
  const bool steep = std::abs(dy) > std::abs(dx);
  const double band = r * 1.5 + 1.5;  // perpendicular reach r, measured along the minor axis (|slope| <= 1)
  auto coverage = [&](int x, int y) {
    const double px = x + 0.5 - x0, py = y + 0.5 - y0;
    const double t = len2 > 0 ? std::clamp((px * dx + py * dy) / len2, 0.0, 1.0) : 0.0;
    const double ex = px - t * dx, ey = py - t * dy;
    return std::clamp(r + 0.5 - std::sqrt(ex * ex + ey * ey), 0.0, 1.0);
  };
  // Major axis: a (x if shallow, y if steep); minor axis: b.
  const double a0 = steep ? y0 : x0, a1 = steep ? y1 : x1, b0 = steep ? x0 : y0, b1 = steep ? x1 : y1;
  const int a_limit = steep ? canvas_h : canvas_w, b_limit = steep ? canvas_w : canvas_h;
  const auto [a_lo, a_hi] = clamped_span(std::min(a0, a1) - r - 1, std::max(a0, a1) + r + 1, a_limit);
  for (int a = a_lo; a <= a_hi; ++a) {
    const double da = a1 - a0;
    const double t = da != 0 ? std::clamp((a + 0.5 - a0) / da, 0.0, 1.0) : 0.0;
    const double b_mid = b0 + t * (b1 - b0);
    const auto [b_lo, b_hi] = clamped_span(b_mid - band, b_mid + band, b_limit);
    for (int b = b_lo; b <= b_hi; ++b) {
      const int x = steep ? b : a, y = steep ? a : b;
      const double c = coverage(x, y);
      if (c > 0) fn(x, y, c);
    }
  }
}

}  // namespace

Rgb mix(Rgb a, Rgb b, double t) {
  t = std::clamp(t, 0.0, 1.0);
  return {lerp_channel(a.r, b.r, t), lerp_channel(a.g, b.g, t), lerp_channel(a.b, b.b, t)};
}

Canvas::Canvas(int width, int height, Rgb background) : width_(width), height_(height), background_(background) {
  if (width < 1 || height < 1 || width > kMaxSide || height > kMaxSide) {
    throw std::runtime_error("[viz] canvas size " + std::to_string(width) + "x" + std::to_string(height) +
                             " is out of range (each side must be 1.." + std::to_string(kMaxSide) + ")");
  }
  rgb_.resize(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0; i < rgb_.size(); i += 3) {
    rgb_[i] = background.r;
    rgb_[i + 1] = background.g;
    rgb_[i + 2] = background.b;
  }
  reset_clip();
}

Rgb Canvas::pixel(int x, int y) const {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) {
    throw std::out_of_range("[viz] pixel (" + std::to_string(x) + ", " + std::to_string(y) + ") is outside the " +
                            std::to_string(width_) + "x" + std::to_string(height_) + " canvas");
  }
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  return {rgb_[i], rgb_[i + 1], rgb_[i + 2]};
}

void Canvas::set_clip(int x, int y, int w, int h) {
  clip_x0_ = std::clamp(x, 0, width_);
  clip_y0_ = std::clamp(y, 0, height_);
  clip_x1_ = std::clamp(x + std::max(w, 0), clip_x0_, width_);
  clip_y1_ = std::clamp(y + std::max(h, 0), clip_y0_, height_);
}

void Canvas::reset_clip() { set_clip(0, 0, width_, height_); }

void Canvas::set_pixel(int x, int y, Rgb color) {
  if (!in_clip(x, y)) return;
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  rgb_[i] = color.r;
  rgb_[i + 1] = color.g;
  rgb_[i + 2] = color.b;
}

void Canvas::blend_pixel(int x, int y, Rgb color, double alpha) {
  if (!in_clip(x, y) || alpha <= 0) return;
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  const Rgb blended = mix({rgb_[i], rgb_[i + 1], rgb_[i + 2]}, color, alpha);
  rgb_[i] = blended.r;
  rgb_[i + 1] = blended.g;
  rgb_[i + 2] = blended.b;
}

void Canvas::fill_rect(int x, int y, int w, int h, Rgb color) {
  const int x0 = std::max(x, clip_x0_), x1 = std::min(x + w, clip_x1_);
  const int y0 = std::max(y, clip_y0_), y1 = std::min(y + h, clip_y1_);
  for (int yy = y0; yy < y1; ++yy) {
    for (int xx = x0; xx < x1; ++xx) set_pixel(xx, yy, color);
  }
}

void Canvas::stroke_rect(int x, int y, int w, int h, Rgb color, int thickness) {
  const int t = std::min({thickness, w, h});
  if (t <= 0) return;
  fill_rect(x, y, w, t, color);
  fill_rect(x, y + h - t, w, t, color);
  fill_rect(x, y + t, t, h - 2 * t, color);
  fill_rect(x + w - t, y + t, t, h - 2 * t, color);
}

void Canvas::draw_line(double x0, double y0, double x1, double y1, Rgb color, double width) {
  for_each_segment_pixel(x0, y0, x1, y1, width, width_, height_,
                         [&](int x, int y, double c) { blend_pixel(x, y, color, c); });
}

void Canvas::draw_polyline(const std::vector<std::pair<double, double>>& points, Rgb color, double width) {
  if (points.empty()) return;
  if (points.size() == 1) {
    fill_circle(points[0].first, points[0].second, std::max(width, 1.0) / 2.0, color);
    return;
  }
  // Coverage of the whole shape (max over segments) restricted to the clip, blended once at the end.
  const int cw = clip_x1_ - clip_x0_, ch = clip_y1_ - clip_y0_;
  if (cw <= 0 || ch <= 0) return;
  std::vector<float> coverage(static_cast<size_t>(cw) * ch, 0.0f);
  int touched_y0 = ch, touched_y1 = -1;
  for (size_t i = 1; i < points.size(); ++i) {
    for_each_segment_pixel(points[i - 1].first, points[i - 1].second, points[i].first, points[i].second, width,
                           width_, height_, [&](int x, int y, double c) {
                             if (!in_clip(x, y)) return;
                             float& cell = coverage[static_cast<size_t>(y - clip_y0_) * cw + (x - clip_x0_)];
                             cell = std::max(cell, static_cast<float>(c));
                             touched_y0 = std::min(touched_y0, y - clip_y0_);
                             touched_y1 = std::max(touched_y1, y - clip_y0_);
                           });
  }
  for (int y = touched_y0; y <= touched_y1; ++y) {
    for (int x = 0; x < cw; ++x) {
      const float c = coverage[static_cast<size_t>(y) * cw + x];
      if (c > 0) blend_pixel(x + clip_x0_, y + clip_y0_, color, c);
    }
  }
}

void Canvas::fill_circle(double cx, double cy, double radius, Rgb color) {
  if (!std::isfinite(cx) || !std::isfinite(cy) || !std::isfinite(radius)) return;
  const auto [x0, x1] = clamped_span(cx - radius - 1, cx + radius + 1, width_);
  const auto [y0, y1] = clamped_span(cy - radius - 1, cy + radius + 1, height_);
  for (int y = y0; y <= y1; ++y) {
    for (int x = x0; x <= x1; ++x) {
      const double d = std::hypot(x + 0.5 - cx, y + 0.5 - cy);
      blend_pixel(x, y, color, std::clamp(radius + 0.5 - d, 0.0, 1.0));
    }
  }
}

template <typename Plot>
void Canvas::draw_glyphs(std::string_view text, int scale, Plot plot) {
  // plot(u, v) receives unrotated text-space pixels: u along the text, v down from the cap top.
  const std::string drawable = to_drawable(text);
  for (size_t k = 0; k < drawable.size(); ++k) {
    const uint8_t* rows = glyph_rows(drawable[k]);
    for (int row = 0; row < kGlyphHeight; ++row) {
      for (int col = 0; col < kGlyphWidth; ++col) {
        if ((rows[row] >> (kGlyphWidth - 1 - col) & 1) == 0) continue;
        const int u = (static_cast<int>(k) * kGlyphAdvance + col) * scale, v = row * scale;
        for (int dv = 0; dv < scale; ++dv) {
          for (int du = 0; du < scale; ++du) plot(u + du, v + dv);
        }
      }
    }
  }
}

void Canvas::draw_text(int x, int y, std::string_view text, Rgb color, int scale) {
  draw_glyphs(text, std::max(scale, 1), [&](int u, int v) { set_pixel(x + u, y + v, color); });
}

void Canvas::draw_text_up(int x, int y, std::string_view text, Rgb color, int scale) {
  draw_glyphs(text, std::max(scale, 1), [&](int u, int v) { set_pixel(x + v, y - 1 - u, color); });
}

std::string Canvas::encode_png() const {
  std::string png;
  auto append = [](void* context, void* data, int size) {
    static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<size_t>(size));
  };
  if (stbi_write_png_to_func(append, &png, width_, height_, 3, rgb_.data(), width_ * 3) == 0) {
    throw std::runtime_error("[viz] PNG encoding of a " + std::to_string(width_) + "x" + std::to_string(height_) +
                             " canvas failed (out of memory?)");
  }
  return png;
}

void Canvas::save_png(const std::string& path) const { io::write_bytes_atomically(path, encode_png(), "viz"); }

}  // namespace nanogpt::viz
