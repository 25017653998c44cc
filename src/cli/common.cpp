// Helpers shared by the subcommands: exit-status mapping, one-line errors,
// durations, and the library logger the tool installs.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <mutex>

#include "cli/commands.hpp"
#include "distlock/client.hpp"
#include "distlock/error.hpp"
#include "distlock/text.hpp"

namespace distlock::cli {

int exit_code_for(const std::error_code& ec) noexcept {
  if (ec.category() != distlock::category()) return exit_status::software;
  switch (static_cast<errc>(ec.value())) {
    case errc::invalid_url:
    case errc::invalid_argument: return exit_status::usage;
    case errc::backend_unavailable:
    case errc::auth_failed:
    case errc::quorum_unavailable:
    case errc::protocol_error: return exit_status::unavailable;
    case errc::busy:
    case errc::timeout: return exit_status::not_acquired;
    case errc::lost: return exit_status::lost;
    default: return exit_status::software;
  }
}

void print_error(std::string_view message) noexcept {
  // One write per line, so lines from concurrent runners sharing a log do not interleave.
  std::string line;
  try {
    line.reserve(message.size() + 12);
    line.append("distlock: ").append(message);
    // Keep the promise of one line even if a message carries a newline.
    for (char& c : line) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    line.push_back('\n');
  } catch (...) {
    return;
  }
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

Millis parse_duration_flag(std::string_view flag, std::string_view text) {
  const std::optional<Millis> out = parse_duration(text);
  if (!out) {
    throw_error(make_error_code(errc::invalid_argument),
                std::string(flag) + " \"" + std::string(text) +
                    "\" is not a duration (write it like 250ms, 10s, 2m or 1h)");
  }
  return *out;
}

std::string format_duration(Millis d) {
  const auto ms = d.count();
  if (ms % 60'000 == 0 && ms >= 60'000) return std::to_string(ms / 60'000) + "m";
  if (ms % 1000 == 0 && ms >= 1000) return std::to_string(ms / 1000) + "s";
  if (ms < 1000) return std::to_string(ms) + "ms";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3gs", static_cast<double>(ms) / 1000.0);
  return buf;
}

namespace {

// DISTLOCK_LOG=debug|info|warning|error turns the library's diagnostics on
// (written as "distlock <level>: ..."); by default the tool prints only its own errors.
int log_threshold_from_env() {
  const char* v = std::getenv("DISTLOCK_LOG");  // NOLINT(concurrency-mt-unsafe): nothing calls setenv
  if (!v) return 100;
  if (!std::strcmp(v, "debug")) return static_cast<int>(LogLevel::debug);
  if (!std::strcmp(v, "info")) return static_cast<int>(LogLevel::info);
  if (!std::strcmp(v, "warning")) return static_cast<int>(LogLevel::warning);
  if (!std::strcmp(v, "error")) return static_cast<int>(LogLevel::error);
  return 100;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
  }
  return "?";
}

}  // namespace

PasswordSettings& password_settings() {
  static PasswordSettings settings;  // main thread only (see commands.hpp)
  return settings;
}

namespace {

std::string read_password_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw_error(make_error_code(errc::invalid_argument),
                "--password-file \"" + path + "\" cannot be read: " + std::system_category().message(errno));
  }
  constexpr std::size_t kMax = 64 * 1024;
  std::string pw;
  pw.reserve(256);
  for (std::istreambuf_iterator<char> it(in), end; it != end && pw.size() <= kMax; ++it) pw.push_back(*it);
  if (pw.size() > kMax) {
    throw_error(make_error_code(errc::invalid_argument),
                "--password-file \"" + path + "\" is longer than 64 KiB: is it the right file?");
  }
  // One trailing line end (as `echo` or an editor leaves it) is not part of the password.
  if (pw.ends_with('\n')) pw.pop_back();
  if (pw.ends_with('\r')) pw.pop_back();
  if (pw.empty()) {
    throw_error(make_error_code(errc::invalid_argument), "--password-file \"" + path + "\" is empty");
  }
  return pw;
}

bool scheme_takes_password(const std::string& scheme) {
  return scheme != "file" && scheme != "memory";
}

}  // namespace

std::string url_with_password_from_settings(const std::string& url_flag) {
  const PasswordSettings& ps = password_settings();
  const char* env = std::getenv("DISTLOCK_PASSWORD");  // NOLINT(concurrency-mt-unsafe): nothing calls setenv
  const bool from_env = env != nullptr && *env != '\0';
  if (ps.file.empty() && !from_env) return url_flag;
  const std::string url = url_flag.empty() ? default_url() : url_flag;
  const std::string scheme = url_scheme(url);
  if (!scheme_takes_password(scheme)) {
    if (!ps.file.empty()) {
      throw_error(make_error_code(errc::invalid_argument),
                  "--password-file is given but " + scheme + ":// URLs take no password");
    }
    return url_flag;  // DISTLOCK_PASSWORD is for the schemes that have one
  }
  const std::string password = ps.file.empty() ? std::string(env) : read_password_file(ps.file);
  return url_with_password(url, password);
}

std::string child_url(const std::string& url) {
  if (password_settings().pass_url_password) return url;
  try {
    return url_without_password(url);
  } catch (const std::system_error&) {
    return redact_url(url);
  }
}

ClientOptions tool_client_options() {
  ClientOptions opts;
  const int threshold = log_threshold_from_env();
  opts.logger = [threshold](LogLevel level, std::string_view msg) {
    if (static_cast<int>(level) >= threshold) {
      std::fprintf(stderr, "distlock %s: %.*s\n", level_name(level), static_cast<int>(msg.size()),
                   msg.data());
    }
  };
  return opts;
}

std::string utc_text(std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}

std::string printable(const std::string& s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(ch);
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

}  // namespace distlock::cli
