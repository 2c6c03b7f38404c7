// Canvas: an RGB raster with the few drawing operations plots need (rectangles, anti-aliased
// lines and dots, bitmap text) and PNG output. Coordinates: x right, y down, pixel (x, y) covers
// the square [x, x+1) x [y, y+1); line and dot coordinates are continuous.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

class Canvas {
 public:
  /// A width x height canvas filled with `background`. Throws "[viz] ..." unless both are in 1..16384.
  Canvas(int width, int height, Rgb background = kWhite);

  int width() const { return width_; }
  int height() const { return height_; }
  Rgb background() const { return background_; }

  /// The pixel at (x, y); throws std::out_of_range outside the canvas.
  Rgb pixel(int x, int y) const;

  /// Restricts every later drawing operation to a rectangle (intersected with the canvas).
  void set_clip(int x, int y, int w, int h);
  void reset_clip();

  void set_pixel(int x, int y, Rgb color);                  // ignored outside the clip
  void blend_pixel(int x, int y, Rgb color, double alpha);  // alpha in [0, 1]
  void fill_rect(int x, int y, int w, int h, Rgb color);
  /// A `thickness`-pixel outline drawn inside the rectangle.
  void stroke_rect(int x, int y, int w, int h, Rgb color, int thickness = 1);

  /// Anti-aliased straight line of the given width, with round-ish (distance-based) ends.
  void draw_line(double x0, double y0, double x1, double y1, Rgb color, double width = 1.0);
  /// Connected segments drawn as one shape, so joints are not darkened by double blending.
  void draw_polyline(const std::vector<std::pair<double, double>>& points, Rgb color, double width = 1.0);
  /// Anti-aliased filled disk.
  void fill_circle(double cx, double cy, double radius, Rgb color);

  /// Text with its top-left corner at (x, y); cap height is kCapHeight * scale (viz/font.h).
  /// Non-ASCII code points are drawn as '?'.
  void draw_text(int x, int y, std::string_view text, Rgb color, int scale = 1);
  /// Text rotated 90 degrees counter-clockwise (reads bottom to top), starting at (x, y) and
  /// extending upwards; glyph tops face left, so it spans x .. x + kGlyphHeight * scale.
  void draw_text_up(int x, int y, std::string_view text, Rgb color, int scale = 1);

  /// PNG file contents.
  std::string encode_png() const;
  /// Writes encode_png() to `path` atomically. Throws "[viz] cannot write 'path': ...".
  void save_png(const std::string& path) const;

  /// Row-major RGB bytes, 3 per pixel.
  const std::vector<uint8_t>& rgb() const { return rgb_; }

 private:
  bool in_clip(int x, int y) const { return x >= clip_x0_ && x < clip_x1_ && y >= clip_y0_ && y < clip_y1_; }
  template <typename Plot>
  void draw_glyphs(std::string_view text, int scale, Plot plot);

  int width_, height_;
  Rgb background_;
  int clip_x0_, clip_y0_, clip_x1_, clip_y1_;  // half-open
  std::vector<uint8_t> rgb_;
};

}  // namespace nanogpt::viz
