// distlock/shard_group.hpp — task sharding: one job split into M shards run by several
// members at once, each shard owned by exactly one live member, rebalanced as members join,
// leave or die. Works on every backend that lists its locks and issues fencing tokens
// (file, redis, etcd, zk, postgres, mysql); built on the public API only.
//
// How it works (docs/sharding.md has the guarantees and their assumptions):
//   - each member holds a membership lock `<job>/members/<member-id>`; its lease is the
//     member's liveness (a dead or cut-off member's lease expires within one TTL);
//   - each shard i is an ordinary lock `<job>/shard/<i>` (holder info "member=<id>"), so a
//     shard never has two owners with valid leases, and its fencing tokens strictly increase
//     from one owner to the next: pass OwnedShard::token to every write the shard makes;
//   - each member follows `<job>/members/` and `<job>/shard/` — by watching both prefixes
//     (Client::watch) where the backend can, else by listing both every `rebalance_period` —
//     and computes the same assignment from the sorted live member set and the current owners:
//     balanced (each of W members owns floor(M/W) or ceil(M/W) shards) and sticky (a shard
//     stays with its live owner unless balance requires a move);
//   - a member that must give a shard up first fires the shard's stop token (its local users
//     stop), then releases the lock; the member it moves to is already waiting on that lock
//     and is woken by the release (FIFO hand-off) — cooperative, never two owners.
// Where the backend watches (redis, redis+sentinel, etcd, zk, postgres), a join, a leave or a
// death is an event and the steady state makes no listing (one safety re-list every
// max(100 periods, 30 s)); elsewhere (file, mysql, redis+cluster, redlock) it is polled, one
// list of each prefix per period. The hand-off itself is notification-driven everywhere.
//
// Thread-safety: a ShardGroup is owned by one thread (move-only); assigned(), wait_change(),
// stats() and member_id() may be called from any thread concurrently. The group runs one
// background thread (plus one waiting thread per shard it is about to take, and, watching,
// one reader thread per watch, which never runs user code); `on_change` runs
// on the background thread, one call at a time: keep it short (it delays the next rebalance).
// In a child forked from the member's process the group is the parent's: it owns nothing there
// (assigned() is empty, every OwnedShard::held() is false), and leave() or the destructor in
// the child return at once without touching the parent's shards or membership.
//
// Example:
//   auto client = distlock::connect("redis://127.0.0.1:6379");
//   distlock::ShardGroupOptions opts;
//   opts.lock.ttl = std::chrono::seconds(10);
//   distlock::ShardGroup member = client.shard_group("reindex", 16, opts);
//   distlock::ShardAssignment now = member.wait_change(0, std::chrono::seconds(30));
//   for (const distlock::OwnedShard& s : now.shards)
//     if (s.held()) reindex_shard(s);  // s.token on each write; s.held() right before one
//   member.leave();
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "distlock/client.hpp"
#include "distlock/export.hpp"
#include "distlock/options.hpp"

namespace distlock {

namespace detail {
struct OwnedShardCheck;  // what OwnedShard::held() reads (src/api/shard_group.cpp)
}  // namespace detail

/// One shard this member owns now.
struct DISTLOCK_EXPORT OwnedShard {
  std::uint32_t index = 0;
  /// The shard lock's fencing token (strictly increasing per shard across owners); nullopt
  /// on a backend without tokens.
  std::optional<std::uint64_t> token;
  /// Fires when this member stops owning the shard: before it releases the shard for a
  /// rebalance or leave(), and when the shard's lease is lost (at the conservative local
  /// deadline, before the server can let another owner in).
  std::stop_token stop;

  /// True while this member owns the shard: its lease is held, its conservative local deadline
  /// has not passed, and the member has not given it up (rebalance, leave()). Evaluated at the
  /// moment of the call against the lease's deadline as renewals move it — the rule of
  /// Lease::owns() — so it is never late: `stop` is fired by the client's watchdog thread,
  /// which a starved or stopped process may run after the deadline has passed, so a false
  /// here can come before `stop` fires. Call it right before a write that cannot carry the
  /// token; a true answer holds until the deadline it was read against, not for long after
  /// (docs/sharding.md, "Checking ownership"). False for a default-constructed OwnedShard.
  /// Thread-safe: any thread, at any time, also after the group left or was destroyed;
  /// copies of an OwnedShard share the check. noexcept, no round trip.
  bool held() const noexcept;
  /// Time left until the shard lease's local deadline, by the rule of held(): zero once held()
  /// is false. A user (or `distlock run --shards`) that must act on the deadline itself, not
  /// on the late watchdog's stop, wakes up after this long and calls held() again.
  Millis remaining() const noexcept;

