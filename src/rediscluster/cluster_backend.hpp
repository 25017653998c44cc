// The Redis Cluster backend:
//   redis+cluster://[user:password@]h1:p1[,h2:p2...][?prefix=P&timeout=DUR&nat=A:P=B:Q,...]
//
// The same lock layout and Lua scripts as redis:// (src/redis/lock_scripts.cpp: its queue),
// routed per name to the master serving the name's hash slot: the lock hash, its
// fence counter and its release channel share one hash tag, so they live in one
// slot (names containing '{' or '}' get a tag derived from a hash of the name).
// The slot map comes from CLUSTER SLOTS on any reachable node (the URL's nodes are
// only seeds); MOVED refreshes it and retries, ASK retries once on the importing
// node after ASKING, TRYAGAIN retries after a short pause, all bounded. Waiters use
// sharded pub/sub (SSUBSCRIBE on the slot's node, one subscriber connection per
// node), moved to the new node when a slot moves. Renewal sends one pipeline per
// node per batch. Records are single keys in their key's slot (record_key());
// list_held scans every master. See docs/redis-cluster.md.
//
// Thread-safety: like every backend, called from many threads at once; it
// synchronises itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "engine/backend.hpp"

namespace distlock::detail {

/// Parses the URL, reads the slot map from the first seed that answers and returns
/// the backend; on error nullptr with `ec` and a `why` naming the problem.
std::unique_ptr<Backend> make_redis_cluster_backend(const Url& url, const ClientOptions& opts, Error& err);

namespace rediscluster {
/// The hash slot of a key (CRC16 of its hash tag, or of the whole key), 0..16383.
std::uint16_t key_slot(std::string_view key) noexcept;
/// The key layout of one name: lock hash, fence counter, release channel (also its
/// grant channel), queue keys; all in one slot for every name (also names holding '{' or '}').
struct NameKeys {
  std::string lock;
  std::string fence;
  std::string channel;
  std::string revoke_note;  ///< the note of the last revoke (Backend::revoke), in the lock's slot
  std::string delay;        ///< the lock-delay marker (value D ms, PX lease end + D), in the lock's slot
  std::string queue;        ///< the wait queue: a list of "<entry> <owner>", oldest first
  std::string expiries;     ///< each queued entry's expiry, "<expiry ms>:<ttl ms>" (server time)
  std::uint16_t slot = 0;
};
NameKeys keys_of(std::string_view prefix, std::string_view name);
/// The sharded channel on which the lock scripts of `slot` publish every change for
/// Client::watch: "<prefix>:events:{<tag>}", its tag chosen to hash to `slot`.
std::string events_channel(std::string_view prefix, std::uint16_t slot);
/// The name whose lock key (keys_of(prefix, name).lock) is `key`; false for any other key.
bool name_of_lock_key(std::string_view prefix, std::string_view key, std::string& name);
/// The key of a record (never a key of a lock, see keys_of); its slot is key_slot() of it.
std::string record_key(std::string_view prefix, std::string_view key);
}  // namespace rediscluster

}  // namespace distlock::detail
