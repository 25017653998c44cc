// What a URL scheme is: how it is written, the query keys it accepts and the factory
// that makes its backend. Each backend folder defines its own entries
// (src/<backend>/<backend>_scheme.cpp); src/connect/registry.cpp lists them, and
// connect() validates every URL against its entry before a backend sees it. A backend
// reads the values it needs with the typed readers below; they cannot fail on a URL
// check_query accepted, so no backend repeats a type check, an unknown-key check or a
// "needs TLS" check.
//
// What stays in a backend: rules that relate a value to something else (a Redis prefix
// may not hold '{', sentinel's wait_timeout needs wait= and must be below the command
// timeout, a cluster's nat= entries are host:port pairs).
//
// Thread-safety: the tables are constant; every function is safe from any thread.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include "engine/backend.hpp"
#include "engine/url.hpp"

namespace distlock::detail {

enum class QueryType {
  text,      ///< any value (a key prefix, a list the backend parses)
  duration,  ///< 250ms, 10s, 2m, 1h or plain milliseconds; > 0 and <= QueryKey::max
  flag,      ///< 1, 0, true, false, yes, no
  count,     ///< a whole number in [0, QueryKey::max_count]
  choice,    ///< one of QueryKey::choices ('|'-separated)
  file,      ///< a path to a file the backend reads (a PEM certificate or key); non-empty
};

struct QueryKey {
  std::string_view name;
  QueryType type = QueryType::text;
  /// What the key does for this scheme, for `distlock urls` and for messages.
  std::string_view meaning;
  /// The value used when the key is absent, as people write it ("" when there is none).
  std::string_view fallback{};
  /// choice: the allowed values, '|'-separated.
  std::string_view choices{};
  /// Only on the TLS variant of the scheme (Scheme::tls_scheme names it).
  bool tls_only = false;
  /// duration: the largest value accepted.
  Millis max{std::chrono::hours(1)};
  /// count: the largest value accepted.
  unsigned max_count = 0;
};

struct Scheme {
  std::string_view name;     ///< "redis"
  std::string_view form;     ///< "redis://[user:password@]host[:port][/db]"
  std::string_view summary;  ///< "one Redis server"
  /// This scheme is the TLS variant (tls_only keys are accepted).
  bool tls = false;
  /// For a plain scheme with a TLS variant: that variant's name, which a message about
  /// a tls_only key tells the user to write.
  std::string_view tls_scheme{};
  std::span<const QueryKey> keys;
  BackendFactory factory = nullptr;
};

/// timeout= is read by the engine for every scheme (connect and command timeout); a
/// scheme that gives it another meaning as well says so in its own entry.
inline constexpr QueryKey kTimeoutKey{"timeout", QueryType::duration,
                                      "time to connect and for each request, before a server counts as "
                                      "unavailable (ClientOptions::connect_timeout and command_timeout)",
                                      "2s"};

/// The entry called `name` (lower-case, as parse_url leaves it) among `schemes`, or nullptr.
const Scheme* scheme_named(std::span<const Scheme> schemes, std::string_view name) noexcept;

/// Checks every query key of `url` against the table of `scheme`: unknown keys (the
/// message lists the known ones), tls_only keys on a plain scheme (it names the TLS
/// scheme), values of the wrong type or out of range (it names the key, the value and
/// what is expected). Returns errc::invalid_url with the detail naming the problem, or {}.
/// Never quotes the password.
Error check_query(const Scheme& scheme, const Url& url);

/// Typed reads of a URL that check_query accepted; nullopt when the key is absent.
std::optional<Millis> query_duration(const Url& url, std::string_view key);
std::optional<bool> query_flag(const Url& url, std::string_view key);
std::optional<unsigned> query_count(const Url& url, std::string_view key);

/// `schemes` with their forms and keys (type, default, meaning), for `distlock urls`.
std::string describe_schemes(std::span<const Scheme> schemes, bool with_keys);

}  // namespace distlock::detail