  /// The shard's lease as held() reads it; set by the group (empty: never held).
  std::shared_ptr<const detail::OwnedShardCheck> check;
};

/// What a member owns, as of one moment.
struct DISTLOCK_EXPORT ShardAssignment {
  /// Grows by one at every change of `shards`; 0 before the first assignment.
  std::uint64_t version = 0;
  /// Sorted by index.
  std::vector<OwnedShard> shards;
  /// Live members (this one included) at the last rebalance.
  std::size_t members = 0;
};

/// Counters of one member (each read is a snapshot).
struct DISTLOCK_EXPORT ShardGroupStats {
  std::size_t shards_owned = 0;
  std::uint64_t rebalances = 0;       ///< rebalances whose target differed from the previous one
  std::uint64_t shards_taken = 0;     ///< shards this member acquired
  std::uint64_t shards_given_up = 0;  ///< shards it released for a rebalance or leave()
  std::uint64_t shards_lost = 0;      ///< shard leases lost (renewal failed, deadline passed)
  std::uint64_t membership_lost = 0;  ///< membership leases lost (it then gives up every shard and rejoins)
  std::uint64_t list_failures = 0;    ///< rebalances skipped because a list failed
  /// Attempts to rejoin after a lost membership that the server refused (errc::busy: the id's
  /// lock is held). Normal for up to one TTL (this member's own record has not expired on the
  /// server yet); a count that keeps rising past that means another live process holds this
  /// member id, and this member owns no shard until that one leaves (docs/sharding.md, "Member
  /// ids"). Attempts that failed otherwise (server unreachable) are not counted here; the
  /// rebalance's lists fail too (list_failures).
  std::uint64_t rejoin_failures = 0;
  /// Whether this member follows the group by watching it (Client::watch: redis://,
  /// redis+sentinel://, etcd://, zk://, postgres://) rather than by listing it every period.
  bool watching = false;
  /// Gaps its watches reported (each followed by the watch's re-list of the group).
  std::uint64_t watch_gaps = 0;
  /// Safety re-lists of a watching member applied to its view (docs/sharding.md).
  std::uint64_t safety_relists = 0;
  /// From the last time this member's target changed until it owned exactly its target;
  /// nullopt until that happened once.
  std::optional<Millis> last_rebalance_time;
};

/// Settings of one member.
struct DISTLOCK_EXPORT ShardGroupOptions {
  /// Options of the membership and shard leases (ttl, renew_interval, safety_margin,
  /// max_hold). `wait`, `cancel` and `holder_info` are ignored: the group sets them.
  LockOptions lock{};
  /// Polling (a backend that cannot watch): how often the member lists the group and
  /// rebalances; a join or death is noticed within one period (a death after its TTL).
  /// Watching: a join or death is an event, rebalanced at once; the member still re-plans
  /// from its view once a period (no round trip: retries of a failed rejoin or acquisition)
  /// and re-lists the group every max(100 periods, 30 s). Default 1 s; must be in [10 ms, 1 h].
  Millis rebalance_period{std::chrono::seconds(1)};
  /// This member's id: 1..64 bytes of [A-Za-z0-9_.-], unique in the group. Default:
  /// "<client id>-<n>" (n counts the groups this process made).
  std::string member_id{};
  /// A description for people, stored in the membership lock's holder info
  /// ("shards=<M> <info>"): printable ASCII without '|', cut to fit.
  std::string info{};
  /// Called on the group's thread with the new assignment each time it changes (after a
  /// shard was taken, given up or lost). A callback that throws is ignored.
  std::function<void(const ShardAssignment&)> on_change{};
};

/// A member of the shard group `job` of `shards` shards (Client::shard_group).
class DISTLOCK_EXPORT ShardGroup {
 public:
  /// Joins: takes the membership lock and starts the background thread (the first
  /// rebalance runs at once). Throws std::system_error: errc::invalid_argument (empty job,
  /// shards outside 1..65536, a bad option or member id), errc::busy (the member id is
  /// in use), errc::not_supported (the backend cannot list its locks), and the errors of
  /// Client::acquire / Client::list.
  ShardGroup(Client client, std::string job, std::uint32_t shards, ShardGroupOptions opts = {});
  ShardGroup(ShardGroup&&) noexcept;
  ShardGroup& operator=(ShardGroup&&) noexcept;
  ShardGroup(const ShardGroup&) = delete;
  ShardGroup& operator=(const ShardGroup&) = delete;
  /// leave().
  ~ShardGroup();

  /// The shards owned now.
  ShardAssignment assigned() const;
  /// Blocks until the assignment's version is greater than `after_version` or `timeout`
  /// passes (or the member left), then returns the assignment of that moment.
  /// `timeout` of LockOptions::max_wait (100 years) or more waits without a limit.
  ShardAssignment wait_change(std::uint64_t after_version, Millis timeout) const;
  /// Fires every shard's stop token, releases every shard and the membership at once,
  /// and stops the background thread. Idempotent; noexcept (a failed release is left to
  /// the TTL). A later call (the destructor's too) returns once the first one has finished
  /// and the background thread has ended — after an on_change that called leave() has
  /// returned — so no callback of the group runs after it; called on the group's own
  /// thread (from on_change) or from a stop callback that leave() itself fired, it returns
  /// at once.
  void leave() noexcept;

  const std::string& member_id() const noexcept;
  const std::string& job() const noexcept;
  std::uint32_t shards() const noexcept;
  ShardGroupStats stats() const;
  /// stats() in the Prometheus text exposition format, version 0.0.4, every series labelled
  /// `job`: distlock_shard_owned (gauge), distlock_shard_rebalances_total,
  /// distlock_shard_taken_total, distlock_shard_given_up_total, distlock_shard_lost_total,
  /// distlock_shard_membership_lost_total, distlock_shard_list_failures_total,
  /// distlock_shard_rejoin_failures_total and
  /// distlock_shard_last_rebalance_seconds (gauge; absent until a rebalance completed).
  /// docs/metrics.md lists them.
  std::string metrics() const;

  /// The lock names the group uses: "<job>/members/<member_id>" and "<job>/shard/<index>".
  static std::string member_lock_name(std::string_view job, std::string_view member_id);
  static std::string shard_lock_name(std::string_view job, std::uint32_t index);

  struct Core;  // the implementation (src/api/shard_group.cpp)

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace distlock
