// Logger set-up (see logger.h).
#include "train/logger.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace nanogpt::train {

std::shared_ptr<spdlog::logger> make_logger(const std::string& log_path, bool quiet) {
  std::vector<spdlog::sink_ptr> sinks;
  if (!quiet) {
    auto console = std::make_shared<spdlog::sinks::stdout_sink_mt>();
    console->set_pattern("%v");
    sinks.push_back(console);
  }
  if (!log_path.empty()) {
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_path, /*truncate=*/false);
    file->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %v");
    sinks.push_back(file);
  }
  auto logger = std::make_shared<spdlog::logger>("nanogpt", sinks.begin(), sinks.end());
  logger->flush_on(spdlog::level::info);
  return logger;
}

}  // namespace nanogpt::train
