// zk:// URL parsing: servers, chroot, digest credentials and session_timeout, kept
// apart from the backend so the accepted query keys live in one place.
#pragma once

#include <string>
#include <system_error>

#include "distlock/options.hpp"
#include "engine/backend_error.hpp"
#include "engine/url.hpp"

namespace distlock::detail::zk {

struct UrlConfig {
  std::string connect_string;  // "h1:p1,h2:p2,h1:p1/chroot": an odd number of entries (zk_url.cpp)
  std::string chroot;
  std::string credentials;  // "user:password" or empty
  std::string redacted_url;
  Millis session_timeout{};  // requested
  bool session_timeout_from_url = false;
  Millis connect_timeout{};
  Millis command_timeout{};
};

/// Fills `cfg` from `url`; on error returns invalid_url, the detail saying what is wrong.
Error parse_url(const Url& url, const ClientOptions& opts, UrlConfig& cfg);

}  // namespace distlock::detail::zk
