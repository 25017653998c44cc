// The Sentinel-managed Redis backend:
//   redis+sentinel://[user:password@]s1[:26379][,s2[:26379]...]/<master-name>
//                    [?prefix=P&timeout=DUR&wait=N&wait_timeout=DUR]
//
// A layer over the redis:// backend (redis_backend.hpp), not a second Redis stack:
// it asks every sentinel for the master of <master-name> (SENTINEL
// get-master-addr-by-name) and its config-epoch (SENTINEL MASTER), takes the address
// named with the highest epoch, moves away from its current master only on a newer
// epoch or a majority of the sentinels, checks with ROLE that the node is a master,
// and runs a redis:// backend against it. It follows a failover: a monitor thread
// subscribes to +switch-master on a sentinel (a message makes it ask them all; it
// also asks every second in case a message was missed), and any call that fails with backend_unavailable
// (connection lost, READONLY from a demoted master) re-discovers the master; when
// it moved, the call is retried once on the new master. Leases do not move: the new
// master has a lease only if replication carried it there, so a holder whose lock
// the promoted replica never saw learns it at its next renewal (not_owner: the lease
// is lost, its stop token fires). `wait=N` makes acquire and renew wait for N
// replica acknowledgements (WAIT), see RedisSettings. The same credentials are sent
// to the sentinels and the master (sentinels without a password get none). A prefix
// watch (Client::watch) is the redis:// watch on the current master, moved to each new
// master with a gap (sentinel_watch.cpp).
// See docs/sentinel.md for what survives a failover.
//
// Thread-safety: as every backend, called from many threads at once.
#pragma once

#include <memory>
#include <string>
#include <system_error>

#include "engine/backend.hpp"

namespace distlock::detail {

/// Parses the URL, finds the master through the sentinels, connects to it and starts
/// following failovers. Errors: invalid_url (no sentinel, no master name, bad wait or
/// wait_timeout, unknown parameter), invalid_argument (no sentinel knows the master
/// name), backend_unavailable (no sentinel answered, or none named a reachable master),
/// auth_failed. `why` names the problem and never the password.
std::unique_ptr<Backend> make_sentinel_backend(const Url& url, const ClientOptions& opts, Error& err);

}  // namespace distlock::detail
