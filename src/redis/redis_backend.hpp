// The single-Redis backend: redis://[user:password@]host[:port][/db][?prefix=P&timeout=DUR]
//
// Locks are Redis hashes `<prefix>:{<name>}` (one field per owner holding its hold
// count, plus the fencing token), with a never-expiring fence counter
// `<prefix>:{<name>}:fence` and a release channel `<prefix>:{<name>}:released`;
// the three share the hash tag `{<name>}`. Acquire, release and renew are Lua
// scripts run with EVALSHA. Waiters listen on one pub/sub connection per client.
// Records are never-expiring strings `<prefix>:{<key>}:record`; list_held scans with
// SCAN MATCH (redis/records.hpp).
// See docs/redis.md for the layout, the scripts and the guarantees.
//
// Thread-safety: the backend is called from many threads at once (the engine's
// contract); it synchronises itself (a connection pool and a subscriber thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "engine/backend.hpp"
#include "redis/connection.hpp"

namespace distlock::detail {

/// Parses the URL, connects (fails fast with auth_failed / backend_unavailable) and
/// returns the backend; on error returns nullptr with `ec` and a `why` naming the
/// problem (the offending URL part, or the server and its answer).
std::unique_ptr<Backend> make_redis_backend(const Url& url, const ClientOptions& opts, Error& err);

/// What a redis:// backend is built from once its URL is parsed (used by layers that
/// find the server themselves, such as redis+sentinel://).
struct RedisSettings {
  std::string prefix = "distlock";  ///< validated with redis_prefix_ok()
  std::string url;                  ///< for messages, password masked
  /// After each acquire and renew, `WAIT wait_replicas wait_timeout`: an acquisition
  /// that fewer replicas acknowledge is released and fails with quorum_unavailable; a
  /// renewal that fewer acknowledge counts as failed. 0: no WAIT.
  int wait_replicas = 0;
  Millis wait_timeout{0};  ///< > 0 when wait_replicas > 0, below the command timeout
};

/// True when `prefix` is usable as a key prefix (1-256 bytes, no '{' or '}').
bool redis_prefix_ok(std::string_view prefix);

/// A redis:// backend for the server in `conn`: connects at once (auth_failed,
/// backend_unavailable, the detail naming the server).
std::unique_ptr<Backend> make_redis_backend_for(const redis::ConnectionOptions& conn,
                                                const RedisSettings& settings, const ClientOptions& opts,
                                                Error& ec);
/// Counters of one redis:// backend, for tests and diagnostics.
struct RedisStats {
  std::uint64_t grants_received = 0;   ///< hand-off messages on this client's grant channel
  std::uint64_t release_messages = 0;  ///< "released" messages received for watched names (herd check)
  std::size_t queued_waits = 0;        ///< waits of this client with a place in a server queue
  /// Subscriber connections dropped because they did not answer a PING (redis::Subscriber)
  std::uint64_t subscriber_silent_drops = 0;
};

/// The counters if `backend` is a redis:// backend, else nullopt.
std::optional<RedisStats> redis_stats(const Backend& backend);

namespace redis {
class Script;
/// The batched renew scripts (KEYS locks; ARGV owner, ttl per key → 1 | 0 per key), for the
/// Redis Cluster backend (its acquire, release and queue use the cluster_queue_* scripts of
/// redis/lock_scripts.hpp). lock_renew_script touches only the lock keys it names (a slot being migrated
/// refuses a script command on a key that the node does not have); lock_renew_delayed_script
/// takes the locks' markers after them (KEYS locks..., markers...) and moves each with its
/// lease, for leases acquired with a lock_delay (docs/design.md "Lock-delay").
const Script& lock_renew_script();
const Script& lock_renew_delayed_script();
}  // namespace redis

}  // namespace distlock::detail
