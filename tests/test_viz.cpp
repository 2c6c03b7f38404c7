// Tests for viz/: figures have the expected size and content (curves in their colours, heatmap
// cells in viridis with masked keys blank, the colour bar's range, the tokens as text in SVG), read
// back through cairo's PNG reader; metrics.csv parsing accepts real logs and names the line of a bad
// one; the attention CSV carries the weights exactly enough to sum to 1 per query. Nothing here
// depends on the glyphs a font draws, so a font update cannot break it.
//
// Set NANOGPT_VIZ_TEST_OUT=/some/dir to keep the figures for a look.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "io/metrics_csv.h"
#include "viz/attention_csv.h"
#include "viz/attention_plot.h"
#include "viz/axis_ticks.h"
#include "viz/colormap.h"
#include "viz/figure.h"
#include "viz/loss_plot.h"

namespace fs = std::filesystem;
using namespace nanogpt::viz;

// A build without cairo and pango (cmake -DNANOGPT_PLOTS=OFF) cannot draw: its drawing tests skip.
#define SKIP_WITHOUT_PLOTS() \
  if (!NANOGPT_PLOTS) GTEST_SKIP() << "built with -DNANOGPT_PLOTS=OFF: no cairo/pango to draw with"
using namespace nanogpt::io;

namespace {

// A per-test scratch directory, removed afterwards unless NANOGPT_VIZ_TEST_OUT names a keeper.
class ScratchDir {
 public:
  ScratchDir() {
    const char* keep = std::getenv("NANOGPT_VIZ_TEST_OUT");
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = std::string(info->test_suite_name()) + "." + info->name();
    if (keep != nullptr && *keep != '\0') {
      path_ = fs::path(keep) / name;
      keep_ = true;
    } else {
      path_ = fs::temp_directory_path() / ("nanogpt_test_viz_" + std::to_string(::getpid())) / name;
    }
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    if (!keep_) fs::remove_all(path_.parent_path());
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
  bool keep_ = false;
};

bool near(Rgb a, Rgb b, int tolerance) {
  return std::abs(a.r - b.r) <= tolerance && std::abs(a.g - b.g) <= tolerance && std::abs(a.b - b.b) <= tolerance;
}

// Pixels within `tolerance` of `colour` in rows [y0, y1) (anti-aliased edges differ, line cores do not).
size_t count_near(const Image& image, Rgb colour, int tolerance = 24, int y0 = 0, int y1 = -1) {
  if (y1 < 0) y1 = image.height;
  size_t n = 0;
  for (int y = y0; y < y1; ++y) {
    for (int x = 0; x < image.width; ++x) n += near(image.at(x, y), colour, tolerance);
  }
  return n;
}

size_t distinct_colours(const Image& image) {
  std::set<uint32_t> seen;
  for (size_t i = 0; i < image.rgb.size(); i += 3) seen.insert(image.rgb[i] << 16 | image.rgb[i + 1] << 8 | image.rgb[i + 2]);
  return seen.size();
}

// Pixels in a rectangle that are not the background (ink).
size_t ink(const Image& image, int x, int y, int w, int h, Rgb background = kWhite) {
  size_t n = 0;
  for (int yy = std::max(y, 0); yy < std::min(y + h, image.height); ++yy) {
    for (int xx = std::max(x, 0); xx < std::min(x + w, image.width); ++xx) n += image.at(xx, yy) != background;
  }
  return n;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// A plausible training log: per-step train loss falling from ln(65) with noise, evaluations every 250.
std::string synthetic_metrics(int iters) {
  std::ostringstream csv;
  csv << kMetricsHeader << "\n";
  torch::manual_seed(0);
  const auto noise = torch::randn({iters + 1});
  for (int it = 0; it <= iters; ++it) {
    if (it % 250 == 0) {
      const double eval = 1.0 + 3.17 * std::exp(-it / 600.0);
      csv << it << ",train_eval," << eval - 0.02 * it / iters << ",,,\n";
      csv << it << ",val," << eval + 0.25 * it / iters << ",,,\n";
    }
    if (it < iters) {
      const double loss = 1.0 + 3.17 * std::exp(-it / 600.0) + 0.06 * noise[it].item<double>();
      csv << it << ",train," << loss << ",0.001,41.5,18600\n";
    }
  }
  return csv.str();
}

// Row-stochastic causal weights: softmax over keys <= query of random scores. (T, T)
torch::Tensor causal_softmax(int64_t T, uint64_t seed) {
  torch::manual_seed(seed);
  auto scores = torch::randn({T, T}) * 2;
  auto mask = torch::ones({T, T}, torch::kBool).triu(1);
  return scores.masked_fill(mask, -std::numeric_limits<float>::infinity()).softmax(-1);
}

std::vector<std::string> labels_of(const std::string& ascii) {
  std::vector<std::string> labels;
  for (char c : ascii) labels.emplace_back(1, c);
  return labels;
}

}  // namespace

TEST(Figure, PngRoundTripsThroughCairosReader) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  Figure fig(37, 21, {10, 20, 30});
  fig.fill_rect(3, 4, 10, 5, {200, 0, 0});
  fig.line(0, 0, 36.5, 20.5, {0, 255, 0}, 2.0);
  fig.text(1, 15, "Hi", {10, kWhite});
  const std::string path = dir.file("figure.png");
  fig.save(path);
  const Image image = read_png(path);
  ASSERT_EQ(image.width, 37);
  ASSERT_EQ(image.height, 21);
  EXPECT_EQ(image.rgb, fig.render().rgb);
  EXPECT_EQ(image.at(5, 6), (Rgb{200, 0, 0}));
  EXPECT_EQ(image.at(30, 2), (Rgb{10, 20, 30}));
  EXPECT_GT(distinct_colours(image), 6u);  // anti-aliased edges: blends between the colours
}

TEST(Figure, TextInAnyScriptHasInkAndWidth) {
  SKIP_WITHOUT_PLOTS();
  // Latin, CJK and the marks for whitespace all measure and draw (fontconfig falls back to some
  // installed font per character; which one does not matter here).
  for (const std::string text : {"Hello", "\u5E8A\u524D\u660E\u6708\u5149", "\u2423\u23CE"}) {
    const TextStyle style{20, kBlack};
    const TextExtent extent = measure_text(text, style);
    EXPECT_GT(extent.width, 10) << text;
    EXPECT_GT(extent.height, 10) << text;
    Figure fig(200, 40);
    fig.text(5, 20, text, style);
    const Image image = fig.render();
    EXPECT_GT(ink(image, 0, 0, 200, 40), 30u) << text;
    EXPECT_GT(distinct_colours(image), 3u) << "anti-aliased glyph edges: " << text;
  }
  EXPECT_GT(measure_text("\xff\xfe broken", {12}).width, 0);  // invalid UTF-8 is replaced, not rejected
}

TEST(Figure, SvgKeepsTheTextAsText) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  Figure fig(120, 60);
  fig.fill_rect(10, 10, 20, 20, {200, 0, 0});
  fig.text(10, 40, "\u5E8A\u524D\u660E\u6708\u5149 <&>", {14, kBlack});
  fig.text(100, 30, "up", {14, kBlack}, Anchor::Middle, -90);
  const std::string path = dir.file("figure.svg");
  fig.save(path);
  const std::string svg = read_text(path);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u) << svg.substr(0, 80);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find(">\u5E8A\u524D\u660E\u6708\u5149 &lt;&amp;&gt;</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("rotate(-90 100.0 30.0)\">up</text>"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("</svg>"), svg.rfind("</svg>"));
}

