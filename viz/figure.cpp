// Figure on cairo: drawing goes to a recording surface, which is replayed onto an image surface
// (PNG, pixels) or an SVG surface, so one drawing serves both formats.
#include "viz/figure.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <fmt/format.h>
#include <pango/pangocairo.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

#include "io/atomic_file.h"

namespace nanogpt::viz {
namespace {

constexpr int kMaxSide = 16384;

void set_color(cairo_t* cr, Rgb c) { cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0); }

cairo_status_t append_to_string(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
using Surface = std::unique_ptr<cairo_surface_t, SurfaceDeleter>;

void check_surface(cairo_surface_t* surface, const char* what) {
  const cairo_status_t status = cairo_surface_status(surface);
  if (status != CAIRO_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("[viz] cairo could not make the ") + what + ": " +
                             cairo_status_to_string(status));
  }
}

// A pango layout of one line in the figure's font, for the current transformation of `cr`.
struct Layout {
  PangoLayout* layout;
  Layout(cairo_t* cr, std::string_view text, const TextStyle& style) : layout(pango_cairo_create_layout(cr)) {
    PangoFontDescription* font = pango_font_description_from_string(kFontFamilies);
    pango_font_description_set_absolute_size(font, style.size * PANGO_SCALE);
    if (style.bold) pango_font_description_set_weight(font, PANGO_WEIGHT_BOLD);
    pango_layout_set_font_description(layout, font);
    pango_font_description_free(font);
    gchar* valid = g_utf8_make_valid(text.data(), static_cast<gssize>(text.size()));
    pango_layout_set_text(layout, valid, -1);
    g_free(valid);
  }
  ~Layout() { g_object_unref(layout); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  TextExtent extent() const {
    PangoRectangle logical;
    pango_layout_get_extents(layout, nullptr, &logical);
    return {static_cast<double>(logical.width) / PANGO_SCALE, static_cast<double>(logical.height) / PANGO_SCALE};
  }
};

double anchor_fraction(Anchor anchor) { return anchor == Anchor::Start ? 0.0 : anchor == Anchor::Middle ? 0.5 : 1.0; }

// Text for an XML text node or attribute: markup characters escaped, control characters (which
// XML 1.0 forbids) dropped, invalid UTF-8 replaced.
std::string xml_escape(std::string_view text) {
  gchar* valid = g_utf8_make_valid(text.data(), static_cast<gssize>(text.size()));
  std::string out;
  for (const char* p = valid; *p != '\0'; ++p) {
    switch (*p) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default:
        if (static_cast<unsigned char>(*p) >= 0x20) out += *p;
    }
  }
  g_free(valid);
  return out;
}

// The pixels of an RGB24 (or opaque ARGB32) image surface.
Image pixels_of(cairo_surface_t* image) {
  cairo_surface_flush(image);
  const int width = cairo_image_surface_get_width(image), height = cairo_image_surface_get_height(image);
  Image out{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  const unsigned char* data = cairo_image_surface_get_data(image);
  const int stride = cairo_image_surface_get_stride(image);
  for (int y = 0; y < height; ++y) {
    const auto* row = reinterpret_cast<const uint32_t*>(data + static_cast<size_t>(y) * stride);
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &out.rgb[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<uint8_t>(row[x] >> 16);
      p[1] = static_cast<uint8_t>(row[x] >> 8);
      p[2] = static_cast<uint8_t>(row[x]);
    }
  }
  return out;
}

}  // namespace

Figure::Figure(int width, int height, Rgb background) : width_(width), height_(height), background_(background) {
  if (width < 1 || height < 1 || width > kMaxSide || height > kMaxSide) {
    throw std::runtime_error(
        fmt::format("[viz] figure size {}x{} is outside 1..{} pixels per side", width, height, kMaxSide));
  }
  const cairo_rectangle_t extents{0, 0, static_cast<double>(width), static_cast<double>(height)};
  recording_ = cairo_recording_surface_create(CAIRO_CONTENT_COLOR, &extents);
  check_surface(recording_, "drawing surface");
  cr_ = cairo_create(recording_);
  cairo_set_line_join(cr_, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr_, CAIRO_LINE_CAP_ROUND);
  fill_rect(0, 0, width, height, background);
}

Figure::~Figure() {
  if (cr_ != nullptr) cairo_destroy(cr_);
  if (recording_ != nullptr) cairo_surface_destroy(recording_);
}

Figure::Figure(Figure&& other) noexcept
    : width_(other.width_),
      height_(other.height_),
      background_(other.background_),
      recording_(std::exchange(other.recording_, nullptr)),
      cr_(std::exchange(other.cr_, nullptr)),
      text_runs_(std::move(other.text_runs_)) {}

Figure& Figure::operator=(Figure&& other) noexcept {
  if (this != &other) {
    std::swap(width_, other.width_);
    std::swap(height_, other.height_);
    std::swap(background_, other.background_);
    std::swap(recording_, other.recording_);
    std::swap(cr_, other.cr_);
    std::swap(text_runs_, other.text_runs_);
  }
  return *this;
}

void Figure::fill_rect(double x, double y, double w, double h, Rgb color) {
  set_color(cr_, color);
  cairo_rectangle(cr_, x, y, w, h);
  cairo_fill(cr_);
}

void Figure::stroke_rect(double x, double y, double w, double h, Rgb color, double line_width) {
  set_color(cr_, color);
  cairo_set_line_width(cr_, line_width);
  const double inset = line_width / 2;
  cairo_rectangle(cr_, x + inset, y + inset, w - line_width, h - line_width);
  cairo_stroke(cr_);
}

void Figure::line(double x0, double y0, double x1, double y1, Rgb color, double line_width) {
  polyline({{x0, y0}, {x1, y1}}, color, line_width);
}

void Figure::polyline(const std::vector<std::pair<double, double>>& points, Rgb color, double line_width) {
  set_color(cr_, color);
  cairo_set_line_width(cr_, line_width);
  bool open = false;
  for (const auto& [x, y] : points) {
    // Far-off coordinates are clamped: cairo's fixed-point math overflows past about 2^23.
    if (!std::isfinite(x) || !std::isfinite(y)) {
      open = false;
      continue;
    }
    const double cx = std::clamp(x, -1e6, 1e6), cy = std::clamp(y, -1e6, 1e6);
    open ? cairo_line_to(cr_, cx, cy) : cairo_move_to(cr_, cx, cy);
    open = true;
  }
  cairo_stroke(cr_);
}

void Figure::fill_circle(double cx, double cy, double radius, Rgb color) {
  set_color(cr_, color);
  cairo_new_sub_path(cr_);
  cairo_arc(cr_, cx, cy, radius, 0, 2 * M_PI);
  cairo_fill(cr_);
}

void Figure::raster(int x, int y, int w, int h, const std::vector<std::optional<Rgb>>& pixels) {
  if (w < 1 || h < 1 || pixels.size() != static_cast<size_t>(w) * h) {
    throw std::invalid_argument(fmt::format("[viz] raster of {}x{} got {} pixels", w, h, pixels.size()));
  }
  Surface image(cairo_image_surface_create(CAIRO_FORMAT_ARGB32, w, h));
  check_surface(image.get(), "raster");
  cairo_surface_flush(image.get());
  unsigned char* data = cairo_image_surface_get_data(image.get());
  const int stride = cairo_image_surface_get_stride(image.get());
  for (int row = 0; row < h; ++row) {
    auto* out = reinterpret_cast<uint32_t*>(data + static_cast<size_t>(row) * stride);
    for (int col = 0; col < w; ++col) {
      const std::optional<Rgb>& p = pixels[static_cast<size_t>(row) * w + col];
      out[col] = p ? 0xFF000000u | uint32_t{p->r} << 16 | uint32_t{p->g} << 8 | p->b : 0;  // premultiplied ARGB
    }
  }
  cairo_surface_mark_dirty(image.get());
  cairo_save(cr_);
  cairo_set_source_surface(cr_, image.get(), x, y);
  cairo_pattern_set_filter(cairo_get_source(cr_), CAIRO_FILTER_NEAREST);
  cairo_rectangle(cr_, x, y, w, h);
  cairo_fill(cr_);
  cairo_restore(cr_);
}

void Figure::clip(double x, double y, double w, double h) {
  cairo_reset_clip(cr_);
  cairo_rectangle(cr_, x, y, w, h);
  cairo_clip(cr_);
}

void Figure::reset_clip() { cairo_reset_clip(cr_); }

TextExtent Figure::measure(std::string_view text, const TextStyle& style) const {
  return Layout(cr_, text, style).extent();
}

TextExtent Figure::text(double x, double y, std::string_view text, const TextStyle& style, Anchor anchor,
                        double degrees) {
  cairo_save(cr_);
  cairo_translate(cr_, x, y);
  cairo_rotate(cr_, degrees * M_PI / 180);
  const Layout layout(cr_, text, style);
  const TextExtent extent = layout.extent();
  cairo_move_to(cr_, -anchor_fraction(anchor) * extent.width, -extent.height / 2);
  set_color(cr_, style.color);
  pango_cairo_show_layout(cr_, layout.layout);
  cairo_restore(cr_);
  text_runs_.push_back({x, y, degrees, style.size, anchor, style.bold, std::string(text)});
  return extent;
}

cairo_surface_t* Figure::paint_onto_image() const {
  cairo_surface_flush(recording_);
  cairo_surface_t* image = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width_, height_);
  check_surface(image, "image");
  cairo_t* cr = cairo_create(image);
  cairo_set_source_surface(cr, recording_, 0, 0);
  cairo_paint(cr);
  cairo_destroy(cr);
  cairo_surface_flush(image);
  return image;
}

