// Tests for viz/: PNGs decode (with stb_image, independently of our writer) at the expected size;
// heatmaps keep masked (future) keys blank; metrics.csv parsing accepts real logs and names the
// line of a bad one; the attention CSV carries the weights exactly enough to sum to 1 per query.
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
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "viz/attention_csv.h"
#include "viz/attention_plot.h"
#include "viz/axis_ticks.h"
#include "viz/canvas.h"
#include "viz/colormap.h"
#include "viz/font.h"
#include "viz/loss_plot.h"
#include "io/metrics_csv.h"

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <stb_image.h>
#pragma GCC diagnostic pop

namespace fs = std::filesystem;
using namespace nanogpt::viz;
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

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  Rgb at(int x, int y) const {
    const size_t i = (static_cast<size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
  size_t count(Rgb c) const {
    size_t n = 0;
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) n += at(x, y) == c;
    }
    return n;
  }
  size_t distinct_colours() const {
    std::map<uint32_t, int> seen;
    for (size_t i = 0; i < rgb.size(); i += 3) seen[rgb[i] << 16 | rgb[i + 1] << 8 | rgb[i + 2]] = 1;
    return seen.size();
  }
};

Image decode_png(const std::string& path) {
  int w = 0, h = 0, channels = 0;
  unsigned char* data = stbi_load(path.c_str(), &w, &h, &channels, 3);
  if (data == nullptr) throw std::runtime_error("stb_image cannot decode '" + path + "': " + stbi_failure_reason());
  Image image{w, h, std::vector<uint8_t>(data, data + static_cast<size_t>(w) * h * 3)};
  stbi_image_free(data);
  return image;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
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

TEST(Font, EveryPrintableGlyphHasInkExceptSpace) {
  for (char c = ' '; c <= '~'; ++c) {
    const uint8_t* rows = glyph_rows(c);
    int ink = 0;
    for (int r = 0; r < kGlyphHeight; ++r) ink += rows[r] != 0;
    EXPECT_EQ(ink == 0, c == ' ') << "glyph '" << c << "'";
  }
  EXPECT_EQ(text_width("abc", 2), (3 * kGlyphAdvance - 1) * 2);
  EXPECT_EQ(to_drawable("a\xE4\xB8\xADz"), "a?z");  // one '?' per non-ASCII code point
}

TEST(Canvas, PngRoundTripsThroughStbImage) {
  ScratchDir dir;
  Canvas canvas(37, 21, {10, 20, 30});
  canvas.fill_rect(3, 4, 10, 5, {200, 0, 0});
  canvas.draw_line(0, 0, 36.5, 20.5, {0, 255, 0}, 2.0);
  canvas.draw_text(1, 12, "Hi", kWhite);
  const std::string path = dir.file("canvas.png");
  canvas.save_png(path);
  const Image image = decode_png(path);
  ASSERT_EQ(image.width, 37);
  ASSERT_EQ(image.height, 21);
  EXPECT_EQ(image.rgb, canvas.rgb());
  EXPECT_EQ(image.at(5, 6), (Rgb{200, 0, 0}));
  EXPECT_GT(image.distinct_colours(), 3u);
}

TEST(Canvas, UnwritablePathNamesItAndLeavesNoTempFile) {
  ScratchDir dir;
  const std::string path = dir.file("missing_dir/plot.png");
  const std::string error = error_of([&] { Canvas(4, 4).save_png(path); });
  EXPECT_NE(error.find("[viz] cannot write '" + path + "'"), std::string::npos) << error;
  EXPECT_NE(error.find("No such file or directory"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(fs::path(dir.file("missing_dir"))));
}

TEST(Canvas, AbsurdCoordinatesAreCheapAndHarmless) {
  Canvas canvas(16, 16);
  canvas.draw_line(-1e12, 3, 1e12, 3.5, kBlack, 1);
  canvas.draw_line(std::nan(""), 0, 5, 5, kBlack, 1);
  canvas.fill_circle(8, 8, 1e9, kBlack);
  canvas.draw_polyline({{-1e15, -1e15}, {8, 8}, {1e15, 1e15}}, kBlack, 2);
  EXPECT_EQ(canvas.pixel(0, 3), kBlack);
  EXPECT_EQ(canvas.pixel(15, 0), kBlack);
}

TEST(Canvas, ClipConfinesDrawing) {
  Canvas canvas(20, 20);
  canvas.set_clip(5, 5, 10, 10);
  canvas.fill_rect(0, 0, 20, 20, kBlack);
  canvas.draw_line(0, 0, 20, 20, kBlack, 3);
  EXPECT_EQ(canvas.pixel(4, 4), kWhite);
  EXPECT_EQ(canvas.pixel(15, 15), kWhite);
  EXPECT_EQ(canvas.pixel(5, 5), kBlack);
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

TEST(LossPlot, SyntheticRunDecodesWithCurvesAndLegend) {
  ScratchDir dir;
  const std::string csv = dir.file("metrics.csv"), png = dir.file("loss.png");
  write_text(csv, synthetic_metrics(3000));
  plot_loss_curves(csv, png);
  const Image image = decode_png(png);
  ASSERT_EQ(image.width, kLossPlotWidth);
  ASSERT_EQ(image.height, kLossPlotHeight);
  EXPECT_GT(image.distinct_colours(), 20u);
  EXPECT_LT(image.count(kWhite), static_cast<size_t>(image.width) * image.height * 95 / 100);
  EXPECT_GT(image.count({31, 119, 180}), 200u);  // smoothed train curve (partly under train_eval)
  EXPECT_GT(image.count({224, 90, 20}), 100u);   // val line and markers
  EXPECT_GT(image.count({44, 160, 44}), 100u);   // train_eval line and markers
  EXPECT_FALSE(fs::exists(png + ".tmp." + std::to_string(::getpid())));
}

TEST(LossPlot, FirstEvaluationAloneStillDraws) {
  ScratchDir dir;
  const std::string csv = dir.file("metrics.csv"), png = dir.file("loss.png");
  write_text(csv, std::string(kMetricsHeader) + "\n0,train_eval,4.19,,,\n0,val,4.2,,,\n");
  plot_loss_curves(csv, png);
  EXPECT_GT(decode_png(png).count({224, 90, 20}), 20u);
}

TEST(LossPlot, NothingToPlotIsAnError) {
  ScratchDir dir;
  const std::string csv = dir.file("metrics.csv");
  write_text(csv, std::string(kMetricsHeader) + "\n5,train,nan,,,\n");
  EXPECT_NE(error_of([&] { plot_loss_curves(csv, dir.file("loss.png")); }).find("no finite losses"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("loss.png")));
}

TEST(AttentionPlot, MaskedCellsAreBackgroundAndOthersShowTheirWeight) {
  ScratchDir dir;
  const int64_t T = 7;
  // Lower triangle with known weights, including exact zeros on and below the diagonal.
  auto w = torch::zeros({T, T});
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = 0; j <= i; ++j) w[i][j] = (i + j) % 3 == 0 ? 0.0 : (j + 1.0) / (i + 1.0);
  }
  const std::vector<AttentionPanel> panels{{0, 0, w}, {0, 1, w.clone()}};
  const std::vector<std::string> labels{"T", "o", " ", "b", "e", "\n", "\xE4\xB8\xAD"};
  std::vector<PixelRect> rects;
  const Canvas canvas = draw_attention(panels, labels, "causal test", &rects);
  const std::string png = dir.file("attention.png");
  canvas.save_png(png);
  const Image image = decode_png(png);
  ASSERT_EQ(image.width, canvas.width());
  ASSERT_EQ(rects.size(), 2u);
  for (const PixelRect& r : rects) {
    ASSERT_EQ(r.w % T, 0);
    const int cell = r.w / static_cast<int>(T);
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < T; ++j) {
        const Rgb expected = j > i ? canvas.background() : viridis(w[i][j].item<double>());
        for (int y = r.y + i * cell; y < r.y + (i + 1) * cell; ++y) {
          for (int x = r.x + j * cell; x < r.x + (j + 1) * cell; ++x) {
            ASSERT_EQ(image.at(x, y), expected) << "query " << i << " key " << j << " pixel " << x << "," << y;
          }
        }
      }
    }
  }
}