TEST(Figure, UnwritablePathNamesItAndLeavesNoTempFile) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const std::string path = dir.file("missing_dir/plot.png");
  const std::string error = error_of([&] { Figure(4, 4).save(path); });
  EXPECT_NE(error.find("[viz] cannot write '" + path + "'"), std::string::npos) << error;
  EXPECT_NE(error.find("No such file or directory"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(fs::path(dir.file("missing_dir"))));
  EXPECT_NE(error_of([] { Figure(0, 10); }).find("[viz] figure size 0x10"), std::string::npos);
}

TEST(Figure, AbsurdCoordinatesAreCheapAndHarmless) {
  SKIP_WITHOUT_PLOTS();
  Figure fig(16, 16);
  fig.line(-1e12, 3.5, 1e12, 3.5, kBlack, 1);
  fig.line(std::nan(""), 0, 5, 5, kBlack, 1);
  fig.fill_circle(8, 8, 1e9, kBlack);
  fig.polyline({{-1e15, -1e15}, {8, 8}, {1e15, 1e15}}, kBlack, 2);
  const Image image = fig.render();
  EXPECT_EQ(image.at(0, 3), kBlack);
  EXPECT_EQ(image.at(15, 0), kBlack);
}

TEST(Figure, ClipConfinesDrawing) {
  SKIP_WITHOUT_PLOTS();
  Figure fig(20, 20);
  fig.clip(5, 5, 10, 10);
  fig.fill_rect(0, 0, 20, 20, kBlack);
  fig.line(0, 0, 20, 20, kBlack, 3);
  fig.reset_clip();
  const Image image = fig.render();
  EXPECT_EQ(image.at(4, 4), kWhite);
  EXPECT_EQ(image.at(15, 15), kWhite);
  EXPECT_EQ(image.at(5, 5), kBlack);
}

