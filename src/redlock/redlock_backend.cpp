// Redlock's URL (parse_config), key names, connecting to the masters and the factory.
#include "redlock/redlock_backend.hpp"

#include <fmt/format.h>

#include <set>

#include "engine/scheme.hpp"
#include "redlock/redlock_backend_impl.hpp"
#include "redlock/redlock_scheme.hpp"

namespace distlock::detail {

namespace redlock {

namespace {

Error bad_url(std::string msg) {
  return {make_error_code(errc::invalid_url), std::move(msg)};
}

}  // namespace

Error parse_config(const Url& url, Config& out) {
  out = Config{};
  const std::string shown = url.redacted();
  if (url.hosts.size() < 3) {
    return bad_url(
        fmt::format("redlock:// needs at least 3 independent masters for a majority; \"{}\" names {} "
                    "(use redis:// for a single server)",
                    shown, url.hosts.size()));
  }
  std::set<std::pair<std::string, std::uint16_t>> seen;
  for (auto h : url.hosts) {
    if (h.port == 0) h.port = 6379;
    if (!seen.emplace(h.host, h.port).second) {
      return bad_url(
          fmt::format("master {}:{} appears twice in \"{}\"; the masters must be independent servers", h.host,
                      h.port, shown));
    }
    out.masters.push_back(h);
  }
  if (!url.path.empty() && url.path != "/") {
    return bad_url(fmt::format("redlock:// takes no database path; \"{}\" has \"{}\"", shown, url.path));
  }
  if (url.has_userinfo) {
    if (url.password.empty() && !url.user.empty()) {
      return bad_url(
          // The user part is not quoted: people write a bare password there.
          fmt::format("\"{}\" names a user but no password (write user:password@)", shown));
    }
    out.user = url.user;
    out.password = url.password;
  }
  // The query is checked against this backend's own scheme entry (redlock_scheme.cpp) here as well as in
  // connect(): tests parse Redlock URLs without connecting.
  if (const Scheme* scheme = scheme_named(redlock_schemes(), url.scheme)) {
    if (Error err = check_query(*scheme, url)) return err;
  }
  out.prefix = url.query_or("prefix", out.prefix);
  if (const auto d = query_duration(url, "timeout")) out.node_timeout = *d;
  return {};
}

std::string lock_key(const Config& cfg, std::string_view name) {
  std::string k;
  k.reserve(cfg.prefix.size() + 5 + name.size());
  k.append(cfg.prefix).append("lock:").append(name);
  return k;
}

std::string release_channel(const Config& cfg, std::string_view name) {
  std::string k;
  k.reserve(cfg.prefix.size() + 9 + name.size());
  k.append(cfg.prefix).append("released:").append(name);
  return k;
}

std::string record_key(const Config& cfg, std::string_view key) {
  std::string k;
  k.reserve(cfg.prefix.size() + 7 + key.size());
  k.append(cfg.prefix).append("record:").append(key);
  return k;
}

std::string revoke_note_key(const Config& cfg, std::string_view name) {
  return cfg.prefix + "revoked:" + std::string(name);
}

std::string delay_key(const Config& cfg, std::string_view name) {
  return cfg.prefix + "delay:" + std::string(name);
}

// Connects to every master at once; fails unless a quorum answers.
void RedlockBackend::connect(Millis timeout, Error& ec) {
  ec.clear();
  const Command ping{{"PING"}, nullptr};
  LaneLease lane(pool_);
  auto replies = lane->run_all(std::span(&ping, 1), timeout);
  std::size_t answered = 0;
  for (const auto& r : replies) {
    if (r.status == NodeStatus::auth_failed) return ec.fail(errc::auth_failed, r.error);
    if (r.status == NodeStatus::ok) ++answered;
  }
  if (answered < quorum_) {
    return ec.fail(errc::quorum_unavailable,
                   fmt::format("only {} of {} redlock masters answered (a quorum is {}): {}", answered,
                               masters_.size(), quorum_, failures(replies, {})));
  }
  if (answered < masters_.size()) {
    log_.log(LogLevel::warning, "redlock: {} of {} masters answered; going on with a quorum: {}", answered,
             masters_.size(), failures(replies, {}));
  }
}

}  // namespace redlock

std::unique_ptr<Backend> make_redlock_backend(const Url& url, const ClientOptions& opts, Error& err) {
  redlock::Config cfg;
  if ((err = redlock::parse_config(url, cfg))) return nullptr;
  std::vector<std::shared_ptr<redlock::Master>> masters;
  for (std::size_t i = 0; i < url.hosts.size(); ++i) {
    redis::ConnectionOptions o = redlock::master_options(url, i, opts, err);
    if (err) return nullptr;
    masters.push_back(std::make_shared<redlock::Master>(std::move(o)));
  }
  auto backend = std::make_unique<redlock::RedlockBackend>(cfg, std::move(masters), opts, url.redacted());
  backend->connect(opts.connect_timeout, err);
  if (err) return nullptr;
  return backend;
}

}  // namespace distlock::detail
