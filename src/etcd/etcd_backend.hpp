// etcd://[user:password@]h1:p1[,h2:p2...][?prefix=P&tls=1&cacert=F&cert=F&key=F&timeout=DUR]
//
// The etcd v3 backend: etcd's concurrency.Mutex recipe over etcd's own gRPC API,
// with the fixes Jepsen and etcd's issue tracker found.
//
// - One session lease per client and lock TTL (rounded up to whole seconds; etcd
//   may raise it to its minimum lease TTL), kept alive by the engine's renewals
//   (one LeaseKeepAlive per session, never per lock) and by a keeper thread while
//   the client only waits. Every lock and queued waiter of a client shares it.
// - A lock is the key prefix `<prefix>/<name with '%' and '/' percent-encoded>/`;
//   each owner thread queues one key `<lock prefix><lease hex>-<thread seq>` holding
//   its owner id, attached to the session lease. The key with the lowest
//   create_revision owns the lock; the fencing token is that create_revision
//   (cluster-wide strictly increasing).
// - Acquire is one Txn (put my key if absent + read the lowest key). A waiter watches
//   only the key just before its own (herd-free, FIFO) from the revision it read.
// - Release is a Txn guarded on my key's create_revision (never a blind delete).
// - Records (`<prefix>/%records/<key>`, no lease) and list_held: etcd_records.hpp.
//
// Thread-safety: as every backend (engine/backend.hpp): all calls from any thread.
//
// Example:
//   auto client = distlock::connect("etcd://127.0.0.1:2379,127.0.0.1:22379?prefix=app");
//   auto lease = client.acquire("orders/42");   // token = create_revision of our key
#pragma once

#include <memory>
#include <string>
#include <system_error>

#include "engine/backend.hpp"

namespace distlock::detail {

/// Makes the etcd backend for a parsed etcd:// URL. Connects, authenticates and
/// probes the cluster before returning. Errors: invalid_url (malformed URL or
/// query), invalid_argument (a TLS file cannot be read: `why` names the file),
/// backend_unavailable (no endpoint answered), auth_failed (wrong user/password).
std::unique_ptr<Backend> make_etcd_backend(const Url& url, const ClientOptions& opts, Error& err);

}  // namespace distlock::detail