TEST(Figure, RasterIsPaintedOneToOneWithTransparentHoles) {
  SKIP_WITHOUT_PLOTS();
  Figure fig(10, 10);
  std::vector<std::optional<Rgb>> pixels(4 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) {
    if (i % 2 == 0) pixels[i] = Rgb{static_cast<uint8_t>(i * 20), 0, 0};
  }
  fig.raster(2, 3, 4, 3, pixels);
  const Image image = fig.render();
  for (int y = 0; y < 3; ++y) {
    for (int x = 0; x < 4; ++x) {
      const size_t i = static_cast<size_t>(y) * 4 + x;
      EXPECT_EQ(image.at(2 + x, 3 + y), pixels[i] ? *pixels[i] : kWhite) << x << "," << y;
    }
  }
  EXPECT_EQ(image.at(6, 3), kWhite);
}

TEST(Colormap, ViridisEndsAndIsMonotoneInLightness) {
  EXPECT_EQ(viridis(0), (Rgb{68, 1, 84}));
  EXPECT_EQ(viridis(1), (Rgb{253, 231, 37}));
  EXPECT_EQ(viridis(-3), viridis(0));
  EXPECT_EQ(viridis(std::nan("")), viridis(0));
  double previous = -1;
  for (int i = 0; i <= 100; ++i) {
    const Rgb c = viridis(i / 100.0);
    const double luma = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
    EXPECT_GT(luma, previous) << "t = " << i / 100.0;
    previous = luma;
  }
}

TEST(AxisTicks, RoundStepsAndLabels) {
  const Ticks unit = nice_ticks(0, 1, {5});
  EXPECT_DOUBLE_EQ(unit.step, 0.25);
  EXPECT_EQ(unit.labels, (std::vector<std::string>{"0.00", "0.25", "0.50", "0.75", "1.00"}));
  const Ticks loss = nice_ticks(0.93, 4.41, {7});
  EXPECT_DOUBLE_EQ(loss.step, 0.5);
  EXPECT_EQ(loss.labels.front(), "1.0");
  EXPECT_EQ(loss.labels.back(), "4.0");
  const Ticks iters = nice_ticks(-100, 20100, {5, true, true});
  EXPECT_DOUBLE_EQ(iters.step, 5000);
  EXPECT_EQ(iters.labels, (std::vector<std::string>{"0", "5k", "10k", "15k", "20k"}));
  EXPECT_FALSE(nice_ticks(3, 3).values.empty());  // a zero-width range still gets ticks
}

TEST(MetricsCsv, ParsesSplitsSortedWithLaterDuplicatesWinning) {
  ScratchDir dir;
  const std::string path = dir.file("metrics.csv");
  write_text(path, std::string(kMetricsHeader) + "\r\n" +
                       "0,val,4.2,,,\n"
                       "0,train_eval,4.19,,,\n"
                       "1,train,4.1,0.001,40.5,20000\n"
                       "2,train,3.9,0.001,40.1,20100\n"
                       "\n"
                       "1,train,4.0,0.001,39.9,20500\n"  // a resumed run re-logs iteration 1
                       "3,train,nan,0.001,40.0,20000\n");
  const Metrics m = read_metrics_csv(path);
  ASSERT_EQ(m.train.size(), 3u);
  EXPECT_EQ(m.train[0].iter, 1);
  EXPECT_DOUBLE_EQ(m.train[0].loss, 4.0);
  EXPECT_DOUBLE_EQ(m.train[0].tokens_per_sec, 20500);
  EXPECT_TRUE(std::isnan(m.train[2].loss));
  ASSERT_EQ(m.val.size(), 1u);
  EXPECT_DOUBLE_EQ(m.val[0].loss, 4.2);
  EXPECT_TRUE(std::isnan(m.val[0].lr));
  ASSERT_EQ(m.train_eval.size(), 1u);
}

