// Stop signals (see signals.h).
#include "train/signals.h"

#include <csignal>

namespace nanogpt::train {
namespace {
volatile std::sig_atomic_t g_received = 0;
struct sigaction g_old_int, g_old_term;

extern "C" void on_stop_signal(int sig) {
  if (g_received != 0) {  // second signal: stop now
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_received = sig;
}
}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
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
