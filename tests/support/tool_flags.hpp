// What the test tools (the small processes that tests start: tests/tools/lock_tool.cpp,
// tests/conformance/primitives_tool.cpp and election_tool.cpp, tests/fencing/fence_holder.cpp)
// share: their command line, their stdout lines and their signal handlers. Header-only: the
// tools link the library alone.
//
//   tool MODE [--flag VALUE | --switch]...
//
// A misuse (no mode, a flag without its value, an unknown flag, a check of the tool's own)
// prints "tool: <why>" on stderr and exits 64, the tools' usage code.
//
// Thread-safety: ToolFlags is for main() alone (it keeps references to the fields it fills);
// say() may be called from any thread (one write(2) a line).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

namespace distlock::testing {

/// Writes `line` and a newline to stdout in one write(2): lines that several threads say
/// never interleave, and a test reading the tool's output sees whole lines.
inline void say(const std::string& line) {
  const std::string l = line + "\n";
  (void)!::write(1, l.data(), l.size());
}

/// Calls `handler` on each of `signals` (sigaction, empty mask, no flags).
inline void on_signals(void (*handler)(int), std::initializer_list<int> signals) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  for (const int s : signals) ::sigaction(s, &sa, nullptr);
}

/// Prints "`tool`: `why`" on stderr and exits 64 (usage).
[[noreturn]] inline void tool_usage(const std::string& tool, const std::string& why) {
  std::fprintf(stderr, "%s: %s\n", tool.c_str(), why.c_str());
  std::exit(64);
}

/// The flags of one tool, each bound to the field it fills. A number that does not parse
/// ends the tool through std::stol's exception, as a tool's own misuse.
class ToolFlags {
 public:
  explicit ToolFlags(std::string tool) : tool_(std::move(tool)) {}

  /// `flag VALUE` stores VALUE in `out`.
  ToolFlags& text(const std::string& flag, std::string& out) {
    flags_[flag] = {[&out](const std::string& v) { out = v; }, true};
    return *this;
  }
  /// `flag N` stores N in `out`.
  ToolFlags& number(const std::string& flag, long& out) {
    flags_[flag] = {[&out](const std::string& v) { out = std::stol(v); }, true};
    return *this;
  }
  ToolFlags& number(const std::string& flag, int& out) {
    flags_[flag] = {[&out](const std::string& v) { out = std::stoi(v); }, true};
    return *this;
  }
  /// `flag` alone sets `out`.
  ToolFlags& on_off(const std::string& flag, bool& out) {
    flags_[flag] = {[&out](const std::string&) { out = true; }, false};
    return *this;
  }

  /// Fills the bound fields from argv[2..] and returns the mode, argv[1]; `modes` lists the
  /// modes for the message when it is missing ("hold|hammer").
  std::string parse(int argc, char** argv, const std::string& modes) const {
    if (argc < 2) usage("missing mode (" + modes + ")");
    for (int i = 2; i < argc; ++i) {
      const std::string k = argv[i];
      const auto it = flags_.find(k);
      if (it == flags_.end()) usage("unknown flag " + k);
      if (!it->second.takes_value) {
        it->second.set("");
        continue;
      }
      if (i + 1 >= argc) usage("missing value for " + k);
      it->second.set(argv[++i]);
    }
    return argv[1];
  }

  [[noreturn]] void usage(const std::string& why) const { tool_usage(tool_, why); }

 private:
  struct Flag {
    std::function<void(const std::string&)> set;
    bool takes_value = true;
  };
  std::string tool_;
  std::map<std::string, Flag> flags_;
};

/// The lock a tool works on and where its history goes: --url, --name, --log FILE and
/// --ttl MS (default 2000).
struct ToolTarget {
  std::string url, name, log;
  long ttl_ms = 2000;
};

inline void add_target_flags(ToolFlags& f, ToolTarget& t) {
  f.text("--url", t.url).text("--name", t.name).text("--log", t.log).number("--ttl", t.ttl_ms);
}

/// The shape of a hammer: --threads T (default 4), --iters I (default 10), --hold-us US
/// inside each critical section (default 0).
struct ToolHammer {
  int threads = 4, iters = 10;
  long hold_us = 0;
};

inline void add_hammer_flags(ToolFlags& f, ToolHammer& h) {
  f.number("--threads", h.threads).number("--iters", h.iters).number("--hold-us", h.hold_us);
}

}  // namespace distlock::testing