TEST(MetricsCsv, MalformedLineIsRejectedWithItsLineNumber) {
  ScratchDir dir;
  const std::string path = dir.file("metrics.csv");
  write_text(path, std::string(kMetricsHeader) + "\n1,train,4.1,0.001,40,2000\n2,train,oops,0.001,40,2000\n");
  std::string error = error_of([&] { read_metrics_csv(path); });
  EXPECT_NE(error.find("[viz] '" + path + "' line 3: loss 'oops' is not a number"), std::string::npos) << error;

  write_text(path, std::string(kMetricsHeader) + "\n1,train,4.1\n");
  error = error_of([&] { read_metrics_csv(path); });
  EXPECT_NE(error.find("line 2: expected 6 comma-separated fields, found 3"), std::string::npos) << error;

  write_text(path, std::string(kMetricsHeader) + "\n1,test,4.1,,,\n");
  error = error_of([&] { read_metrics_csv(path); });
  EXPECT_NE(error.find("line 2: split 'test' is not one of train, val, train_eval"), std::string::npos) << error;
}

TEST(MetricsCsv, WrongHeaderMissingFileAndEmptyFileAreClear) {
  ScratchDir dir;
  const std::string path = dir.file("metrics.csv");
  write_text(path, "step,loss\n1,2\n");
  EXPECT_NE(error_of([&] { read_metrics_csv(path); }).find("does not start with the metrics header"),
            std::string::npos);
  write_text(path, "");
  EXPECT_NE(error_of([&] { read_metrics_csv(path); }).find("is empty"), std::string::npos);
  const std::string missing = dir.file("nope.csv");
  EXPECT_NE(error_of([&] { read_metrics_csv(missing); }).find("[viz] cannot read '" + missing + "'"),
            std::string::npos);
}

TEST(MetricsCsv, UnterminatedLastLineIsTakenAsAWriteInProgress) {
  ScratchDir dir;
  const std::string path = dir.file("metrics.csv");
  write_text(path, std::string(kMetricsHeader) + "\n1,train,4.1,0.001,40,2000\n2,tra");
  const Metrics m = read_metrics_csv(path);
  EXPECT_EQ(m.train.size(), 1u);
}

constexpr Rgb kTrainSmoothColour{31, 119, 180}, kValColour{224, 90, 20}, kTrainEvalColour{44, 160, 44};
constexpr Rgb kLrColour{148, 103, 189}, kSpeedColour{140, 86, 75};

TEST(LossPlot, SyntheticRunHasLossLearningRateAndThroughputPanels) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const std::string csv = dir.file("metrics.csv"), png = dir.file("loss.png");
  write_text(csv, synthetic_metrics(3000));
  plot_loss_curves(csv, png);
  const Image image = read_png(png);
  ASSERT_EQ(image.width, kLossPlotWidth);
  ASSERT_EQ(image.height, kLossPanelHeight + 2 * kExtraPanelHeight);
  EXPECT_GT(distinct_colours(image), 50u);
  const int loss_bottom = kLossPanelHeight - 60, lr_bottom = loss_bottom + kExtraPanelHeight;
  // Each curve in its own panel: the loss curves above, the schedule, then the throughput.
  EXPECT_GT(count_near(image, kTrainSmoothColour, 24, 0, loss_bottom), 200u);
  EXPECT_GT(count_near(image, kValColour, 24, 0, loss_bottom), 100u);
  EXPECT_GT(count_near(image, kTrainEvalColour, 24, 0, loss_bottom), 100u);
  EXPECT_GT(count_near(image, kLrColour, 24, loss_bottom, lr_bottom), 300u);
  EXPECT_EQ(count_near(image, kLrColour, 10, 0, loss_bottom), 0u);
  EXPECT_GT(count_near(image, kSpeedColour, 24, lr_bottom, image.height), 300u);
  EXPECT_FALSE(fs::exists(png + ".tmp." + std::to_string(::getpid())));
}

