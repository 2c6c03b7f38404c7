// What a new user meets first: the help text, one default device for every command, the attention
// explorer without a drawing library, and the program installed under a prefix of one's own.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "shell.h"
#include "train_fixture.h"

using namespace nanogpt::testing;
namespace fs = std::filesystem;

namespace {

// The help line of `option` in `help`, up to the end of its line.
std::string help_line(const std::string& help, const std::string& option) {
  const size_t at = help.find("  " + option + " ");
  if (at == std::string::npos) return "";
  return help.substr(at, help.find('\n', at) - at);
}

}  // namespace

// The --start default is a newline; the help shows it as \n on the option's own line, not as a raw
// line break that splits the line in two.
TEST(CliTraps, SampleHelpShowsTheNewlineDefaultEscaped) {
  TempDir dir("traps_help");
  const Outcome r = run_nanogpt("sample --help", dir.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string line = help_line(r.out, "--start");
  EXPECT_NE(line.find("TEXT=\\n "), std::string::npos) << line;
  EXPECT_NE(line.find("Prompt text"), std::string::npos) << "the description fell off the option's line: " << line;
  const size_t next = r.out.find(line) + line.size() + 1;  // the line after it is the next option's
  EXPECT_EQ(r.out.compare(next, 4, "  --"), 0) << r.out.substr(next, 80);
}

// Every command that runs a model picks its device the same way, the way `train` does by default.
TEST(CliTraps, EveryCommandHasTheSameDefaultDevice) {
  TempDir dir("traps_device");
  const std::string train_default = nanogpt::train::TrainConfig{}.device;
  const std::regex default_value("TEXT=(\\S+)");  // CLI11: `--device TEXT=auto   description`
  for (const std::string command : {"sample", "attention"}) {
    const Outcome r = run_nanogpt(command + " --help", dir.path);
    ASSERT_EQ(r.rc, 0) << command << ": " << r.err;
    const std::string line = help_line(r.out, "--device");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, default_value)) << command << ": " << line;
    EXPECT_EQ(m[1].str(), train_default) << command;
  }
}

// The explorer page and the CSV need no cairo: `attention --html` writes them in any build; without
// a heatmap (--no_heatmap, or a build without plots) no image is written and the command succeeds.
TEST(CliTraps, AttentionWritesTheExplorerWithoutAHeatmap) {
  TempDir dir("traps_html");
  auto c = tiny_config(dir.path);
  c.max_iters = 4;
  std::ofstream(dir.path + "/tiny.yaml") << nanogpt::train::to_yaml(c);
  Outcome r = run_nanogpt("train " + dir.path + "/tiny.yaml", dir.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string common = "attention --out_dir=" + dir.path + "/out --start=First --new_tokens=4 --out=" + dir.path +
                             "/heat.png --csv=" + dir.path + "/heat.csv --html=" + dir.path + "/page.html";
  r = run_nanogpt(common + " --no_heatmap", dir.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir.path + "/heat.png"));
  EXPECT_NE(read_text(dir.path + "/page.html").find("</html>"), std::string::npos);
  EXPECT_NE(read_text(dir.path + "/heat.csv").find('\n'), std::string::npos);
  EXPECT_NE(r.out.find("no heatmap (--no_heatmap)"), std::string::npos) << r.out;
  fs::remove(dir.path + "/page.html");
  // Without the flag: a heatmap where the build can draw, and the page either way.
  r = run_nanogpt(common, dir.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(fs::exists(dir.path + "/heat.png"), static_cast<bool>(NANOGPT_PLOTS));
  EXPECT_NE(read_text(dir.path + "/page.html").find("</html>"), std::string::npos);
  // --no_heatmap alone would write nothing: one error line, before any work.
  r = run_nanogpt("attention --out_dir=" + dir.path + "/out --start=First --no_heatmap", dir.path);
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(r.err.rfind("error: [attention] --no_heatmap", 0), 0u) << r.err;
}

// cmake --install puts the program (and the CUDA plugin, where built) under a prefix; the installed
// program runs from there and names the plugin it would load: the installed one in ../lib.
TEST(CliTraps, InstalledProgramRunsAndFindsItsPlugin) {
  TempDir dir("traps_install");
  const std::string build = fs::path(NANOGPT_BINARY).parent_path().string(), prefix = dir.path + "/prefix";
  Outcome r = shell_captured(std::string("\"") + NANOGPT_CMAKE + "\" --install " + build + " --prefix " + prefix, dir.path);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const std::string program = prefix + "/bin/nanogpt";
  ASSERT_TRUE(fs::exists(program)) << r.out;
  r = shell_captured(program + " --help", dir.path);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("sample"), std::string::npos);
  r = shell_captured(program + " --version", dir.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  if (!fs::exists(build + "/libnanogpt_cuda.so")) {
    EXPECT_FALSE(fs::exists(prefix + "/lib/libnanogpt_cuda.so"));
    GTEST_SKIP() << "a build without the CUDA plugin: nothing more to install";
  }
  const std::string plugin = prefix + "/lib/libnanogpt_cuda.so";
  EXPECT_TRUE(fs::exists(plugin));
  EXPECT_NE(r.out.find("(plugin " + fs::path(plugin).lexically_normal().string() + ")"), std::string::npos) << r.out;
}
