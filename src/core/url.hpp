// Parsed backend URL: scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&...]
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/options.hpp"

namespace distlock::detail {

struct Url {
  struct Host {
    std::string host;        // without brackets for IPv6 literals
    std::uint16_t port = 0;  // 0 when absent
  };

  std::string scheme;    // lower-case
  std::string user;      // percent-decoded
  std::string password;  // percent-decoded
  bool has_userinfo = false;
  std::vector<Host> hosts;
  std::string path;                          // percent-decoded, starts with '/' or is empty
  std::map<std::string, std::string> query;  // percent-decoded
  std::string original;

  /// The URL with the password replaced by "***".
  std::string redacted() const;
  std::string query_or(const std::string& key, std::string fallback) const;
};

/// Parses `text`. On failure returns errc::invalid_url and sets `why` to a message
/// naming the offending part (e.g. "port \"99999\" in \"redis://h:99999\" is out of range").
std::error_code parse_url(std::string_view text, Url& out, std::string& why);

/// Parses a duration "250ms", "10s", "2m", "1h", "1500" (milliseconds). False if malformed.
bool parse_duration(std::string_view text, Millis& out);

/// Applies `?timeout=` (if any) to the client options; returns invalid_url naming it if malformed.
std::error_code apply_common_query(const Url& url, ClientOptions& opts, std::string& why);

}  // namespace distlock::detail
