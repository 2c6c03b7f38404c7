// Figure in a build without cairo and pango (cmake -DNANOGPT_PLOTS=OFF, e.g. on a GPU machine whose
// image lacks them): making a figure throws, saying how to get plots; nothing else can be reached.
#include <stdexcept>

#include "viz/figure.h"

namespace nanogpt::viz {
namespace {

[[noreturn]] void no_drawing() {
  throw std::runtime_error(
      "[viz] this build has no plots (configured with -DNANOGPT_PLOTS=OFF): install libcairo2-dev and "
      "libpango1.0-dev (scripts/setup.sh) and reconfigure with -DNANOGPT_PLOTS=ON");
}

}  // namespace

Figure::Figure(int, int, Rgb) { no_drawing(); }
Figure::~Figure() = default;
Figure::Figure(Figure&&) noexcept = default;
Figure& Figure::operator=(Figure&&) noexcept = default;
void Figure::fill_rect(double, double, double, double, Rgb) { no_drawing(); }
void Figure::stroke_rect(double, double, double, double, Rgb, double) { no_drawing(); }
void Figure::line(double, double, double, double, Rgb, double) { no_drawing(); }
void Figure::polyline(const std::vector<std::pair<double, double>>&, Rgb, double) { no_drawing(); }
void Figure::fill_circle(double, double, double, Rgb) { no_drawing(); }
void Figure::raster(int, int, int, int, const std::vector<std::optional<Rgb>>&) { no_drawing(); }
void Figure::clip(double, double, double, double) { no_drawing(); }
void Figure::reset_clip() { no_drawing(); }
TextExtent Figure::measure(std::string_view, const TextStyle&) const { no_drawing(); }
TextExtent Figure::text(double, double, std::string_view, const TextStyle&, Anchor, double) { no_drawing(); }
Image Figure::render() const { no_drawing(); }
std::string Figure::png() const { no_drawing(); }
std::string Figure::svg() const { no_drawing(); }
void Figure::save(const std::string&) const { no_drawing(); }
cairo_surface_t* Figure::paint_onto_image() const { no_drawing(); }
TextExtent measure_text(std::string_view, const TextStyle&) { no_drawing(); }
Image read_png(const std::string&) { no_drawing(); }
bool can_draw() { return false; }

}  // namespace nanogpt::viz
