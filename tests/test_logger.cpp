// Tests for train/logger: on a terminal the [train] lines become one progress line rewritten in
// place, with other lines printed above it; elsewhere the console and train.log both get every
// logged step as a plain line.
#include <gtest/gtest.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "train/logger.h"

namespace fs = std::filesystem;
using namespace nanogpt::train;

namespace {

// What a console sink wrote to its file, read back.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  return out;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

StepStats step(int64_t iter) {
  StepStats s;
  s.iter = iter;
  s.max_iters = 100;
  s.loss = 2.5;
  s.lr = 1e-3;
  s.ms = 40;
  s.tokens_per_sec = 18600;
  s.mfu = 0.031;
  s.run_seconds = 0.5 * (iter + 1);
  s.run_steps = iter + 1;
  return s;
}

// Logs what a short run logs: an eval line, 3 steps, a checkpoint line, 2 steps, the summary.
void log_run(spdlog::logger& log) {
  log.info("[eval] iter 0 | train 4.1700 | val 4.1800");
  for (int64_t i = 0; i < 3; ++i) log_step(log, step(i));
  log.info("[ckpt] saved out/ckpt_last.safetensors (iter 3)");
  for (int64_t i = 3; i < 5; ++i) log_step(log, step(i));
  log.info("[train] done at iter 5");
}

class Scratch {
 public:
  Scratch() : dir_(fs::temp_directory_path() / ("nanogpt_test_logger_" + std::to_string(::getpid()))) {
    fs::create_directories(dir_);
  }
  ~Scratch() { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(Logger, StepAndProgressLinesReadAsDocumented) {
  EXPECT_EQ(step_line(step(250)), "[train] iter 250 | loss 2.5000 | lr 1.00e-03 | 40.0 ms | 18.6k tok/s | mfu 3.1%");
  StepStats s = step(249);
  s.max_iters = 2000;
  s.run_seconds = 25;  // 0.1 s per step, 1750 steps left
  s.run_steps = 250;
  EXPECT_EQ(progress_line(s), "iter 250/2000 | loss 2.5000 | lr 1.00e-03 | 18.6k tok/s | ETA 2m55s");
  EXPECT_EQ(human_duration(42.4), "42s");
  EXPECT_EQ(human_duration(7380), "2h03m");
  EXPECT_EQ(human_duration(std::nan("")), "?");
  EXPECT_EQ(human(950), "950");
  EXPECT_EQ(human(1.25e6), "1.25M");
}

TEST(Logger, NotATerminalPrintsEveryLoggedStepAsAPlainLine) {
  Scratch scratch;
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  {
    auto console = std::make_shared<ConsoleSink>(out, /*interactive=*/false);
    spdlog::logger log("test", console);
    log_run(log);
  }
  const std::string text = contents(out);
  std::fclose(out);
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(count(text, "[train] iter "), 5u) << text;
  EXPECT_NE(text.find("[eval] iter 0 | train 4.1700 | val 4.1800\n[train] iter 0 | loss 2.5000"), std::string::npos)
      << text;
  EXPECT_NE(text.find("[train] iter 2 | loss 2.5000 | lr 1.00e-03 | 40.0 ms | 18.6k tok/s | mfu 3.1%\n[ckpt] saved"),
            std::string::npos)
      << text;
}

TEST(Logger, TerminalShowsOneProgressLineWithOtherLinesAboveIt) {
  Scratch scratch;
  const std::string log_path = scratch.file("train.log");
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  {
    auto console = std::make_shared<ConsoleSink>(out, /*interactive=*/true, /*columns=*/200);
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_path);
    spdlog::logger log("test", {console, file});
    log_run(log);
  }
  const std::string text = contents(out);
  std::fclose(out);
  // The console: no [train] iter lines, a progress line rewritten in place (\r, erase line).
  EXPECT_EQ(count(text, "[train] iter "), 0u) << text;
  EXPECT_EQ(count(text, "\r\033[Kiter "), 5u) << text;  // one per step
  EXPECT_EQ(count(text, "\niter "), 2u) << text;         // redrawn under [ckpt] and [train] done
  // The checkpoint line clears the progress line, takes its place, and the progress line returns below.
  EXPECT_NE(text.find("\r\033[Kiter 3/100 | loss 2.5000 | lr 1.00e-03 | 18.6k tok/s | ETA 49s\r\033[K[ckpt] saved "
                      "out/ckpt_last.safetensors (iter 3)\niter 3/100"),
            std::string::npos)
      << text;
  // Closing the sink (the end of a run) erases the progress line.
  EXPECT_EQ(text.substr(text.size() - 4), "\r\033[K") << text;
  // train.log still gets every logged step.
  const std::string log_text = read_text(log_path);
  EXPECT_EQ(count(log_text, "[train] iter "), 5u) << log_text;
  EXPECT_NE(log_text.find("[train] iter 4 | loss 2.5000 | lr 1.00e-03 | 40.0 ms | 18.6k tok/s | mfu 3.1%"),
            std::string::npos)
      << log_text;
  EXPECT_NE(log_text.find("[ckpt] saved"), std::string::npos);
}

TEST(Logger, ProgressLineIsCutToTheTerminalWidth) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  {
    ConsoleSink console(out, /*interactive=*/true, /*columns=*/20);
    console.set_progress("iter 1/100 | loss 2.5000 | lr 1.00e-03");
  }
  const std::string text = contents(out);
  std::fclose(out);
  EXPECT_EQ(text, "\r\033[Kiter 1/100 | loss 2\r\033[K");  // 19 columns: a full line would wrap
}
