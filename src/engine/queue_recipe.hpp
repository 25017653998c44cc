// The queue recipe of the session-based backends (etcd, ZooKeeper), written once.
//
// Each acquisition makes a place of its own in the lock's queue, under the client's
// session (an etcd key with the session lease, a ZooKeeper ephemeral sequential node).
// The first place holds the lock, and its creation revision (czxid) is the fencing
// token. QueueRecipe keeps this client's places, one per (lock name, owner), and runs
// the Backend calls over them; a QueueStore supplies the server's side (sessions,
// making and reading a place, watching, deleting, confirming). The rules:
//   - try_acquire keeps a queued place while its session lives. A held place is never
//     adopted: the engine asks again only after it declared that hold lost, so the
//     place is deleted and the owner queues anew, with a new and higher token. First
//     in the queue: held. Behind and not keep_queued: the place is deleted. Behind and
//     keep_queued: the place just before it is watched (no herd).
//   - cancel_acquire deletes a queued place; a held one is left to release.
//   - release and renew check the token against the place before asking the server;
//     a place its session or the server no longer has is not ours.
//   - A delete whose outcome is unknown makes the place an orphan, which the store's
//     keeper retries (retry_orphans); a new place of the same lock first retries them,
//     as they would queue ahead of it.
//   - A session's end (end_session) loses every hold in it (on_lease_lost) and makes
//     every waiter in it look again (on_change).
//
// Thread-safety: every call may come from any thread. mutex() guards the table, the
// orphans and the mutable fields of every QueueEntry; a store guards its own session
// state with the same mutex, so the two never need a lock order. QueueStore's
// primitives are called without it, unless their comment says "under mutex()".
//
// Example:
//   class MyStore : public QueueStore { ... };           // the server's side
//   MyStore store;
//   QueueRecipe recipe(store, clock, logger);
//   AcquireResult r = recipe.try_acquire({"jobs", owner, ttl, true}, ec);
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distlock/clock.hpp"
#include "engine/backend.hpp"
#include "engine/log.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::detail {

/// One acquisition's place in a lock's queue. A store derives its own entry, with the
/// server-side fields it needs (etcd: key and session; ZooKeeper: node, guid, session
/// generation).
struct QueueEntry : std::enable_shared_from_this<QueueEntry> {
  QueueEntry(std::string_view entry_name, std::string_view entry_owner)
      : name(entry_name), owner(entry_owner) {}
  virtual ~QueueEntry() = default;
  QueueEntry(const QueueEntry&) = delete;
  QueueEntry& operator=(const QueueEntry&) = delete;

  const std::string name;
  const std::string owner;
  // Guarded by QueueRecipe::mutex() (not annotated: an entry holds no path to its recipe,
  // so the analysis cannot name that mutex from here).
  std::uint64_t token = 0;        ///< the place's creation revision / czxid; 0 while unknown
  bool held = false;              ///< granted to the engine and not released or lost since
  Clock::time_point confirmed{};  ///< held: when the hold was last confirmed (store's choice)
};
using QueueEntryPtr = std::shared_ptr<QueueEntry>;

/// A store's own entry type behind a QueueEntry the recipe hands it back (a store only
/// ever sees entries it made).
template <class Entry>
Entry& entry_of(QueueEntry& e) noexcept {
  return static_cast<Entry&>(e);
}
template <class Entry>
const Entry& entry_of(const QueueEntry& e) noexcept {
  return static_cast<const Entry&>(e);
}

/// Where an entry's place stands after QueueStore::enqueue.
struct QueuePosition {
  enum class Kind {
    first,   ///< the place is first: the store may grant it (see QueueStore::grant)
    behind,  ///< another place is ahead
    again,   ///< the queue changed under the read (or the session did): look again
    busy,    ///< the lock is taken and no place was made (a try without keep_queued)
    /// first, but a lost holder's lock-delay still runs (docs/design.md "Lock-delay"):
    /// not granted; a waiter keeps its place and looks again after `holder_ttl`, a try
    /// without keep_queued gives the place up (busy)
    held_back,
    failed,  ///< ec says why; the place, if one was made, is given up
  };
  Kind kind = Kind::failed;
  Clock::time_point sent{};            ///< first: send time of the request that showed it
  Millis validity{};                   ///< first: what the store offers, counted from `sent`
  std::optional<Millis> holder_ttl{};  ///< behind / busy: the holder's lease is at most this away
};

/// The server's side of the recipe.
class QueueStore {
 public:
  virtual ~QueueStore() = default;

