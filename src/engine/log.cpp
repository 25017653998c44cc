#include "engine/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace distlock::detail {

namespace {
int threshold_from_env() {
  const char* v = std::getenv("DISTLOCK_LOG");
  if (!v) return static_cast<int>(LogLevel::warning);
  if (!std::strcmp(v, "debug")) return static_cast<int>(LogLevel::debug);
  if (!std::strcmp(v, "info")) return static_cast<int>(LogLevel::info);
  if (!std::strcmp(v, "error")) return static_cast<int>(LogLevel::error);
  if (!std::strcmp(v, "off")) return 100;
  return static_cast<int>(LogLevel::warning);
}
const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
  }
  return "?";
}
}  // namespace

Logger::Logger(std::function<void(LogLevel, std::string_view)> sink)
    : sink_(std::move(sink)), threshold_(sink_ ? 0 : threshold_from_env()) {}

void Logger::write(LogLevel level, std::string_view msg) noexcept {
  if (sink_) {
    try {
      sink_(level, msg);
    } catch (...) {
    }
    return;
  }
  std::fprintf(stderr, "distlock %s: %.*s\n", level_name(level), static_cast<int>(msg.size()), msg.data());
}

}  // namespace distlock::detail
