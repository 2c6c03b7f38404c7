// One logger for a training run (Marian's way): stable, greppable lines tagged [train], [eval],
// [ckpt], [data], written to out_dir/train.log and to the console. On a terminal the console keeps
// one progress line at the bottom (iteration/max, loss, lr, tok/s, ETA), rewritten in place, with
// the other lines printed above it; elsewhere (a log file, a pipe, CI) it prints the [train] lines.
#pragma once

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

namespace nanogpt::train {

/// The console half of the log. Interactive: a progress line stays at the bottom, and each message
/// clears it, prints, and redraws it. Not interactive: each message is a plain line.
class ConsoleSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  /// `interactive`: keep a progress line (make_logger passes isatty(stdout)). `columns`: the width
  /// the progress line is cut to; 0 asks the terminal (80 when it does not say).
  ConsoleSink(std::FILE* out, bool interactive, int columns = 0);
  /// Clears the progress line, so that what is printed next starts on a clean line.
  ~ConsoleSink() override;
  bool interactive() const { return interactive_; }
  /// Shows `line` as the progress line (interactive only; ignored otherwise).
  void set_progress(const std::string& line);

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override;

 private:
  void clear_progress();
  std::FILE* out_;
  bool interactive_;
  int columns_;
  std::string progress_;  // what the bottom line shows now; empty: none
};

/// Console + file logger. `log_path` empty: console only. `quiet`: file only.
std::shared_ptr<spdlog::logger> make_logger(const std::string& log_path, bool quiet = false);

/// One logged training step.
struct StepStats {
  int64_t iter = 0;       // the step just taken (0-based)
  int64_t max_iters = 0;
  double loss = 0;
  double lr = 0;
  double ms = 0;          // this step's wall time
  double tokens_per_sec = 0;
  double mfu = 0;         // model FLOPs utilisation, a fraction of the measured peak
  double run_seconds = 0; // wall time of this run so far (evaluations included), for the ETA
  int64_t run_steps = 0;  // steps taken in this run so far
};

/// "[train] iter 250 | loss 1.9123 | lr 9.80e-04 | 41.2 ms | 18.6k tok/s | mfu 3.1%"
std::string step_line(const StepStats& step);
/// "iter 251/2000 | loss 1.9123 | lr 9.80e-04 | 18.6k tok/s | ETA 1m12s"
std::string progress_line(const StepStats& step);
/// 18.6k, 1.25M, 950.
std::string human(double x);
/// 42s, 1m12s, 2h03m; "?" when unknown.
std::string human_duration(double seconds);

/// Logs a training step: step_line() to every sink except an interactive console, which shows
/// progress_line() in place instead.
void log_step(spdlog::logger& log, const StepStats& step);

}  // namespace nanogpt::train