  // `started` below is when the try_acquire call began: a store that waits (for a
  // connection, for answers) bounds the whole call from it.

  /// Checks a request before anything is sent (TTL limits, a usable session). False,
  /// with `ec`, refuses it.
  virtual bool admit(const AcquireRequest& req, Clock::time_point started, Error& ec) = 0;
  /// A new entry for `req`, in the current session; its place is made by enqueue.
  virtual QueueEntryPtr new_entry(const AcquireRequest& req, Error& ec) = 0;
  /// Under mutex(): the session `e` was made in still lives (and, as far as this client
  /// knows, still has e's place).
  virtual bool live(const QueueEntry& e) const = 0;
  /// Under mutex(): a queued `e` may go on serving `req` (live, made on the same terms).
  virtual bool reusable(const QueueEntry& e, const AcquireRequest& /*req*/) const { return live(e); }
  /// Makes e's place unless it has one, and reads where it stands. The only thread
  /// that writes e's store fields outside mutex() is the one running this.
  virtual QueuePosition enqueue(QueueEntry& e, const AcquireRequest& req, Clock::time_point started,
                                Error& ec) = 0;
  /// Under mutex(): `e` was first at `pos.sent`. The validity to report (counted from
  /// pos.sent), or nullopt when the session that answered has ended since (its place
  /// went with it). Records the confirmation the store counts stale holds from.
  virtual std::optional<Millis> grant(QueueEntry& e, const QueuePosition& pos) = 0;

  enum class Watch { watching, gone, failed };
  /// Watches the place just before e's (on_change(name) when it goes). gone: there is
  /// none any more, look again.
  virtual Watch watch_predecessor(QueueEntry& e, Clock::time_point started, Error& ec) = 0;

  enum class Deleted {
    deleted,  ///< e's place was there and is gone now
    gone,     ///< nothing of e was there (never made, deleted, or its session ended)
    retry,    ///< unknown (no answer): keep it as an orphan and try again later
    failed,   ///< refused for good; ec says why
  };
  /// Deletes e's place (only if it is still e's: version or revision checked).
  virtual Deleted delete_place(QueueEntry& e, Error& ec) = 0;

  /// Confirms held entries in one batch: one status per entry into `out`. `ec` set
  /// means every entry is unknown (failed).
  virtual void confirm(std::span<QueueEntry* const> entries, std::span<RenewStatus> out,
                       Clock::time_point sent, Error& ec) = 0;
  /// Under mutex(): a confirmation sent at `sent` succeeded for `e`.
  virtual void confirmed(QueueEntry& e, Clock::time_point sent) = 0;

  /// `e` left the table (released, given up, lost): drop what the store keeps for it
  /// (a watch). Without mutex().
  virtual void forgotten(QueueEntry& /*e*/) noexcept {}
  /// An orphan was added: the keeper may want to run sooner. Without mutex().
  virtual void orphans_waiting() noexcept {}
};

class QueueRecipe {
 public:
  QueueRecipe(QueueStore& store, std::shared_ptr<Clock> clock, Logger log)
      : store_(store), clock_(std::move(clock)), log_(std::move(log)) {}
  QueueRecipe(const QueueRecipe&) = delete;
  QueueRecipe& operator=(const QueueRecipe&) = delete;

  void set_listener(ChangeListener* listener) noexcept { listener_.store(listener); }
  ChangeListener* listener() const noexcept { return listener_.load(); }
  /// Guards the table, the orphans, every QueueEntry's fields and the store's state.
  AnnotatedMutex& mutex() const noexcept DISTLOCK_RETURN_CAPABILITY(mu_) { return mu_; }

