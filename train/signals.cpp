// Stop signals (see signals.h).
#include "train/signals.h"

#include <csignal>

namespace nanogpt::train {
namespace {
volatile std::sig_atomic_t g_received = 0;
volatile std::sig_atomic_t g_repeat_kills = 1;
struct sigaction g_old_int, g_old_term;

extern "C" void on_stop_signal(int sig) {
  if (g_received != 0) {  // second signal: stop now (unless a launcher repeats the first)
    if (!g_repeat_kills) return;
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_received = sig;
}
}  // namespace

StopSignals::StopSignals(bool repeat_kills) {
  g_received = 0;
  g_repeat_kills = repeat_kills ? 1 : 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &g_old_int);
  sigaction(SIGTERM, &action, &g_old_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int StopSignals::received() { return g_received; }

}  // namespace nanogpt::train
