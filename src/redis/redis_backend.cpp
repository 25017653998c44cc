// The redis:// backend's renew scripts (shared with the Redis Cluster
// backend), its check of the server's configuration at connect, and its factories.
#include "redis/redis_backend.hpp"

#include "redis/redis_backend_impl.hpp"

namespace distlock::detail {

namespace redis {

// KEYS[i] lock hashes; ARGV[2i-1] owner, ARGV[2i] ttl (ms) of KEYS[i].
// Returns one status per key: 1 renewed, 0 not held by that owner any more.
// A holder's lock-delay marker (value D, redis/lock_scripts.hpp; same hash slot) moves with
// the lease: it lives ttl + D from now (while a lock is held only its holder's marker can
// exist: a marker keeps everybody else out). Where it is found:
//   - kUndeclared (redis://, redis+sentinel://): "<lock>:delay", read for every lock;
//   - kDeclared (redis+cluster://, leases acquired with a lock_delay): KEYS[n + i] is lock
//     i's marker, named by the script as Redis Cluster requires;
//   - kNone (redis+cluster://, leases without one): no marker is read. A script reading a
//     key the node may not have is refused while the slot migrates, and every renewal of
//     that slot would fail until its keys had moved (docs/redis-cluster.md).
namespace {
enum class MarkerAt { kUndeclared, kDeclared, kNone };
std::string renew_script_text(MarkerAt at) {
  const char* move =
      at == MarkerAt::kUndeclared ? R"lua(    local d = tonumber(redis.call('GET', KEYS[i] .. ':delay'))
    if d and d > 0 then
      redis.call('PEXPIRE', KEYS[i] .. ':delay', string.format('%.0f', tonumber(ARGV[2 * i]) + d))
    end
)lua"
      : at == MarkerAt::kDeclared ? R"lua(    local d = tonumber(redis.call('GET', KEYS[n + i]))
    if d and d > 0 then
      redis.call('PEXPIRE', KEYS[n + i], string.format('%.0f', tonumber(ARGV[2 * i]) + d))
    end
)lua"
                                  : "";
  return std::string(at == MarkerAt::kDeclared ? "local n = #KEYS / 2\n" : "local n = #KEYS\n") + R"lua(
local out = {}
for i = 1, n do
  if redis.call('HEXISTS', KEYS[i], ARGV[2 * i - 1]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
)lua" + move +
         R"lua(    out[i] = 1
  else
    out[i] = 0
  end
end
return out
)lua";
}

const Script& plain_renew_script() {
  static const Script& s = *new Script(renew_script_text(MarkerAt::kNone));
  return s;
}
const Script& declared_renew_script() {
  static const Script& s = *new Script(renew_script_text(MarkerAt::kDeclared));
  return s;
}
}  // namespace

const Script& renew_script() {
  static const Script& s = *new Script(renew_script_text(MarkerAt::kUndeclared));
  return s;
}

bool prefix_ok(std::string_view prefix) {
  return redis_prefix_ok(prefix);
}

// Connects once so a bad password or a down server fails at connect(), and
// checks the server's persistence and eviction settings (one warning per client).
void RedisBackend::connect_now(Error& ec) {
  auto conn = pool_.checkout(ec);
  if (ec) return;
  check_config(*conn);
}