Image Figure::render() const {
  Surface image(paint_onto_image());
  return pixels_of(image.get());
}

std::string Figure::png() const {
  Surface image(paint_onto_image());
  std::string bytes;
  const cairo_status_t status = cairo_surface_write_to_png_stream(image.get(), append_to_string, &bytes);
  if (status != CAIRO_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("[viz] cairo could not encode the PNG: ") + cairo_status_to_string(status));
  }
  return bytes;
}

std::string Figure::svg() const {
  std::string bytes;
  {
    Surface svg(cairo_svg_surface_create_for_stream(append_to_string, &bytes, width_, height_));
    check_surface(svg.get(), "SVG surface");
    cairo_t* cr = cairo_create(svg.get());
    cairo_set_source_surface(cr, recording_, 0, 0);
    cairo_paint(cr);
    cairo_destroy(cr);
    cairo_surface_finish(svg.get());
  }
  std::string layer = "<g id=\"text\" fill-opacity=\"0\" font-family=\"" + xml_escape(kFontFamilies) + "\">\n";
  for (const TextRun& run : text_runs_) {
    const char* anchor = run.anchor == Anchor::Start ? "start" : run.anchor == Anchor::Middle ? "middle" : "end";
    layer += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{:.1f}\"{} text-anchor=\"{}\" dominant-baseline=\"central\"",
        run.x, run.y, run.size, run.bold ? " font-weight=\"bold\"" : "", anchor);
    if (run.degrees != 0) layer += fmt::format(" transform=\"rotate({:g} {:.1f} {:.1f})\"", run.degrees, run.x, run.y);
    layer += ">" + xml_escape(run.text) + "</text>\n";
  }
  layer += "</g>\n";
  const size_t end = bytes.rfind("</svg>");
  if (end == std::string::npos) throw std::runtime_error("[viz] cairo's SVG output has no closing </svg> tag");
  bytes.insert(end, layer);
  return bytes;
}

void Figure::save(const std::string& path) const {
  const bool svg_file = path.size() >= 4 && g_ascii_strcasecmp(path.c_str() + path.size() - 4, ".svg") == 0;
  io::write_bytes_atomically(path, svg_file ? svg() : png(), "viz");
}

TextExtent measure_text(std::string_view text, const TextStyle& style) { return Figure(1, 1).measure(text, style); }

bool can_draw() { return true; }

Image read_png(const std::string& path) {
  Surface image(cairo_image_surface_create_from_png(path.c_str()));
  const cairo_status_t status = cairo_surface_status(image.get());
  if (status != CAIRO_STATUS_SUCCESS) {
    throw std::runtime_error("[viz] cannot read '" + path + "' as PNG: " + cairo_status_to_string(status));
  }
  return pixels_of(image.get());
}

}  // namespace nanogpt::viz