TEST(LossPlot, SvgNamesThePanels) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const std::string csv = dir.file("metrics.csv"), svg = dir.file("loss.svg");
  write_text(csv, synthetic_metrics(600));
  plot_loss_curves(csv, svg);
  const std::string text = read_text(svg);
  for (const std::string label : {">Training curves</text>", ">loss</text>", ">tokens/s (thousands)</text>",
                                  ">learning rate (\u00d71e-3)</text>", ">iteration</text>", ">val</text>"}) {
    EXPECT_NE(text.find(label), std::string::npos) << label;
  }
}

TEST(LossPlot, RowsWithoutLearningRateOrSpeedGiveTheLossPanelAlone) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const std::string csv = dir.file("metrics.csv"), png = dir.file("loss.png");
  std::string rows = std::string(kMetricsHeader) + "\n";
  for (int it = 0; it < 50; ++it) rows += std::to_string(it) + ",train," + std::to_string(4.0 - it * 0.01) + ",,,\n";
  write_text(csv, rows);
  plot_loss_curves(csv, png);
  const Image image = read_png(png);
  EXPECT_EQ(image.height, kLossPanelHeight);
  EXPECT_GT(count_near(image, kTrainSmoothColour), 200u);
}

TEST(LossPlot, FirstEvaluationAloneStillDraws) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const std::string csv = dir.file("metrics.csv"), png = dir.file("loss.png");
  write_text(csv, std::string(kMetricsHeader) + "\n0,train_eval,4.19,,,\n0,val,4.2,,,\n");
  plot_loss_curves(csv, png);
  EXPECT_GT(count_near(read_png(png), kValColour), 20u);
}

TEST(LossPlot, NothingToPlotIsAnError) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const std::string csv = dir.file("metrics.csv");
  write_text(csv, std::string(kMetricsHeader) + "\n5,train,nan,,,\n");
  EXPECT_NE(error_of([&] { plot_loss_curves(csv, dir.file("loss.png")); }).find("no finite losses"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("loss.png")));
}

TEST(AttentionPlot, MaskedCellsAreBackgroundAndOthersShowTheirWeight) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const int64_t T = 7;
  // Lower triangle with known weights, including exact zeros on and below the diagonal.
  auto w = torch::zeros({T, T});
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = 0; j <= i; ++j) w[i][j] = (i + j) % 3 == 0 ? 0.0 : (j + 1.0) / (i + 1.0);
  }
  const std::vector<AttentionPanel> panels{{0, 0, w}, {0, 1, w.clone()}};
  const std::vector<std::string> labels{"T", "o", " ", "b", "e", "\n", "\xE4\xB8\xAD"};
  AttentionLayout layout;
  const Figure fig = draw_attention(panels, labels, "causal test", &layout);
  const std::string png = dir.file("attention.png");
  fig.save(png);
  const Image image = read_png(png);
  ASSERT_EQ(image.width, fig.width());
  ASSERT_EQ(layout.heatmaps.size(), 2u);
  for (const PixelRect& r : layout.heatmaps) {
    ASSERT_EQ(r.w % T, 0);
    const int cell = r.w / static_cast<int>(T);
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < T; ++j) {
        const Rgb expected = j > i ? fig.background() : viridis(w[i][j].item<double>());
        for (int y = r.y + i * cell; y < r.y + (i + 1) * cell; ++y) {
          for (int x = r.x + j * cell; x < r.x + (j + 1) * cell; ++x) {
            ASSERT_EQ(image.at(x, y), expected) << "query " << i << " key " << j << " pixel " << x << "," << y;
          }
        }
      }
    }
    // Token labels: ink to the left of the heatmap (queries) and under it (keys).
    EXPECT_GT(ink(image, r.x - 40, r.y, 38, r.h), 50u);
    EXPECT_GT(ink(image, r.x, r.y + r.h + 3, r.w, 30), 50u);
  }
}

