// redis/wait_queue.hpp — this client's places in the servers' wait queues (the
// redis:// direct hand-off, docs/redis.md).
//
// One Wait per (name, owner) that waits with a place on the server. It remembers the
// entry id and whether a grant to it arrived. A grant holds the lock only for the
// claim window (lock_scripts.hpp): the waiter claims it from the server, and the
// lease counts from that call. A refresher thread keeps every queued entry alive with
// one batched call four times per entry life (the batch is the owner's `refresh`
// callback); a refresh that finds the entry granted reports it and restarts its claim window.
//
// Every time here is read on the client's injected clock (ClientOptions::clock).
//
// Thread-safety: every member may be called from any thread; the refresh callback
// runs on the refresher thread with no lock held. The destructor stops the thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "distlock/clock.hpp"
#include "distlock/options.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::detail::redis {

class WaitQueue {
 public:
  using TimePoint = Clock::time_point;

  struct Wait {
    std::string name;
    std::string owner;
    std::string entry;
    Millis ttl{};
    bool queued = false;      ///< the server answered "queued" at least once
    bool granted = false;     ///< the server granted the lock to this entry (to be claimed)
    std::uint64_t token = 0;  ///< when granted
  };

  /// The refresh of many entries: one answer per wait (failed: nothing changes).
  struct Answer {
    enum Kind { failed, queued, granted, gone } kind = failed;
    std::uint64_t token = 0;
  };
  using Refresh = std::function<std::vector<Answer>(const std::vector<Wait>& waits)>;
  /// Called (no lock held) for a name whose wait changed: a grant arrived.
  using Wake = std::function<void(std::string_view name)>;
  /// Gives up one wait on the server (hands a grant to it on); false if the server
  /// could not be reached.
  using Cancel = std::function<bool(const Wait& wait)>;

  WaitQueue(std::shared_ptr<Clock> clock, Refresh refresh, Wake wake, Cancel cancel);
  /// The clock every TimePoint here is read on.
  const Clock& clock() const noexcept { return *clock_; }
  ~WaitQueue();
  WaitQueue(const WaitQueue&) = delete;
  WaitQueue& operator=(const WaitQueue&) = delete;

  /// The wait's state an attempt reads (Wait without its name and owner, which the
  /// caller has): the entry id to send, whether it is queued already, a grant to claim.
  struct Begun {
    std::string entry;
    bool queued = false;
    bool granted = false;
    std::uint64_t token = 0;
  };
  /// The wait of (name, owner); a new one with a fresh entry id if there is none.
  Begun begin(std::string_view name, std::string_view owner, Millis ttl);
  /// The wait of (name, owner), if any.
  std::optional<Wait> find(std::string_view name, std::string_view owner) const;
  /// The server answered: the entry is queued.
  void queued(std::string_view name, std::string_view owner, std::string_view entry);
  /// The wait ended (acquired, gone, given up): forgets it if it is still `entry`.
  void forget(std::string_view name, std::string_view owner, std::string_view entry);
  /// A wait given up whose cancel did not reach the server: its entry may still be
  /// queued, or granted (then the lock would sit with nobody until its ttl ends).
  /// The refresher retries the cancel each period, and at once when a grant to it
  /// arrives, until it succeeds or 2 ttl have passed (the entry expired, and so has
  /// any grant to it).
  void abandon(Wait wait);
  /// As abandon(), for a grant to an entry this client does not know, retried for
  /// `retry_for`, starting at once.
  void hand_on(Wait wait, Millis retry_for);
  /// Retries the pending cancels now (before queuing anew after an outage); with `name`,
  /// only those of that name (redis+cluster://: the names of other slots may be on a master
  /// that hangs, and a wait here must not wait out its command timeout; the refresher
  /// retries them).
  void flush_abandoned(std::optional<std::string_view> name = std::nullopt);
  /// A grant message arrived on this client's channel (lock_scripts.hpp). Wakes the
  /// wait's name. A grant of an entry this client does not wait with is returned
  /// (entry, lock key, owner) for the caller to judge: it may be an entry given up
  /// while the server could not be reached, or one queued through a backend this
  /// client replaced (a Sentinel failover); nullopt otherwise.
  struct Unknown {
    std::string entry, lock, owner;
  };
  std::optional<Unknown> on_grant(std::string_view message);
  /// Grant messages may have been missed (the subscription broke): wakes every
  /// waiting name so each re-checks with the server.
  void wake_all();

  std::size_t size() const;
  std::uint64_t grants_received() const;

 private:
  void run();

  const std::shared_ptr<Clock> clock_;
  const Refresh refresh_;
  const Wake wake_;
  const Cancel cancel_;
  // (name, owner), ordered as std::pair<std::string, std::string> would be. Looked up by
  // views: a lookup builds no key strings.
  using NameOwner = std::pair<std::string_view, std::string_view>;
  struct NameOwnerLess {
    using is_transparent = void;
    bool operator()(const NameOwner& a, const NameOwner& b) const noexcept { return a < b; }
  };
  using Waits = std::map<NameOwner, Wait, NameOwnerLess>;

  mutable AnnotatedMutex mu_;
  std::condition_variable cv_;
  // (name, owner) -> wait. Each key views the name and owner of its own wait, which
  // stay in place in the map's node (begin() sets them): no second copy of either.
  Waits waits_ DISTLOCK_GUARDED_BY(mu_);
  // entry id -> its wait in waits_ (erased together with it).
  std::map<std::string, Waits::iterator, std::less<>> by_entry_ DISTLOCK_GUARDED_BY(mu_);
  // entry id -> (wait, give up retrying after)
  std::map<std::string, std::pair<Wait, TimePoint>, std::less<>> abandoned_ DISTLOCK_GUARDED_BY(mu_);
  bool kick_ DISTLOCK_GUARDED_BY(mu_) = false;     // retry the cancels now
  bool changed_ DISTLOCK_GUARDED_BY(mu_) = false;  // an entry or cancel came: recompute the period
  std::uint64_t grants_ DISTLOCK_GUARDED_BY(mu_) = 0;
  bool stop_ DISTLOCK_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace distlock::detail::redis
