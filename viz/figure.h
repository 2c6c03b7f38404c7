// Figure: a plot drawn once with cairo (anti-aliased shapes) and pango (text in any script, with
// fontconfig's fallback finding a CJK font for Chinese), then written as PNG or SVG.
// Coordinates are pixels: x right, y down; (x, y) is the top-left corner of pixel (x, y).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "viz/colormap.h"

typedef struct _cairo_surface cairo_surface_t;
typedef struct _cairo cairo_t;

namespace nanogpt::viz {

/// The fonts asked for, first match wins per character (DejaVu for Latin, WenQuanYi or Noto for
/// CJK); fontconfig substitutes an installed font for any the machine lacks.
constexpr const char* kFontFamilies = "DejaVu Sans, WenQuanYi Zen Hei, Noto Sans CJK SC, Sans";

/// The figures' text: labels and titles, and the quieter tick labels and notes.
constexpr Rgb kText{30, 30, 30};
constexpr Rgb kMutedText{90, 90, 90};

struct TextStyle {
  double size = 14;  // em size in pixels
  Rgb color = kBlack;
  bool bold = false;
};

/// Where the text's anchor point sits along its baseline direction; vertically the point is the
/// middle of the line.
enum class Anchor { Start, Middle, End };

struct TextExtent {
  double width = 0, height = 0;  // the line's logical box, pixels
};

/// A rendered figure's pixels, for tests and pixel checks.
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes per pixel
  Rgb at(int x, int y) const {
    const size_t i = (static_cast<size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

class Figure {
 public:
  /// A width x height figure filled with `background`. Throws "[viz] ..." unless both are in 1..16384.
  Figure(int width, int height, Rgb background = kWhite);
  ~Figure();
  Figure(Figure&& other) noexcept;
  Figure& operator=(Figure&& other) noexcept;
  Figure(const Figure&) = delete;
  Figure& operator=(const Figure&) = delete;

  int width() const { return width_; }
  int height() const { return height_; }
  Rgb background() const { return background_; }

  void fill_rect(double x, double y, double w, double h, Rgb color);
  /// A `line_width` outline drawn inside the rectangle.
  void stroke_rect(double x, double y, double w, double h, Rgb color, double line_width = 1.0);
  void line(double x0, double y0, double x1, double y1, Rgb color, double line_width = 1.0);
  /// Connected segments stroked as one path (round joins); non-finite points break the line.
  void polyline(const std::vector<std::pair<double, double>>& points, Rgb color, double line_width = 1.0);
  void fill_circle(double cx, double cy, double radius, Rgb color);
  /// A raster of w x h pixels (row-major; nullopt = transparent) painted 1:1 at (x, y), unsmoothed.
  void raster(int x, int y, int w, int h, const std::vector<std::optional<Rgb>>& pixels);

  /// Restricts later drawing to a rectangle until reset_clip().
  void clip(double x, double y, double w, double h);
  void reset_clip();

  /// The logical size of one line of UTF-8 text (invalid bytes are drawn as U+FFFD).
  TextExtent measure(std::string_view text, const TextStyle& style) const;
  /// Draws one line of text at (x, y) (see Anchor), turned by `degrees` clockwise about that point
  /// (-90: reads bottom to top). Returns its extent.
  TextExtent text(double x, double y, std::string_view text, const TextStyle& style, Anchor anchor = Anchor::Start,
                  double degrees = 0);

  Image render() const;
  /// PNG file contents (cairo's writer).
  std::string png() const;
  /// SVG file contents: cairo's vector output, whose glyphs are outlines (the same in every viewer),
  /// plus every text run as a transparent <text> element, so the figure can be searched and its
  /// labels selected and read by tools.
  std::string svg() const;
  /// Writes svg() when `path` ends in ".svg", else png(), atomically.
  /// Throws "[viz] cannot write 'path': ...".
  void save(const std::string& path) const;

 private:
  struct TextRun {
    double x, y, degrees, size;
    Anchor anchor;
    bool bold;
    std::string text;
  };
  cairo_surface_t* paint_onto_image() const;

  int width_ = 0, height_ = 0;
  Rgb background_;
  cairo_surface_t* recording_ = nullptr;
  cairo_t* cr_ = nullptr;
  std::vector<TextRun> text_runs_;
};

/// The logical size of one line of text as Figure::text would draw it, for laying out a figure
/// before making it.
TextExtent measure_text(std::string_view text, const TextStyle& style);

/// Reads a PNG file (cairo's reader) into pixels. Throws "[viz] cannot read 'path' as PNG: ...".
Image read_png(const std::string& path);

/// False in a build without cairo and pango (-DNANOGPT_PLOTS=OFF), where making a Figure throws.
bool can_draw();

}  // namespace nanogpt::viz
