// One logger for a training run (Marian's way): stable, greppable lines tagged [train], [eval],
// [ckpt], [data], written to stdout and to out_dir/train.log.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace nanogpt::train {

/// Console + file logger. `log_path` empty: console only. `quiet`: file only.
std::shared_ptr<spdlog::logger> make_logger(const std::string& log_path, bool quiet = false);

}  // namespace nanogpt::train
