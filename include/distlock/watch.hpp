// distlock/watch.hpp — watch every lock under a name prefix: who takes it, with which
// token, when it is released, lost or revoked.
//
// `client.watch(prefix)` returns a Watch that yields events for every lock whose name
// starts with `prefix` (an exact name is a prefix too; the empty prefix is every lock):
//   acquired  name, token, holder (owner id), holder_info when the backend tells it
//   released  the holder let go (token of the lease that ended)
//   lost      the lease ended without a release: the holder's client declared it lost,
//             or (inferred == true) the watcher saw a later token, or a status re-read
//             found the lease gone (an expiry: the server publishes none)
//   revoked   the lease was taken away by a revoke (where the backend reports one)
//   gap       events may have been missed (the notification channel broke, the consumer
//             fell behind the queue bound); followed, once the state could be read
//             again, by one `state` event per lock held then (and per watched name the
//             watcher believed held that is free now, with held == false)
//   state     a snapshot of one lock: at the start (WatchOptions::initial_state) and
//             after each gap, like an etcd watch's re-list after ErrCompacted
// Per name the events come in token order: an `acquired` is followed by the end of that
// lease (released, lost or revoked) before the next `acquired` of that name; a stale
// message (an older token than one already reported) is dropped. Except after a `gap`
// for a failover (redis+sentinel://: the master moved; redis+cluster://: a master's
// connection broke or a master was replaced): the new master may lack changes already reported, and its state
// is reported even with an older token (docs/sentinel.md "Watching locks").
//
// Delivery is by the backend's change notifications (redis://, and redis+sentinel:// on
// its current master: the lock scripts publish every change on one channel; redis+cluster://:
// on one sharded channel per slot, a migrated slot being a gap; etcd://: an
// etcd Watch of the lock keys; zk://: one-shot watches re-armed on each trigger, the events
// inferred from successive readings of the queues, a gap wherever a lease may have come and
// gone unseen; postgres://: the lock statements NOTIFY one channel in their transaction);
// docs/design.md "Watching locks" lists the backends and why the others throw
// errc::not_supported. Redis and PostgreSQL publish no expiry (etcd does: a lease's end
// deletes its key; zk://: the end of the holder's session is read as `lost`): the watcher
// re-reads the status of a held name on the engine's fallback re-check rule (the holder's
// remaining TTL, between 5 ms and 5 s), so an expiry is reported at most about that long
// after the lease's end.
//
// A pull API, as an etcd watch channel: events queue inside the Watch (at most
// WatchOptions::max_queued; beyond that they are dropped and a `gap` is reported) and
// next() takes them out. One background thread per Watch re-reads state after a gap and
// checks held leases for expiry.
//
// Thread-safety: a Watch is move-only; next() and stop() may be called from any thread
// concurrently (each event goes to exactly one next() call). The destructor stops the
// watch (its subscription and thread end before it returns); a next() blocked in
// another thread must have returned first.
//
// Example:
//   auto client = distlock::connect("redis://127.0.0.1:6379");
//   distlock::Watch w = client.watch("orders/");
//   while (auto ev = w.next(std::chrono::seconds(1))) {
//     if (ev->kind == distlock::WatchEventKind::acquired) note_owner(ev->name, ev->holder, ev->token);
//   }
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distlock/client.hpp"
#include "distlock/export.hpp"
#include "distlock/options.hpp"

namespace distlock {

enum class WatchEventKind { acquired, released, lost, revoked, gap, state };

/// "acquired", "released", "lost", "revoked", "gap", "state".
DISTLOCK_EXPORT std::string_view to_string(WatchEventKind kind) noexcept;

struct DISTLOCK_EXPORT WatchEvent {
  WatchEventKind kind = WatchEventKind::state;
  std::string name;         ///< empty for a gap
  std::uint64_t token = 0;  ///< the lease's fencing token (0 where the backend issues none)
  std::string holder;       ///< the holder's owner id, when known
  std::optional<std::string> holder_info;
  bool held = false;      ///< state: whether the lock is held now (acquired: true)
  bool inferred = false;  ///< lost: deduced by the watcher, not reported by the holder's client
  std::string detail;     ///< lost: why; gap: what broke
  std::chrono::system_clock::time_point at{};  ///< when the watcher received it
  /// gap: when the last event before it was received (the watch's start if none):
  /// events after that moment may be missing.
  std::optional<std::chrono::system_clock::time_point> gap_since;
  /// gap: the names known to be affected; empty means any name under the prefix.
  std::vector<std::string> gap_names;
};

struct DISTLOCK_EXPORT WatchOptions {
  /// Start with one `state` event per lock held under the prefix.
  bool initial_state = true;
  /// Events kept for next() at most; more are dropped and reported as a gap.
  std::size_t max_queued = 65536;
  /// Re-read each held name's status to find expiries the server does not publish (redis://,
  /// redis+sentinel://, postgres://: an inferred `lost` about the remaining TTL after the
  /// lease's end). False: no reads beyond the re-lists after gaps (and the first one); an
  /// expiry the server does not publish is then reported only by the name's next `acquired`
  /// (an inferred `lost` first). etcd:// and zk:// report expiries themselves either way.
  /// The cost it saves: one status read per held name per remaining TTL (at most 5 s).
  bool expiry_checks = true;
};

class DISTLOCK_EXPORT Watch {
 public:
  Watch() noexcept;
  Watch(Watch&&) noexcept;
  Watch& operator=(Watch&&) noexcept;
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
  ~Watch();

  /// The next event, waiting up to `timeout` (forever if unset); nullopt when none came
  /// in time or the watch was stopped.
  std::optional<WatchEvent> next(std::optional<Millis> timeout = std::nullopt);
  /// Ends the watch: a blocked next() returns nullopt, later ones too. Idempotent.
  void stop() noexcept;
  /// The watched prefix.
  const std::string& prefix() const noexcept;
  /// Whether the watch was started and not stopped.
  explicit operator bool() const noexcept;

  struct Impl;

 private:
  friend class Client;
  explicit Watch(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distlock
