// Logger set-up and the console's progress line (see logger.h).
#include "train/logger.h"

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>

namespace nanogpt::train {
namespace {

constexpr const char* kClearLine = "\r\033[K";  // back to column 0, erase to the end of the line

int terminal_columns(std::FILE* out) {
  winsize size{};
  if (ioctl(fileno(out), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

}  // namespace

ConsoleSink::ConsoleSink(std::FILE* out, bool interactive, int columns)
    : out_(out), interactive_(interactive), columns_(columns > 0 ? columns : interactive ? terminal_columns(out) : 80) {
  set_pattern("%v");
}

ConsoleSink::~ConsoleSink() {
  std::lock_guard<std::mutex> lock(mutex_);
  clear_progress();
  std::fflush(out_);
}

void ConsoleSink::clear_progress() {
  if (!progress_.empty()) std::fputs(kClearLine, out_);
}

void ConsoleSink::set_progress(const std::string& line) {
  if (!interactive_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // One column short of the width: a line that fills the terminal would wrap, and \r would then
  // rewrite only its second half.
  progress_ = line.substr(0, static_cast<size_t>(std::max(columns_ - 1, 1)));
  std::fputs(kClearLine, out_);
  std::fputs(progress_.c_str(), out_);
  std::fflush(out_);
}

void ConsoleSink::sink_it_(const spdlog::details::log_msg& msg) {
  spdlog::memory_buf_t formatted;
  formatter_->format(msg, formatted);
  clear_progress();
  std::fwrite(formatted.data(), 1, formatted.size(), out_);
  if (!progress_.empty()) std::fputs(progress_.c_str(), out_);
  std::fflush(out_);
}

void ConsoleSink::flush_() { std::fflush(out_); }

std::shared_ptr<spdlog::logger> make_logger(const std::string& log_path, bool quiet) {
  std::vector<spdlog::sink_ptr> sinks;
  if (!quiet) sinks.push_back(std::make_shared<ConsoleSink>(stdout, ::isatty(fileno(stdout)) == 1));
  if (!log_path.empty()) {
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_path, /*truncate=*/false);
    file->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %v");
    sinks.push_back(file);
  }
  auto logger = std::make_shared<spdlog::logger>("nanogpt", sinks.begin(), sinks.end());
  logger->flush_on(spdlog::level::info);
  return logger;
}

std::string human(double x) {
  if (x >= 1e6) return fmt::format("{:.2f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f}k", x / 1e3);
  return fmt::format("{:.0f}", x);
}

std::string human_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
}

std::string step_line(const StepStats& step) {
  return fmt::format("[train] iter {} | loss {:.4f} | lr {:.2e} | {:.1f} ms | {} tok/s | mfu {:.1f}%", step.iter,
                     step.loss, step.lr, step.ms, human(step.tokens_per_sec), 100.0 * step.mfu);
}

std::string progress_line(const StepStats& step) {
  const int64_t done = step.iter + 1;
  const double eta = step.run_steps > 0 ? step.run_seconds / static_cast<double>(step.run_steps) *
                                              static_cast<double>(std::max<int64_t>(step.max_iters - done, 0))
                                        : std::nan("");
  return fmt::format("iter {}/{} | loss {:.4f} | lr {:.2e} | {} tok/s | ETA {}", done, step.max_iters, step.loss,
                     step.lr, human(step.tokens_per_sec), human_duration(eta));
}

void log_step(spdlog::logger& log, const StepStats& step) {
  const std::string line = step_line(step);
  const spdlog::details::log_msg msg(log.name(), spdlog::level::info, line);
  for (const spdlog::sink_ptr& sink : log.sinks()) {
    auto* console = dynamic_cast<ConsoleSink*>(sink.get());
    if (console != nullptr && console->interactive()) {
      console->set_progress(progress_line(step));
    } else if (sink->should_log(msg.level)) {
      sink->log(msg);
      sink->flush();
    }
  }
}

}  // namespace nanogpt::train
