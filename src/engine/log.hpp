// Minimal leveled logging that goes to ClientOptions::logger or stderr.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string_view>

#include "distlock/options.hpp"

namespace distlock::detail {

class Logger {
 public:
  explicit Logger(std::function<void(LogLevel, std::string_view)> sink = {});
  bool enabled(LogLevel level) const noexcept { return static_cast<int>(level) >= threshold_; }
  template <class... Args>
  void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) noexcept {
    if (!enabled(level)) return;
    try {
      write(level, fmt::format(f, std::forward<Args>(args)...));
    } catch (...) {  // logging must never throw into a destructor
    }
  }

 private:
  void write(LogLevel level, std::string_view msg) noexcept;
  std::function<void(LogLevel, std::string_view)> sink_;
  int threshold_;
};

}  // namespace distlock::detail
