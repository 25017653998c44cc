// Where the lock_tool test program is, and helpers to run it (see tests/tools/lock_tool.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/process.hpp"

namespace distlock::testing {

/// Absolute path of the lock_tool binary (set by CMake).
inline std::string lock_tool_path() {
  return DISTLOCK_LOCK_TOOL_PATH;
}

/// Starts `lock_tool hold` with stdout to `out_file`.
inline Process spawn_holder(const std::string& url, const std::string& name, const std::string& out_file,
                            long ttl_ms, long hold_ms = 0, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv{lock_tool_path(), "hold",
                                "--url",          url,
                                "--name",         name,
                                "--ttl",          std::to_string(ttl_ms),
                                "--hold-ms",      std::to_string(hold_ms)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Process::spawn(argv, out_file);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Waits until `path` contains `needle` (true) or `timeout` passes (false).
inline bool wait_for_text(const std::string& path, const std::string& needle,
                          std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (read_file(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return read_file(path).find(needle) != std::string::npos;
}

/// The token printed by a holder ("acquired <token>"), or -1.
inline long long acquired_token(const std::string& path) {
  const std::string s = read_file(path);
  const auto p = s.find("acquired ");
  if (p == std::string::npos) return -1;
  try {
    return std::stoll(s.substr(p + 9));
  } catch (...) {
    return -1;
  }
}

/// The lock_tool's own lines in `out` (its stderr, with the library's log lines, shares the
/// file): every line not starting "distlock " or "lock_tool: ".
inline std::vector<std::string> tool_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(read_file(out));
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("distlock ", 0) != 0 && l.rfind("lock_tool: ", 0) != 0) lines.push_back(l);
  }
  return lines;
}

/// Whether the lock_tool printed `line` as a line of its own (tool_lines) within `timeout`.
/// Not wait_for_text: the library's log line of a loss ('distlock ... lock "x" lost: ...', on
/// the stderr that shares the file) comes before the tool's on_lost callback prints "lost", so a
/// search for the text "lost" can return before the tool has said it (a conformance test then
/// asked for "owns" and read "owns 0" before "lost", once beside two CPU hogs).
inline bool wait_for_line(const std::string& out, const std::string& line,
                          std::chrono::milliseconds timeout) {
  const auto has = [&] {
    const std::vector<std::string> lines = tool_lines(out);
    return std::find(lines.begin(), lines.end(), line) != lines.end();
  };
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (has()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return has();
}

}  // namespace distlock::testing
