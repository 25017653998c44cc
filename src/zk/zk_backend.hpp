// The ZooKeeper backend:
// zk://[user:password@]host1:port1[,host2:port2...][/chroot][?session_timeout=DUR&timeout=DUR]
//
// Apache Curator's InterProcessMutex recipe over the threaded C client: every
// contender creates an EPHEMERAL_SEQUENTIAL node /distlock/<name>/<guid>-lock-<seq>
// (the parent is a container node the server removes when empty); the lowest
// sequence holds the lock, every other contender watches only its immediate
// predecessor (a release wakes exactly one waiter). The fencing token is the lock
// node's creation zxid (czxid), strictly increasing across the whole ensemble.
//
// One ZooKeeper session per client. Its timeout is `session_timeout=` from the URL,
// else the client's lock_defaults.ttl (the server clamps it to its own bounds); the
// negotiated value is each lease's validity. A lost session (expired) loses every
// lock taken in it and a new session is opened for later acquisitions. With
// user:password in the URL the session authenticates with the digest scheme and
// our nodes carry ACLs (creator: all, everyone: read), so other users can neither
// join nor disturb the queue. The chroot must exist on the server.
// Records (persistent nodes under /distlock/.records) and list_held: zk_records.hpp.
// See docs/zookeeper.md for the recipe, the guarantees and the figures.
//
// Thread-safety: the backend is called from many threads at once (engine contract)
// and synchronises itself; callbacks come from the C client's completion thread and
// from the backend's own session keeper thread.
//
// Example:
//   auto client = distlock::connect("zk://app:secret@10.0.0.1:2181,10.0.0.2:2181/prod?session_timeout=10s");
//   distlock::Lease lease = client.acquire("billing/run");
//   charge(lease.token());
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include "engine/backend.hpp"

namespace distlock::detail {

/// Parses the URL, opens the session (waiting up to connect_timeout for a server),
/// checks the chroot exists; on error returns nullptr with `ec` (invalid_url,
/// invalid_argument, backend_unavailable, auth_failed) and a `why` naming the problem.
std::unique_ptr<Backend> make_zk_backend(const Url& url, const ClientOptions& opts, Error& err);

/// Counters of one zk:// backend, for tests and diagnostics.
struct ZkStats {
  std::uint64_t watch_events = 0;     ///< predecessor-gone notifications received (herd check)
  std::uint64_t sessions = 0;         ///< sessions opened (1 + one per expiry)
  std::uint64_t orphans_removed = 0;  ///< nodes of abandoned attempts deleted after the fact
  std::uint64_t renew_syncs = 0;      ///< syncs with the leader sent by renewals (one per batch)
  /// Node reads (get) sent by renewals: one per lease when its data watch is armed, then one
  /// more only after a notification of its node or a reconnect (ZkBackend::confirm); every
  /// renewal for a lease past the session's watch budget (Session::kWatchedPathBytes).
  std::uint64_t renew_reads = 0;
  std::uint64_t status_reads = 0;       ///< status() calls (a watch's expiry re-reads would be some)
  std::int64_t session_id = 0;          ///< the current session's id
  std::int64_t session_timeout_ms = 0;  ///< negotiated with the server
  /// The current session's password (16 bytes): lets a test attach to the session and
  /// close it, which is how a session is expired on purpose. Never log it.
  std::string session_password;
};

/// The counters if `backend` is a zk:// backend, else nullopt.
std::optional<ZkStats> zk_stats(const Backend& backend);

}  // namespace distlock::detail