TEST(AttentionPlot, ColourBarRunsFromViridisZeroToOne) {
  SKIP_WITHOUT_PLOTS();
  const int64_t T = 5;
  AttentionLayout layout;
  const Image image = draw_attention({{0, 0, causal_softmax(T, 2)}}, labels_of("hello"), "bar", &layout).render();
  const PixelRect bar = layout.colour_bar;
  ASSERT_GT(bar.h, 50);
  const int x = bar.x + bar.w / 2;
  EXPECT_EQ(image.at(x, bar.y), viridis(1));
  EXPECT_EQ(image.at(x, bar.y + bar.h - 1), viridis(0));
  EXPECT_TRUE(near(image.at(x, bar.y + bar.h / 2), viridis(0.5), 8));
  for (int y = bar.y + 1; y < bar.y + bar.h; ++y) {  // darker downwards
    const Rgb above = image.at(x, y - 1), here = image.at(x, y);
    EXPECT_GE(0.2126 * above.r + 0.7152 * above.g + 0.0722 * above.b + 0.5,
              0.2126 * here.r + 0.7152 * here.g + 0.0722 * here.b) << y;
  }
}

TEST(AttentionPlot, SvgLabelsTheAxesWithTheCharactersThemselves) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const std::vector<std::string> labels{"\u5E8A", "\u524D", "\u660E", "\u6708", "\u5149", "\n", " ", "<"};
  const auto T = static_cast<int64_t>(labels.size());
  const std::string svg = dir.file("attention.svg");
  plot_attention({{0, 0, causal_softmax(T, 5)}, {0, 1, causal_softmax(T, 6)}}, labels, svg,
                 "\u5E8A\u524D\u660E\u6708\u5149 | tang");
  const std::string text = read_text(svg);
  // Every token labels a query row and a key column in each of the 2 panels.
  for (const std::string token : {"\u5E8A", "\u524D", "\u660E", "\u6708", "\u5149", "\u23CE", "\u2423", "&lt;"}) {
    EXPECT_EQ(occurrences(text, ">" + token + "</text>"), 4u) << token;
  }
  EXPECT_NE(text.find(">\u5E8A\u524D\u660E\u6708\u5149 | tang</text>"), std::string::npos);
  EXPECT_NE(text.find(">layer 0 head 1</text>"), std::string::npos);
  EXPECT_NE(text.find("<image"), std::string::npos);  // the heatmaps, as pixels
}

TEST(AttentionPlot, LongSequenceIsPooledAndStaysCausal) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const int64_t T = 600;
  std::vector<std::string> labels(T, "a");
  AttentionLayout layout;
  const Figure fig = draw_attention({{2, 3, causal_softmax(T, 1)}}, labels, "long", &layout);
  fig.save(dir.file("long.png"));
  const Image image = fig.render();
  const PixelRect r = layout.heatmaps.at(0);
  ASSERT_LT(r.w, T);
  for (int py = 0; py < r.h; ++py) {
    const int64_t last_query = std::max<int64_t>(py * T / r.h + 1, (py + 1) * T / r.h) - 1;
    for (int px = 0; px < r.w; ++px) {
      if (px * T / r.w > last_query) {
        ASSERT_EQ(image.at(r.x + px, r.y + py), fig.background()) << px << "," << py;
      }
      if (px == 0) {
        ASSERT_NE(image.at(r.x + px, r.y + py), fig.background()) << "key 0 is never masked, row " << py;
      }
    }
  }
}

TEST(AttentionPlot, LayersAreRowsAndHeadsAreColumns) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const int64_t T = 24;
  std::vector<AttentionPanel> panels;
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t head = 0; head < 3; ++head) panels.push_back({layer, head, causal_softmax(T, 10 * layer + head)});
  }
  AttentionLayout layout;
  const Figure fig = draw_attention(panels, labels_of("First Citizen:\nBefore we"), "grid", &layout);
  fig.save(dir.file("grid.png"));
  const std::vector<PixelRect>& rects = layout.heatmaps;
  EXPECT_EQ(rects[0].y, rects[2].y);  // same layer, same row
  EXPECT_LT(rects[0].x, rects[1].x);
  EXPECT_LT(rects[1].x, rects[2].x);
  EXPECT_GT(rects[3].y, rects[0].y + rects[0].h);  // next layer below
  EXPECT_EQ(rects[3].x, rects[0].x);
  EXPECT_LE(rects[2].x + rects[2].w, fig.width());
  EXPECT_LE(rects[5].y + rects[5].h, fig.height());
}