  // ---- the Backend calls ----------------------------------------------------
  AcquireResult try_acquire(const AcquireRequest& req, Error& ec);
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept;
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec);
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token, Error& ec);

  // ---- for the store's sessions and keeper ------------------------------------
  /// Under mutex(): calls f(entry) for every entry.
  template <class F>
  void for_each_locked(F&& f) const DISTLOCK_REQUIRES(mu_) {
    for (const auto& [key, e] : entries_) f(*e);
  }
  /// Under mutex(): the table's entry of (name, owner), null when there is none.
  QueueEntry* find_locked(std::string_view name, std::string_view owner) const DISTLOCK_REQUIRES(mu_) {
    auto it = entries_.find(name_owner_key(name, owner));
    return it == entries_.end() ? nullptr : it->second.get();
  }
  /// Under mutex(): removes and returns the entries `pred` accepts.
  template <class Pred>
  std::vector<QueueEntryPtr> take_locked(Pred&& pred) DISTLOCK_REQUIRES(mu_) {
    std::vector<QueueEntryPtr> out;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (pred(*it->second)) {
        out.push_back(std::move(it->second));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
  /// Under mutex(): drops the orphans `pred` accepts (their session ended: nothing to delete).
  template <class Pred>
  void drop_orphans_locked(Pred&& pred) DISTLOCK_REQUIRES(mu_) {
    for (auto it = orphans_.begin(); it != orphans_.end();) it = pred(**it) ? orphans_.erase(it) : it + 1;
  }
  /// Under mutex(): whether any orphan waits, and takes them all.
  bool has_orphans_locked() const noexcept DISTLOCK_REQUIRES(mu_) { return !orphans_.empty(); }
  std::vector<QueueEntryPtr> take_orphans_locked() DISTLOCK_REQUIRES(mu_) {
    return std::exchange(orphans_, {});
  }

  /// A session ended and took `entries` (taken with take_locked) with it: each hold is
  /// lost, each waiter looks again. Without mutex().
  void end_session(const std::vector<QueueEntryPtr>& entries) noexcept;
  /// Holds the engine no longer renews (taken with take_locked: the engine declared them
  /// lost, its deadline is earlier): reported lost and their places deleted, so they do
  /// not block the lock while this client's session lives. Without mutex().
  void drop_stale(const std::vector<QueueEntryPtr>& entries) noexcept;
  /// Deletes `orphans` (taken with take_orphans_locked); those still unknown are kept.
  /// Returns how many were deleted. Without mutex().
  std::size_t retry_orphans(std::vector<QueueEntryPtr> orphans) noexcept;
  /// Keeps `e` (out of the table) to delete later.
  void orphan(QueueEntryPtr e) noexcept;

 private:
  /// store_.live(e), under mutex(). Without mutex().
  bool live_entry(const QueueEntryPtr& e) const;
  /// Whether `e` is still the table's entry under `key`. Without mutex().
  bool in_table(const std::string& key, const QueueEntryPtr& e) const;
  /// Removes `e` from the table if it is still there. Without mutex().
  void forget(const QueueEntryPtr& e) noexcept;
  /// Deletes e's place now, or keeps it as an orphan. Without mutex().
  void give_up(const QueueEntryPtr& e) noexcept;
  /// Our orphans of lock `name` would queue ahead of a new place: delete them first.
  void clear_orphans_of(std::string_view name) noexcept;
  // ---- try_acquire's steps ------------------------------------------------------
  /// The table's entry under `key` if it may queue again for `req`; one that may not
  /// (held: the engine declared that hold lost) leaves the table and is given up.
  /// Null when there is none to reuse. Without mutex().
  QueueEntryPtr reusable_entry(const std::string& key, const AcquireRequest& req);
  /// Lists the new entry `e` under `key`; false (not listed) when its session has ended
  /// already. Without mutex().
  bool add_entry(const std::string& key, const QueueEntryPtr& e);
  /// `e` is first in its queue (`pos`): granted if it is still the table's entry under
  /// `key` and the store grants it; else given up and nullopt (queue anew). Without mutex().
  std::optional<AcquireResult> grant_first(const std::string& key, const QueueEntryPtr& e,
                                           const QueuePosition& pos);

  QueueStore& store_;
  const std::shared_ptr<Clock> clock_;
  Logger log_;
  std::atomic<ChangeListener*> listener_{nullptr};

  mutable AnnotatedMutex mu_;
  std::map<std::string, QueueEntryPtr, std::less<>> entries_ DISTLOCK_GUARDED_BY(mu_);  // name '\0' owner
  std::vector<QueueEntryPtr> orphans_ DISTLOCK_GUARDED_BY(mu_);
};

/// A Backend (`Base`: Backend or RecordsBackend<...>) whose locks run on a QueueRecipe:
/// the listener and the four lock calls go to recipe(); the rest stays the backend's.
template <class Base>
class QueueBackend : public Base {
 public:
  void set_listener(ChangeListener* listener) override { recipe().set_listener(listener); }
  AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override {
    return recipe().try_acquire(req, ec);
  }
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override {
    recipe().cancel_acquire(name, owner);
  }
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) override {
    recipe().renew(items, out, ec);
  }
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        Error& ec) override {
    return recipe().release(name, owner, token, ec);
  }

 protected:
  virtual QueueRecipe& recipe() noexcept = 0;
};

}  // namespace distlock::detail
