#include "zk/zk_url.hpp"

#include <cstdint>

#include "distlock/error.hpp"
#include "engine/scheme.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_scheme.hpp"

namespace distlock::detail::zk {

namespace {
constexpr std::uint16_t kDefaultPort = 2181;
}  // namespace

Error parse_url(const Url& url, const ClientOptions& opts, UrlConfig& cfg) {
  auto bad_url = [&](std::string msg) -> Error {
    return {make_error_code(errc::invalid_url), std::move(msg)};
  };
  const std::string shown = url.redacted();
  if (url.hosts.empty()) {
    return bad_url("URL \"" + shown +
                   "\" names no ZooKeeper server (expected zk://host:port[,host:port...][/chroot])");
  }
  if (url.has_userinfo && (url.user.empty() || url.password.empty())) {
    return bad_url(
        "URL \"" + shown +
        "\": digest authentication needs both a user and a password (zk://user:password@host:port)");
  }
  if (url.user.find(':') != std::string::npos) {
    return bad_url("URL \"" + shown + "\": the user name must not contain ':'");
  }
  cfg.redacted_url = shown;
  cfg.session_timeout = opts.lock_defaults.ttl;
  // The query is checked against this backend's own scheme entry (zk_scheme.cpp) here as well as in
  // connect(), for callers that parse without connecting.
  if (const Scheme* scheme = scheme_named(zk_schemes(), url.scheme)) {
    if (Error err = check_query(*scheme, url)) return err;
  }
  if (const auto d = query_duration(url, "session_timeout")) {
    cfg.session_timeout = *d;
    cfg.session_timeout_from_url = true;
  }
  if (const std::string problem = chroot_problem(url.path); !problem.empty()) {
    return bad_url("chroot \"" + url.path + "\" in URL \"" + shown + "\" " + problem);
  }
  cfg.chroot = url.path == "/" ? std::string() : url.path;
  std::string hosts, first;
  for (const auto& h : url.hosts) {
    const bool v6 = h.host.find(':') != std::string::npos;
    const std::string one =
        (v6 ? "[" + h.host + "]" : h.host) + ':' + std::to_string(h.port != 0 ? h.port : kDefaultPort);
    if (first.empty()) first = one;
    if (!hosts.empty()) hosts += ',';
    hosts += one;
  }
  // ZooKeeper's C client (3.8) moves its host cursor two places per failed connection (its
  // error handler and its next-server pick both advance it). Over an even number of entries
  // that visits only every other one: with two hosts it redials the one it moved to, without
  // a pause, and never goes back to the other, even while that one serves. An odd count makes
  // the two-place steps reach every entry (and the client pauses between rounds again): the
  // first host is listed twice.
  if (url.hosts.size() % 2 == 0) hosts += ',' + first;
  cfg.connect_string = hosts + cfg.chroot;
  if (url.has_userinfo) cfg.credentials = url.user + ":" + url.password;
  cfg.connect_timeout = opts.connect_timeout;
  cfg.command_timeout = opts.command_timeout;
  return {};
}

}  // namespace distlock::detail::zk
