// distlock/text.hpp — lock names, durations and URLs as text, checked the way the library
// checks them: for front ends (a CLI, a config loader) that take these from users and want
// the library's own rules and messages before they connect.
//
// Thread-safety: plain functions of their arguments.
//
// Example:
//   std::string message;
//   if (distlock::validate_name(name, message)) { std::cerr << message << "\n"; return 64; }
//   const auto ttl = distlock::parse_duration("30s");  // std::optional<Millis>{30000}
//   log << "connecting to " << distlock::redact_url(url);  // the password masked
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "distlock/export.hpp"
#include "distlock/options.hpp"

namespace distlock {

/// Whether `name` is a lock name (not empty, at most 4096 bytes, no NUL byte; any other bytes,
/// '/', spaces and UTF-8 included, are fine on every backend): an empty error_code, or
/// errc::invalid_argument with `message` naming the problem.
DISTLOCK_EXPORT std::error_code validate_name(std::string_view name, std::string& message);
/// The same; throws std::system_error(errc::invalid_argument) naming the problem.
DISTLOCK_EXPORT void validate_name(std::string_view name);

/// "250ms", "10s", "2m", "1h" or "1500" (milliseconds); std::nullopt if malformed, negative,
/// fractional or too large for Millis.
DISTLOCK_EXPORT std::optional<Millis> parse_duration(std::string_view text);

/// `url` masked for a log line or message: from the first ':' after "://" to the last '@'
/// (a superset of any password it could hold), even when it does not parse.
DISTLOCK_EXPORT std::string redact_url(std::string_view url);

/// Where redact_url masks: the byte range [first, second) of `url`, empty (first == second)
/// when nothing in it could be a password. For a front end that must blank a password in
/// place, e.g. in its own argv (what `ps` shows), where a masked copy does not help.
DISTLOCK_EXPORT std::pair<std::size_t, std::size_t> url_secret_range(std::string_view url);

/// The scheme of `url` ("redis", "etcd", ...). Throws std::system_error(errc::invalid_url)
/// with a masked message if `url` does not parse.
DISTLOCK_EXPORT std::string url_scheme(std::string_view url);

/// `url` with its password set to `password` (percent-encoded; the user is kept), or without
/// its password. Throw std::system_error(errc::invalid_url) with a masked message if `url`
/// does not parse.
DISTLOCK_EXPORT std::string url_with_password(std::string_view url, std::string_view password);
DISTLOCK_EXPORT std::string url_without_password(std::string_view url);

}  // namespace distlock
