// etcd:// URL parsing: what the URL selects (endpoints, credentials, TLS files, key
// prefix), kept apart from the backend so the accepted query keys live in one place.
#pragma once

#include <string>
#include <system_error>

#include "distlock/options.hpp"
#include "engine/url.hpp"
#include "etcd/etcd_transport.hpp"

namespace distlock::detail::etcd {

struct UrlConfig {
  TransportConfig transport;
  std::string prefix;  ///< key prefix without trailing '/' (default "distlock")
};

/// Fills `out` from `url`; on error returns invalid_url (or invalid_argument for
/// unreadable TLS files) with the detail naming the problem.
Error parse_url(const Url& url, const ClientOptions& opts, UrlConfig& out);

}  // namespace distlock::detail::etcd
