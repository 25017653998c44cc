#include "etcd/etcd_url.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "distlock/error.hpp"
#include "engine/errno_text.hpp"
#include "engine/scheme.hpp"
#include "etcd/etcd_scheme.hpp"

namespace distlock::detail::etcd {

namespace {

Error read_file(const std::string& what, const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return {make_error_code(errc::invalid_argument),
            "TLS " + what + " file \"" + path + "\" cannot be read: " + errno_text(err)};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  if (out.empty()) {
    return {make_error_code(errc::invalid_argument), "TLS " + what + " file \"" + path + "\" is empty"};
  }
  return {};
}

}  // namespace

Error parse_url(const Url& url, const ClientOptions& opts, UrlConfig& out) {
  auto bad_url = [](std::string msg) -> Error {
    return {make_error_code(errc::invalid_url), std::move(msg)};
  };
  if (url.hosts.empty() || url.hosts.front().host.empty()) {
    return bad_url("etcd URL \"" + url.redacted() +
                   "\" names no endpoint; expected etcd://host:port[,host:port...]");
  }
  if (!url.path.empty() && url.path != "/") {
    return bad_url("etcd URL \"" + url.redacted() + "\" has a path \"" + url.path +
                   "\"; etcd URLs take no path (use ?prefix=)");
  }
  // The query is checked against this backend's own scheme entry (etcd_scheme.cpp) here as well as in
  // connect(), for callers that parse without connecting.
  if (const Scheme* scheme = scheme_named(etcd_schemes(), url.scheme)) {
    if (Error err = check_query(*scheme, url)) return err;
  }
  TransportConfig& config = out.transport;
  for (const auto& h : url.hosts) {
    if (h.host.empty())
      return bad_url("etcd URL \"" + url.redacted() + "\" has an empty host in its endpoint list");
    const std::string host = h.host.find(':') != std::string::npos ? "[" + h.host + "]" : h.host;
    config.targets.push_back(host + ":" + std::to_string(h.port == 0 ? 2379 : h.port));
  }
  if (url.has_userinfo) {
    if (url.user.empty())
      return bad_url("etcd URL \"" + url.redacted() + "\" has a password but no user name");
    config.user = url.user;
    config.password = url.password;
  }
  config.tls = query_flag(url, "tls").value_or(false);
  const std::string cacert = url.query_or("cacert", "");
  const std::string cert = url.query_or("cert", "");
  const std::string key = url.query_or("key", "");
  if (!cacert.empty() || !cert.empty() || !key.empty()) config.tls = true;
  if (cert.empty() != key.empty()) {
    return {make_error_code(errc::invalid_argument),
            "etcd URL \"" + url.redacted() + "\": a TLS client certificate needs both cert= and key="};
  }
  if (!cacert.empty()) {
    if (Error err = read_file("cacert", cacert, config.ca_pem)) return err;
  }
  if (!cert.empty()) {
    if (Error err = read_file("cert", cert, config.cert_pem)) return err;
  }
  if (!key.empty()) {
    if (Error err = read_file("key", key, config.key_pem)) return err;
  }
  config.command_timeout = opts.command_timeout;
  config.connect_timeout = opts.connect_timeout;

  std::string& prefix = out.prefix;
  prefix = url.query_or("prefix", "distlock");
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return {};
}

}  // namespace distlock::detail::etcd