// CONFIG GET appendonly / maxmemory / maxmemory-policy. A server that loses
// writes on a restart or evicts keys breaks guarantees the scripts alone cannot
// keep; say so once, with the consequence. CONFIG may be renamed or denied by
// an ACL (managed services do): then only a debug line, never a failure.
void RedisBackend::check_config(Connection& conn) {
  conn.append({"CONFIG", "GET", "appendonly"});
  conn.append({"CONFIG", "GET", "maxmemory"});
  conn.append({"CONFIG", "GET", "maxmemory-policy"});
  Error ec;
  std::vector<Reply> r = conn.read_replies(3, ec);
  auto value = [&](std::size_t i) -> std::string_view {
    const redisReply* x = r[i].get();
    if (x == nullptr || x->type != REDIS_REPLY_ARRAY || x->elements != 2) return {};
    return redis::reply_str(x->element[1]);
  };
  if (!ec) {
    for (const auto& one : r) {
      if (!redis::is_error(one.get())) continue;
      log_.log(LogLevel::debug,
               "{}: CONFIG GET is not available ({}): appendonly and maxmemory-policy not checked",
               conn_opts_.describe(), redis::reply_str(one.get()));
      return;
    }
  }
  if (ec || value(0).empty() || value(2).empty()) {
    log_.log(LogLevel::debug,
             "{}: CONFIG GET gave no answer ({}): appendonly and maxmemory-policy not checked",
             conn_opts_.describe(), ec ? ec.detail() : std::string("unexpected reply"));
    return;
  }
  if (value(0) != "yes") {
    log_.log(LogLevel::warning,
             "{} runs with appendonly no: a restart loses (or restores stale) locks, so a second client "
             "can acquire a lock whose holder has not noticed yet; fencing tokens then continue from the "
             "server clock and stay increasing only if that clock did not step back (docs/redis.md)",
             conn_opts_.describe());
  }
  const std::string_view policy = value(2);
  if (policy != "noeviction" && value(1) != "0") {
    const bool all = policy.substr(0, 7) == "allkeys";
    log_.log(LogLevel::warning,
             "{} runs with maxmemory {} and maxmemory-policy {}: under memory pressure it may evict held "
             "locks{} (a second client then acquires while the holder has not noticed yet); use "
             "noeviction (docs/redis.md)",
             conn_opts_.describe(), value(1), policy,
             all ? " and fence counters (tokens then continue from the server clock)" : "");
  }
}

}  // namespace redis

std::optional<RedisStats> redis_stats(const Backend& backend) {
  if (const auto* r = dynamic_cast<const redis::RedisBackend*>(&backend)) return r->stats();
  return std::nullopt;
}

bool redis_prefix_ok(std::string_view prefix) {
  return !prefix.empty() && prefix.size() <= 256 && prefix.find_first_of("{}") == std::string_view::npos;
}

std::unique_ptr<Backend> make_redis_backend_for(const redis::ConnectionOptions& conn,
                                                const RedisSettings& settings, const ClientOptions& opts,
                                                Error& ec) {
  ec.clear();
  auto backend = std::make_unique<redis::RedisBackend>(conn, settings.prefix, settings.url, opts,
                                                       settings.wait_replicas, settings.wait_timeout);
  backend->connect_now(ec);
  if (ec) return nullptr;
  return backend;
}

std::unique_ptr<Backend> make_redis_backend(const Url& url, const ClientOptions& opts, Error& err) {
  err.clear();
  const std::string shown = "\"" + url.redacted() + "\"";
  auto bad = [&](std::string msg) -> std::unique_ptr<Backend> {
    err.fail(errc::invalid_url, std::move(msg));
    return nullptr;
  };
  if (url.hosts.empty()) return bad("URL " + shown + " names no host (expected redis://host:port)");
  if (url.hosts.size() > 1) {
    return bad("URL " + shown + " names " + std::to_string(url.hosts.size()) +
               " hosts; redis:// takes one server (for several independent masters use redlock://)");
  }
  // The query's keys and their types were checked against the scheme's table
  // (redis_scheme.cpp) before this factory runs.
  const std::string prefix = url.query_or("prefix", "distlock");
  if (!redis::prefix_ok(prefix)) {
    return bad("prefix \"" + prefix + "\" in URL " + shown +
               " must be 1-256 bytes without '{' or '}' (they delimit the hash tag)");
  }
  redis::ConnectionOptions conn = redis::options_from_url(url, 0, opts, err);
  std::unique_ptr<redis::RedisBackend> backend;
  if (!err) {
    backend = std::make_unique<redis::RedisBackend>(conn, prefix, url.redacted(), opts);
    backend->connect_now(err);
  }
  if (err) return nullptr;
  return backend;
}

// The scripts above, for the Redis Cluster backend (src/rediscluster): the same
// layout and the same rules per name, routed to the node serving the name's slot.
namespace redis {
const Script& lock_renew_script() {
  return plain_renew_script();
}
const Script& lock_renew_delayed_script() {
  return declared_renew_script();
}
}  // namespace redis

}  // namespace distlock::detail
