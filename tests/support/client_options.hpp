// Options the tests build again and again: a client that drops the library's log lines,
// and the LockOptions of a TTL with an optional wait and safety margin.
#pragma once

#include <optional>
#include <string_view>

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

}  // namespace distlock::testing
