// `nanogpt attention` end to end on a tiny Chinese model: the heatmaps label their axes with the
// characters themselves (checked in the SVG's text), and the explorer page, opened in headless
// Chromium at a URL selecting a token, shades the text with that token's weights from the CSV.
// The browser part skips, saying why, where Chromium is not installed (scripts/setup.sh --tests installs it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <tuple>

#include "shell.h"
#include "train_fixture.h"
#include "viz/figure.h"

using namespace nanogpt::testing;
namespace fs = std::filesystem;

namespace {

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The first browser found on PATH, or "".
std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    if (shell(std::string("command -v ") + name + " >/dev/null 2>&1") == 0) return name;
  }
  return "";
}

// (layer, head, query, key) -> weight, from the attention CSV.
std::map<std::tuple<int, int, int, int>, double> read_weights(const std::string& csv) {
  std::map<std::tuple<int, int, int, int>, double> weights;
  std::istringstream in(read_text(csv));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    int layer = 0, head = 0, query = 0, key = 0;
    if (std::sscanf(line.c_str(), "%d,%d,%d,%d,", &layer, &head, &query, &key) == 4) {
      weights[{layer, head, query, key}] = std::stod(line.substr(line.rfind(',') + 1));
    }
  }
  return weights;
}

struct Token {
  int pos = -1;
  double weight = -1;
  double alpha = 0;  // the background's opacity; 0 when unshaded
  std::string cls;
};

// The token spans of the page's main text view, from Chromium's serialised DOM.
std::vector<Token> text_tokens(const std::string& dom) {
  const size_t begin = dom.find("id=\"text\"");
  const size_t end = dom.find("</div>", begin);
  std::vector<Token> tokens;
  if (begin == std::string::npos) return tokens;
  const std::string text = dom.substr(begin, end - begin);
  const std::regex span("<span ([^>]*)>"), cls("class=\"([^\"]*)\""), pos("data-pos=\"(\\d+)\""),
      weight("data-weight=\"([0-9.]+)\""), rgba("background-color: rgba?\\((\\d+), (\\d+), (\\d+)(?:, ([0-9.]+))?\\)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), span); it != std::sregex_iterator(); ++it) {
    const std::string attributes = (*it)[1];
    std::smatch m;
    Token t;
    if (std::regex_search(attributes, m, cls)) t.cls = m[1];
    if (t.cls.rfind("tok", 0) != 0) continue;
    if (std::regex_search(attributes, m, pos)) t.pos = std::stoi(m[1]);
    if (std::regex_search(attributes, m, weight)) t.weight = std::stod(m[1]);
    if (std::regex_search(attributes, m, rgba)) t.alpha = m[4].matched ? std::stod(m[4]) : 1.0;
    tokens.push_back(t);
  }
  return tokens;
}

class AttentionCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!NANOGPT_PLOTS) return;
    dir_ = new TempDir("cli_attention");
    const std::string d = dir_->path;
    auto c = tiny_config_on(d, tang_poems_head(30000));
    c.max_iters = 10;
    std::ofstream(d + "/zh.yaml") << nanogpt::train::to_yaml(c);
    train_rc_ = shell(std::string(NANOGPT_BINARY) + " train " + d + "/zh.yaml >" + d + "/train.out 2>&1");
    // 秦川雄帝宅，⏎岩廊: 9 tokens, a newline among them; the model's block_size (16) leaves 7 to sample.
    std::ofstream(d + "/prompt.txt", std::ios::binary) << "\u79E6\u5DDD\u96C4\u5E1D\u5B85\uFF0C\n\u5CA9\u5ECA";
    attention_rc_ = shell(std::string(NANOGPT_BINARY) + " attention --device=cpu --out_dir=" + d + "/out --start=FILE:" + d +
                          "/prompt.txt --out=" + d + "/attn.svg --csv=" + d + "/attn.csv --html=" + d +
                          "/explore.html --new_tokens=20 >" + d + "/attention.out 2>&1");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!NANOGPT_PLOTS) GTEST_SKIP() << "built with -DNANOGPT_PLOTS=OFF: `attention` cannot draw its heatmaps";
    ASSERT_EQ(train_rc_, 0) << read_text(dir_->path + "/train.out");
    ASSERT_EQ(attention_rc_, 0) << read_text(dir_->path + "/attention.out");
  }
  static std::string path(const std::string& name) { return dir_->path + "/" + name; }

  static TempDir* dir_;
  static int train_rc_, attention_rc_;
};

TempDir* AttentionCli::dir_ = nullptr;
int AttentionCli::train_rc_ = -1;
int AttentionCli::attention_rc_ = -1;

}  // namespace

