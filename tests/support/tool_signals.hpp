// The signals a program the tests start obeys: SIGUSR1 asks for its one action (a fenced
// write, a report of what it holds), SIGTERM and SIGINT for its end.
//
//   distlock::testing::obey_tool_signals();
//   while (!distlock::testing::g_stop_signal) {
//     if (distlock::testing::g_usr1_signal.exchange(false)) do_the_action();
//     ...
//   }
//
// Thread-safety: the flags are atomics, set from the signal handler and read by any thread.
#pragma once

#include <signal.h>

#include <atomic>

#include "support/tool_flags.hpp"

namespace distlock::testing {

/// Set when SIGUSR1 arrives; the program clears it when it has done its action.
inline std::atomic<bool> g_usr1_signal{false};
/// Set when SIGTERM or SIGINT arrives.
inline std::atomic<bool> g_stop_signal{false};

inline void on_tool_signal(int sig) {
  if (sig == SIGUSR1) {
    g_usr1_signal = true;
  } else {
    g_stop_signal = true;
  }
}

/// Installs on_tool_signal for SIGUSR1, SIGTERM and SIGINT.
inline void obey_tool_signals() {
  on_signals(on_tool_signal, {SIGUSR1, SIGTERM, SIGINT});
}

}  // namespace distlock::testing