TEST(AttentionPlot, LongSequenceIsPooledAndStaysCausal) {
  ScratchDir dir;
  const int64_t T = 600;
  std::vector<std::string> labels(T, "a");
  std::vector<PixelRect> rects;
  const Canvas canvas = draw_attention({{2, 3, causal_softmax(T, 1)}}, labels, "long", &rects);
  canvas.save_png(dir.file("long.png"));
  const PixelRect r = rects.at(0);
  ASSERT_LT(r.w, T);
  for (int py = 0; py < r.h; ++py) {
    const int64_t last_query = std::max<int64_t>(py * T / r.h + 1, (py + 1) * T / r.h) - 1;
    for (int px = 0; px < r.w; ++px) {
      if (px * T / r.w > last_query) {
        ASSERT_EQ(canvas.pixel(r.x + px, r.y + py), canvas.background()) << px << "," << py;
      }
      if (px == 0) {
        ASSERT_NE(canvas.pixel(r.x + px, r.y + py), canvas.background()) << "key 0 is never masked, row " << py;
      }
    }
  }
}

TEST(AttentionPlot, LayersAreRowsAndHeadsAreColumns) {
  ScratchDir dir;
  const int64_t T = 24;
  std::vector<AttentionPanel> panels;
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t head = 0; head < 3; ++head) panels.push_back({layer, head, causal_softmax(T, 10 * layer + head)});
  }
  std::vector<PixelRect> rects;
  const Canvas canvas = draw_attention(panels, labels_of("First Citizen:\nBefore we"), "grid", &rects);
  canvas.save_png(dir.file("grid.png"));
  EXPECT_EQ(rects[0].y, rects[2].y);  // same layer, same row
  EXPECT_LT(rects[0].x, rects[1].x);
  EXPECT_LT(rects[1].x, rects[2].x);
  EXPECT_GT(rects[3].y, rects[0].y + rects[0].h);  // next layer below
  EXPECT_EQ(rects[3].x, rects[0].x);
  EXPECT_LE(rects[2].x + rects[2].w, canvas.width());
  EXPECT_LE(rects[5].y + rects[5].h, canvas.height());
}

TEST(AttentionPlot, OneLayersHeadsWrapIntoRowsOfAtMostFour) {
  ScratchDir dir;
  const int64_t T = 64;
  std::vector<AttentionPanel> panels;
  for (int64_t head = 0; head < 6; ++head) panels.push_back({3, head, causal_softmax(T, head)});
  std::vector<PixelRect> rects;
  const Canvas canvas = draw_attention(panels, std::vector<std::string>(T, "\xE6\x98\xA5"), "layer 3", &rects);
  canvas.save_png(dir.file("heads.png"));
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

TEST(AttentionPlot, AxisLabelsAreAsciiOrPositions) {
  EXPECT_EQ(attention_axis_label("a", 0), "a");
  EXPECT_EQ(attention_axis_label("\n", 1), "\\n");
  EXPECT_EQ(attention_axis_label(" ", 2), std::string(1, kVisibleSpace));
  EXPECT_EQ(attention_axis_label("\xE6\x98\xA5", 13), "13");  // a CJK character: the font is ASCII
  EXPECT_EQ(attention_axis_label("\x01", 4), "4");
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
