// Ctrl-C / SIGTERM during training: the first signal asks the loop to finish its step, save a
// checkpoint and stop (exit 130 / 143); a second one restores the default action and re-raises,
// killing at once (the last complete checkpoint is never touched by that). Under torchrun a repeat is
// ignored: its agent forwards the Ctrl-C the terminal already sent to every process (the first signal
// must still save), and kills what is left itself after its own grace period.
#pragma once

namespace nanogpt::train {

class StopSignals {
 public:
  /// Installs the handlers; `repeat_kills`: a second signal kills at once (off under torchrun).
  explicit StopSignals(bool repeat_kills = true);
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// 0 while running, else the signal number received (SIGINT = 2, SIGTERM = 15).
  static int received();
};

}  // namespace nanogpt::train