TEST_F(AttentionCli, SvgHeatmapsLabelTheAxesWithTheCharacters) {
  const std::string svg = read_text(path("attn.svg"));
  // 2 layers x 2 heads, each labelling a query row and a key column with every token.
  EXPECT_EQ(occurrences(svg, ">\u79E6</text>"), 8u);
  EXPECT_EQ(occurrences(svg, ">\u5B85</text>"), 8u);
  EXPECT_EQ(occurrences(svg, ">\u23CE</text>"), 8u);  // the newline, made visible
  EXPECT_NE(read_text(path("attention.out")).find("7 sampled tokens"), std::string::npos)
      << read_text(path("attention.out"));
}

TEST_F(AttentionCli, ExplorerIsOneSelfContainedFile) {
  const std::string html = read_text(path("explore.html"));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("NANOGPT_ATTENTION_DATA"), std::string::npos);  // the marker was replaced
  EXPECT_NE(html.find("\"\u79E6\",\"\u5DDD\""), std::string::npos);   // the tokens, as JSON
}

TEST_F(AttentionCli, SelectingATokenInChromiumShadesTheTextWithItsWeights) {
  const std::string browser = find_chromium();
  if (browser.empty()) GTEST_SKIP() << "no chromium on PATH (scripts/setup.sh --tests installs it): browser check skipped";
  const auto csv = read_weights(path("attn.csv"));
  const std::string flags = " --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir=" +
                            path("chromium-profile") + " ";
  const std::string page = "file://" + fs::absolute(path("explore.html")).string();

  for (const auto& [layer, head, query] : {std::tuple{1, 1, 4}, std::tuple{0, 0, 8}, std::tuple{1, 0, 0}}) {
    SCOPED_TRACE("layer " + std::to_string(layer) + " head " + std::to_string(head) + " query " + std::to_string(query));
    const std::string hash = "#layer=" + std::to_string(layer) + "&head=" + std::to_string(head) +
                             "&query=" + std::to_string(query);
    ASSERT_EQ(shell(browser + flags + "--dump-dom '" + page + hash + "' >" + path("dom.html") + " 2>/dev/null"), 0);
    const std::vector<Token> tokens = text_tokens(read_text(path("dom.html")));
    ASSERT_EQ(tokens.size(), 9u) << "the prompt's tokens";
    double peak = 0;
    for (int key = 0; key <= query; ++key) peak = std::max(peak, csv.at({layer, head, query, key}));
    for (const Token& t : tokens) {
      if (t.pos > query) {
        EXPECT_EQ(t.alpha, 0) << "a future key is not shaded: " << t.pos;
        EXPECT_NE(t.cls.find("future"), std::string::npos);
        continue;
      }
      const double expected = csv.at({layer, head, query, t.pos});
      EXPECT_NEAR(t.weight, expected, 1e-4) << "key " << t.pos;
      // Chromium keeps a colour's alpha in 8 bits and writes the shortest decimal that maps to the
      // same byte (0.942 -> 240/255 -> "0.94"): within one step of 1/255.
      EXPECT_NEAR(t.alpha, expected / peak, 1.0 / 255) << "key " << t.pos;
      EXPECT_EQ(t.cls.find("query") != std::string::npos, t.pos == query) << t.cls;
    }
  }

  // Stepping into the sampled continuation shows it, marked as generated.
  ASSERT_EQ(shell(browser + flags + "--dump-dom '" + page + "#layer=0&head=1&step=14' >" + path("dom.html") +
                  " 2>/dev/null"),
            0);
  const std::vector<Token> stepped = text_tokens(read_text(path("dom.html")));
  ASSERT_EQ(stepped.size(), 14u);
  EXPECT_NE(stepped[13].cls.find("gen"), std::string::npos);
  EXPECT_NE(stepped[13].cls.find("query"), std::string::npos);
  EXPECT_EQ(stepped[8].cls.find("gen"), std::string::npos);

  // A screenshot, kept in the build folder for a look.
  const std::string shot = fs::path(NANOGPT_BINARY).parent_path() / "test_artifacts" / "attention_explorer.png";
  fs::create_directories(fs::path(shot).parent_path());
  fs::remove(shot);
  ASSERT_EQ(shell(browser + flags + "--window-size=1200,700 --screenshot=" + shot + " '" + page +
                  "#layer=1&head=0&query=6&step=12' >/dev/null 2>&1"),
            0);
  const nanogpt::viz::Image image = nanogpt::viz::read_png(shot);
  EXPECT_EQ(image.width, 1200);
  EXPECT_EQ(image.height, 700);
}