TEST(AttentionPlot, OneLayersHeadsWrapIntoRowsOfAtMostFour) {
  SKIP_WITHOUT_PLOTS();
  ScratchDir dir;
  const int64_t T = 64;
  std::vector<AttentionPanel> panels;
  for (int64_t head = 0; head < 6; ++head) panels.push_back({3, head, causal_softmax(T, head)});
  AttentionLayout layout;
  const Figure fig = draw_attention(panels, std::vector<std::string>(T, "\xE6\x98\xA5"), "layer 3", &layout);
  fig.save(dir.file("heads.png"));
  const std::vector<PixelRect>& rects = layout.heatmaps;
  EXPECT_EQ(rects[0].y, rects[2].y);
  EXPECT_GT(rects[3].y, rects[2].y);  // 6 heads: two rows of three
  EXPECT_EQ(rects[3].x, rects[0].x);
}

TEST(AttentionPlot, BadPanelsAreRejectedClearly) {
  const auto labels = labels_of("abc");
  EXPECT_NE(error_of([&] { draw_attention({}, labels, "t"); }).find("no attention panels"), std::string::npos);
  EXPECT_NE(error_of([&] { draw_attention({{1, 2, torch::zeros({3, 4})}}, labels, "t"); })
                .find("[viz] attention panel layer 1 head 2 has shape [3, 4]; expected [3, 3]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { draw_attention({{0, 0, torch::eye(3)}, {0, 0, torch::eye(3)}}, labels, "t"); })
                .find("appears twice"),
            std::string::npos);
}

TEST(AttentionPlot, AxisLabelsShowTheTokenWithVisibleWhitespace) {
  EXPECT_EQ(attention_axis_label("a"), "a");
  EXPECT_EQ(attention_axis_label("\xE6\x98\xA5"), "\xE6\x98\xA5");  // a CJK character as itself
  EXPECT_EQ(attention_axis_label(" "), "\u2423");
  EXPECT_EQ(attention_axis_label("\n"), "\u23CE");
  EXPECT_EQ(attention_axis_label("\t"), "\u21E5");
  EXPECT_EQ(attention_axis_label("\x01"), "\u2401");
  EXPECT_EQ(attention_axis_label("\x1f"), "\u241F");
  EXPECT_EQ(attention_axis_label("\x7f"), "\u2421");
  EXPECT_EQ(attention_axis_label(""), "\u2205");
}

TEST(AttentionCsv, RowsSumToOnePerQuery) {
  ScratchDir dir;
  const int64_t T = 9;
  const std::vector<AttentionPanel> panels{{0, 0, causal_softmax(T, 3)}, {1, 2, causal_softmax(T, 4)}};
  const auto labels = labels_of("ab\n,\"d ef");
  const std::string path = dir.file("attention.csv");
  write_attention_csv(panels, labels, path);

  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, kAttentionCsvHeader);
  std::map<std::tuple<int, int, int>, double> sums;
  size_t rows = 0;
  while (std::getline(in, line)) {
    ++rows;
    // layer,head,query,key,"q","k",weight: tokens are quoted and may hold commas, so split around them.
    int layer = 0, head = 0, query = 0, key = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%d,%d,%d,%d,", &layer, &head, &query, &key), 4) << line;
    ASSERT_LE(key, query) << line;
    sums[{layer, head, query}] += std::stod(line.substr(line.rfind(',') + 1));
    if (query == 2 && key == 2) {
      EXPECT_NE(line.find(",\"\\n\",\"\\n\","), std::string::npos) << line;
    }
    if (query == 4 && key == 4) {
      EXPECT_NE(line.find(",\"\"\"\",\"\"\"\","), std::string::npos) << line;
    }
  }
  EXPECT_EQ(rows, 2u * T * (T + 1) / 2);
  ASSERT_EQ(sums.size(), 2u * T);
  for (const auto& [key, sum] : sums) EXPECT_NEAR(sum, 1.0, 1e-5);
}
