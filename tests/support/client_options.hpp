// Options the tests build again and again: a client that drops the library's log lines,
// the LockOptions of a TTL with an optional wait and safety margin, and a connect or a set-up
// acquisition tried again while a short timeout makes it fail.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "distlock/distlock.hpp"

namespace distlock::testing {

/// Client options that drop the library's log lines.
inline ClientOptions quiet() {
  ClientOptions o;
  o.logger = [](LogLevel, std::string_view) {};
  return o;
}

/// quiet(), with the connect and command timeouts both `timeout`.
inline ClientOptions quiet(Millis timeout) {
  ClientOptions o = quiet();
  o.connect_timeout = timeout;
  o.command_timeout = timeout;
  return o;
}

/// Lock options with `ttl`, `wait` (none: LockOptions' default) and `margin` as the safety margin.
inline LockOptions ttl_of(Millis ttl, std::optional<Millis> wait = std::nullopt, Millis margin = Millis(0)) {
  LockOptions o;
  o.ttl = ttl;
  o.wait = wait;
  o.safety_margin = margin;
  return o;
}

/// connect(url, options), tried again while it fails with `retry_on`: 20 tries within 20 s at
/// most, then the last error is thrown. For a test whose URL sets a timeout so short (tens of
/// milliseconds, to make a later fault quick) that a busy machine can miss the connect's first
/// exchange; what the test checks comes after the connect.
inline Client connect_within_tries(const std::string& url, const ClientOptions& options, errc retry_on) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int attempt = 1;; ++attempt) {
    try {
      return connect(url, options);
    } catch (const std::system_error& e) {
      if (e.code() != retry_on || attempt >= 20 || std::chrono::steady_clock::now() >= until) throw;
    }
  }
}

/// client.acquire(name, options), tried again while it fails with `retry_on`: 10 s at most, then
/// the last error is thrown. For a test's set-up acquisition through a per-node timeout short
/// enough (tens of milliseconds) that a busy machine can miss it; what the test checks comes after.
inline Lease acquire_within_tries(Client& client, std::string_view name, const LockOptions& options,
                                  errc retry_on) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    std::error_code ec;
    Lease lease = client.acquire(name, options, ec);
    if (ec != retry_on || std::chrono::steady_clock::now() >= until) {
      if (ec) throw std::system_error(ec);
      return lease;
    }
  }
}

}  // namespace distlock::testing
