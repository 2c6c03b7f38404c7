// Ctrl-C / SIGTERM during training: the first signal asks the loop to finish its step, save a
// checkpoint and stop (exit 130 / 143); a second one restores the default action and re-raises,
// killing at once (the last complete checkpoint is never touched by that).
#pragma once

namespace nanogpt::train {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// 0 while running, else the signal number received (SIGINT = 2, SIGTERM = 15).
  static int received();
};

}  // namespace nanogpt::train
