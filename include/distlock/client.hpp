// distlock/client.hpp — connect to a lock service and take leases on names.
//
// A `Client` is one connection set to one backend, chosen by URL (each scheme exists when
// its component was built; `distlock urls` and describe_url_schemes() list the query keys):
//   file:///absolute/dir                                   this host only (kernel locks)
//   redis://[user:password@]host[:port][/db]               one Redis server
//   rediss://[user:password@]host[:port][/db]              one Redis server over TLS
//   redis+sentinel://[user:password@]h1[:p1][,h2[:p2]...]/master-name
//                                                          the master Redis Sentinels name
//   redis+cluster://[user:password@]h1[:p1][,h2[:p2]...]   a Redis Cluster
//   redlock://[user:password@]h1:p1,h2:p2,h3:p3[,...]      a quorum of independent Redis masters
//   redlocks://[user:password@]h1:p1,h2:p2,h3:p3[,...]     the same over TLS
//   etcd://[user:password@]h1[:p1][,h2[:p2]...]            an etcd v3 cluster
//   zk://[user:password@]h1[:p1][,h2[:p2]...][/chroot]     a ZooKeeper ensemble
//   postgres://[user:password@]host[:port]/database        one PostgreSQL primary
//   postgresql://...                                       the same as postgres://
//   mysql://[user:password@]host[:port]/database           one MySQL or MariaDB primary
//   memory://store                                         an in-process store, for tests
// With an empty URL: $DISTLOCK_URL, else file:// in the host-local default directory
// ($XDG_RUNTIME_DIR/distlock, else /tmp/distlock-<uid>).
//
// Every lock is a lease: the client's single background renewer extends all of
// its held leases in batches every `renew_interval`; if a renewal does not succeed
// before the local deadline (last successful renewal's send time + ttl - margin),
// the lease is declared lost, its stop token fires and `owns()` turns false.
//
// Thread-safety: `Client` is a cheap, copyable handle; all members may be called
// from any thread concurrently. A `Lease` is move-only and belongs to one thread
// at a time; `Mutex` is shared by threads like a std::mutex.
//
// Example:
//   auto client = distlock::connect("redis://127.0.0.1:6379");
//   {
//     distlock::Lease lease = client.acquire("orders/42");      // waits until held
//     std::stop_token stop = lease.stop_token();                 // fires on loss
//     write_order(lease.token(), stop);                          // pass the fencing token on
//   }                                                            // released here
//   distlock::Mutex m = client.mutex("nightly-report");
//   if (std::unique_lock lk(m, std::try_to_lock); lk) run_report();
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/error.hpp"
#include "distlock/export.hpp"
#include "distlock/hold.hpp"
#include "distlock/options.hpp"
#include "distlock/tracing.hpp"

namespace distlock {

namespace detail {
class Engine;
class Error;
struct HeldLock;
struct ClientAccess;
}  // namespace detail

/// A held lease on one name. Move-only RAII: the destructor releases it
/// (noexcept; a failed release is logged and counted, never thrown). A Hold
/// (distlock/hold.hpp), as ReadWriteLease is.
class DISTLOCK_EXPORT Lease : public Hold {
 public:
  Lease() noexcept = default;
  Lease(Lease&&) noexcept;
  Lease& operator=(Lease&&) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() override;

  /// True while the lease is held and its conservative local deadline has not passed.
  bool owns() const noexcept override;

  /// The lock's name as given to acquire().
  const std::string& name() const noexcept override;

  /// The fencing token: strictly increasing per lock name across all holders and
  /// client restarts. Throws `errc::not_supported` where the backend has none
  /// (Redlock); check `has_token()` first.
  std::uint64_t token() const override;
  bool has_token() const noexcept override;

  /// Fires when the lease is lost (renewal refused, deadline passed, session gone).
  /// Not fired by an orderly release.
  std::stop_token stop_token() const noexcept override;

  /// Runs `fn` once when the lease is lost (queued at once if it already is).
  ///
  /// Which thread: every on_lost callback of a Client runs on that client's one event
  /// thread, one at a time, in the order the losses were declared (a lease's own
  /// callbacks in the order added) -- never on the thread that detected the loss (the
  /// renewer, the watchdog, a backend's notifier, or a user thread in release() or
  /// acquire()), never on the caller of on_lost().
  ///
  /// The loss signal does not wait for callbacks: `owns()` turns false and the stop
  /// token is requested on the detecting thread before any callback is queued, so a
  /// thread that sees the stop token may not yet see a callback's effects. Hence
  /// `std::stop_callback`s registered on stop_token() run synchronously on the detecting
  /// thread (or on the registering thread if the token already fired), like any
  /// std::stop_source's: keep them short and non-blocking; use on_lost for real work.
  ///
  /// A callback that blocks delays only the client's later callbacks, never a loss
  /// signal, a renewal or an acquisition. A callback that throws is logged at error
  /// level and dropped; the next callback still runs. A callback may call back into
  /// the client (acquire, even with a wait; release; on_lost) without deadlock, but must
  /// not wait for another callback of the same client (they run one after another).
  /// When the last Client handle goes, callbacks already queued still run first.
  void on_lost(std::function<void()> fn) override;

  /// Time left until the local deadline (zero when lost or released).
  Millis remaining() const noexcept override;

  /// Time left until LockOptions::max_hold ends the lease (zero once it has);
  /// nullopt without a max_hold, or when not held.
  std::optional<Millis> max_hold_remaining() const noexcept override;

  /// Why the lease was lost: LossReason::none while it is held, after an orderly
  /// release and for an empty Lease; `forked` in a forked child. A lease past its
  /// local deadline that the watchdog has not declared yet already answers
  /// local_deadline (or max_hold).
  LossReason loss_reason() const noexcept override;
  /// One sentence on the loss for people ("max_hold 5s reached", "the server says
  /// another owner (or nobody) holds it", "revoked by <id> (<info>): <reason>", ...);
  /// empty when loss_reason() is none.
  std::string loss_detail() const override;
  /// The reason text given to Client::revoke when loss_reason() is revoked; nullopt
  /// otherwise (held, released, or lost another way).
  std::optional<std::string> revoke_reason() const;

  /// The trace context of this lease's hold span (distlock/tracing.hpp): what the work done
  /// under the lock takes as its parent (a child process's TRACEPARENT). nullopt when the
  /// client has no tracer, and for an empty Lease.
  std::optional<TraceContext> trace_context() const;

  /// Releases now. Throws `errc::lost` if the lease had been lost (nothing on the
  /// server is touched then), `errc::backend_unavailable` if the server could not
  /// be reached (the lease then expires by its TTL).
  void release() override;
  void release(std::error_code& ec) noexcept override;

 private:
  friend class detail::Engine;
  friend class Mutex;
  friend class Client;
  friend class Semaphore;
  DISTLOCK_NO_EXPORT Lease(std::shared_ptr<detail::Engine> engine,
                           std::shared_ptr<detail::HeldLock> held) noexcept;
  std::shared_ptr<detail::Engine> engine_;
  std::shared_ptr<detail::HeldLock> held_;
};

/// What a backend can tell about a lock (`Client::status`).
struct DISTLOCK_EXPORT LockInfo {
  bool held = false;
  std::optional<std::uint64_t> token;   ///< current (last issued) fencing token, if known
  std::optional<Millis> ttl_remaining;  ///< server-side time to expiry, if known
  std::optional<std::string> holder;    ///< holder's owner id, if known
  /// The holder's description (LockOptions::holder_info) when it set one.
  std::optional<std::string> holder_info;
  std::optional<std::uint64_t> waiters;  ///< number of waiting clients, if known
  /// True when the backend listed its queue: `waiter_list` then holds every live waiter
  /// in hand-off order (positions 1, 2, ...) and `waiters` is its size. False where the
  /// backend cannot list its waiters honestly (docs/design.md "Seeing the queue"): the
  /// list is then empty, whatever `waiters` says.
  bool waiters_listed = false;
  std::vector<WaiterInfo> waiter_list;
};

/// What Client::revoke did.
struct DISTLOCK_EXPORT RevokeResult {
  /// A holder's lease was ended; false: the lock was free (nothing was done).
  bool revoked = false;
  std::optional<std::uint64_t> token;  ///< the revoked lease's fencing token, where there is one
  std::optional<std::string>
      holder;  ///< the revoked holder's owner id; none when the backend cannot tell whose lease it ended
               ///< (redlock:// with masters silent, docs/redlock.md)
  std::optional<std::string> holder_info;  ///< its description (LockOptions::holder_info), if it set one
};

/// The note the last revoke of a lock left beside it (Client::last_revoke, `distlock
/// status`), kept for RevokeRecord::kept after the revoke.
struct DISTLOCK_EXPORT RevokeRecord {
  static constexpr std::chrono::hours kept{24 * 7};
  std::chrono::system_clock::time_point at;  ///< the revoker's wall clock at the call
  std::string by;                            ///< the revoker's client id
  std::optional<std::string> by_info;        ///< the revoker's description (lock_defaults.holder_info)
  std::string reason;                        ///< the reason text given
  std::optional<std::uint64_t> token;        ///< the token of the lease revoked, where there is one
  std::string holder;                        ///< the revoked holder's owner id
  std::optional<std::string> holder_info;    ///< its description, if it set one
};

/// What a listed lock is part of. The primitives are made of ordinary locks whose
/// names are derived from the user's name with the separator '\x1f':
/// "<name>\x1fsem\x1f<i>" (semaphore permit i), "<name>\x1frw\x1fw" (read-write lock,
/// writer intent), "<name>\x1frw\x1f<i>" (read-write lock, reader slot i),
/// "<name>\x1felect" (election leadership).
enum class LockKind { lock, semaphore_permit, rw_writer, rw_reader, election };

/// One held lock as `Client::list` returns it.
struct DISTLOCK_EXPORT ListedLock {
  std::string name;  ///< the stored name (a derived name for a primitive's part)
  LockInfo info;     ///< what status(name) would say (held is true)
  LockKind kind = LockKind::lock;
  std::string base;                    ///< the user's name: `name` itself for a plain lock
  std::optional<std::uint32_t> index;  ///< permit or reader slot number
  /// A semaphore's permits N / a read-write lock's reader slots R, from its stored
  /// definition, when readable.
  std::optional<std::uint32_t> of;
  /// For people: "lock", "semaphore permit 2 of 5", "rw writer", "rw reader slot 3",
  /// "election".
  std::string display;
};

/// Relaxed counters (for metrics; each read is a snapshot). Client::stats() may be called
/// from any thread at any time; each field is one relaxed atomic load, so two fields of one
/// snapshot may be read a moment apart (a call in flight may show in one and not yet in the
/// other). Every count is monotonic for the life of the client.
struct DISTLOCK_EXPORT ClientStats {
  std::uint64_t acquired = 0;
  std::uint64_t released = 0;
  std::uint64_t release_failures = 0;
  std::uint64_t renew_round_trips = 0;  ///< renewal batches sent (each one round trip or more)
  /// Every request/response exchange this client's backend made with its servers: a
  /// command or script call, a pipelined batch (one), a listing's SCAN page (one each),
  /// a gRPC call attempt, a ZooKeeper request (a multi is one), a watch's (un)subscribe;
  /// renewals and background work (queue refreshes, pub/sub pings) included. Counted on
  /// redis://, rediss://, redis+sentinel://, redis+cluster://, etcd:// and zk://; always 0
  /// on redlock://, file://, postgres:// and mysql:// (not counted in this version).
  std::uint64_t round_trips = 0;
  std::uint64_t renewed_leases = 0;
  std::uint64_t lost = 0;
  std::uint64_t brain_splits = 0;  ///< a renewal found another owner while we thought we held it
};

class Mutex;
class MultiLease;
class Semaphore;
class SharedMutex;
class Election;
class ShardGroup;
struct ShardGroupOptions;
class Watch;
struct WatchOptions;

/// A connection to one lock service. Copies share the same connections, renewer
/// and owner identity (128 random bits from the OS, plus the calling thread).
class DISTLOCK_EXPORT Client {
 public:
  /// Acquires `name`, waiting up to `opts.wait` (forever if unset). A Lease is not
  /// reentrant (it may be moved to another thread): acquiring a name this client
  /// already holds through a Lease waits for that Lease, like std::timed_mutex.
  /// Reentrancy per thread is `Mutex`'s.
  /// Throws `std::system_error`: errc::timeout, errc::busy (wait of 0),
  /// errc::invalid_argument, errc::backend_unavailable, errc::auth_failed, ...
  Lease acquire(std::string_view name, const LockOptions& opts);
  Lease acquire(std::string_view name);  ///< with the client's lock_defaults
  Lease acquire(std::string_view name, const LockOptions& opts, std::error_code& ec) noexcept;

  /// One attempt; an empty optional when somebody else holds it.
  std::optional<Lease> try_acquire(std::string_view name, const LockOptions& opts);
  std::optional<Lease> try_acquire(std::string_view name);

  /// Acquires every one of `names` or none (distlock/multi_lease.hpp): in sorted order,
  /// duplicates dropped, so overlapping sets cannot deadlock; `opts.wait` bounds the
  /// whole call and the names already taken are released before an error is thrown.
  /// Throws as acquire() (errc::timeout, errc::busy for a wait of 0, ...);
  /// errc::invalid_argument for an empty list or an empty name.
  MultiLease acquire_all(const std::vector<std::string>& names, const LockOptions& opts);
  MultiLease acquire_all(const std::vector<std::string>& names);  ///< with lock_defaults
  MultiLease acquire_all(const std::vector<std::string>& names, const LockOptions& opts,
                         std::error_code& ec) noexcept;
  /// One attempt on each name, in order; an empty optional (nothing left held) when
  /// somebody else holds one of them.
  std::optional<MultiLease> try_acquire_all(const std::vector<std::string>& names, const LockOptions& opts);
  std::optional<MultiLease> try_acquire_all(const std::vector<std::string>& names);

  /// A standard Lockable/TimedLockable mutex over `name` (reentrant per thread).
  Mutex mutex(std::string_view name, const LockOptions& opts);
  Mutex mutex(std::string_view name);

  /// A counting semaphore of `permits` (1..1024) over `name` (distlock/semaphore.hpp).
  /// The count is stored on the server by the first client that names it; another
  /// count for the same name throws errc::invalid_argument.
  Semaphore semaphore(std::string_view name, int permits, const LockOptions& opts);
  Semaphore semaphore(std::string_view name, int permits);

  /// A read-write lock over `name` (distlock/shared_mutex.hpp): SharedLockable and
  /// SharedTimedLockable, so std::shared_lock and std::unique_lock work.
  SharedMutex shared_mutex(std::string_view name, const LockOptions& opts);
  SharedMutex shared_mutex(std::string_view name);
  /// A leader election over `name` (distlock/election.hpp); `opts` are the
  /// leadership lease's options.
  Election election(std::string_view name, const LockOptions& opts);
  Election election(std::string_view name);
  /// Joins the shard group `job` of `shards` shards as a new member
  /// (distlock/shard_group.hpp; include it to use the result).
  ShardGroup shard_group(std::string_view job, std::uint32_t shards, const ShardGroupOptions& opts);
  ShardGroup shard_group(std::string_view job, std::uint32_t shards);

  /// Watches every lock whose name starts with `prefix` (distlock/watch.hpp; include it
  /// to use the result): acquired, released, lost and revoked events per name in token
  /// order, gaps reported. Throws errc::not_supported where the backend publishes no
  /// changes, errc::backend_unavailable when the subscription or the first state read
  /// fails.
  Watch watch(std::string_view prefix, const WatchOptions& opts);
  Watch watch(std::string_view prefix);

  /// What the backend knows about `name` (held, token, ttl, holder, waiters; the queue: waiter_list).
  LockInfo status(std::string_view name);
  LockInfo status(std::string_view name, std::error_code& ec) noexcept;

  /// Revoke: ends the lease of whoever holds `name` now (another process, another host),
  /// without the holder's cooperation and with no server rights beyond the lock's own.
  /// In one step on the server the holder's lease can no longer be renewed, the lock goes
  /// to the next waiter (queue order kept) once that lease has run out on the server (at
  /// most one TTL after the holder's last renewal), and a note (reason, who, when,
  /// the token revoked) is kept beside the lock for RevokeRecord::kept. The holder learns
  /// it at its next renewal (within one renew_interval plus a round trip): its stop token
  /// fires, loss_reason() is LossReason::revoked, revoke_reason() is `reason`. The next
  /// holder's token is larger, so the revoked holder's fenced writes are refused.
  /// The next holder is granted only after the revoked holder's lease could no longer be
  /// valid: the two never overlap (docs/design.md "Revoke").
  /// `reason`: 1 to 1024 bytes of text without control characters (no newline, escape or
  /// NUL: it is printed in logs and `distlock status`). A free lock is no error: {revoked = false}.
  /// Throws errc::invalid_argument (name, reason), errc::not_supported where the backend
  /// cannot end another process's hold (file://, PostgreSQL and MySQL advisory locks:
  /// docs/design.md "Revoke"), or the backend's error. Logged at warning level, counted in
  /// distlock_revokes_total.
  RevokeResult revoke(std::string_view name, std::string_view reason);
  RevokeResult revoke(std::string_view name, std::string_view reason, std::error_code& ec) noexcept;
  /// The note of the last revoke of `name`, nullopt when there is none (never revoked,
  /// or longer ago than RevokeRecord::kept). Throws as revoke().
  std::optional<RevokeRecord> last_revoke(std::string_view name);

  /// Locks held now whose stored name starts with `prefix` (empty: all), sorted by
  /// name, at most `limit` (`truncated` tells whether there were more). Parts of
  /// semaphores, read-write locks and elections are decoded (ListedLock::kind).
  /// May cost a scan of the server's keys: for tools (`distlock list`), not hot
  /// paths. Throws errc::not_supported where the backend cannot list.
  std::vector<ListedLock> list(std::string_view prefix, std::size_t limit = 1000);
  std::vector<ListedLock> list(std::string_view prefix, std::size_t limit, bool& truncated);

  /// Records: short values (any bytes, at most 64 KiB) the lock service keeps beside its
  /// locks and never expires, for state that belongs with a lock and must outlive its
  /// holders, e.g. when a job last ran (`distlock run --once-per` keeps its mark as the
  /// record "once" of the lock). A record is named by a lock name `name` (not empty, no NUL)
  /// and a `tag` (1 to 32 bytes of a-z 0-9 '_' '-'); it lives in a namespace of its own
  /// and never collides with a lock. The tags the library keeps its own records under
  /// ("sem", "rw", "elect") are refused. put_record overwrites; get_record returns nullopt
  /// when there is none. One call is one step on the server; there is no compare-and-set:
  /// write a record while holding the lock it belongs with.
  /// Throws std::system_error whose message begins `record "<tag>" of "<name>"` (the name
  /// cut at 200 bytes, a NUL byte shown as '?') and goes on with the cause:
  /// errc::invalid_argument for a bad name or tag or a value over 64 KiB, errc::not_supported
  /// (": backend <url> keeps no records") where the backend keeps none, or the backend's
  /// error (errc::backend_unavailable, ...).
  /// Thread-safety: as every Client member. Example:
  ///   client.put_record("nightly", "last-run", "2026-11-28T03:00Z");
  ///   std::optional<std::string> last = client.get_record("nightly", "last-run");
  std::optional<std::string> get_record(std::string_view name, std::string_view tag);
  void put_record(std::string_view name, std::string_view tag, std::string_view value);

  /// Whether this backend issues fencing tokens.
  bool has_fencing() const noexcept;
  /// The backend URL with any password masked.
  std::string url() const;
  /// The scheme ("redis", "file", ...).
  std::string scheme() const;
  /// This client's owner id prefix (hex of 128 random bits).
  std::string id() const;
  ClientStats stats() const noexcept;

  /// This client's metrics in the Prometheus text exposition format, version 0.0.4
  /// (serve it with Content-Type `text/plain; version=0.0.4`): acquisitions by result
  /// (ok, busy, timeout, error), acquire wait and hold time histograms, renewals by
  /// answer (ok, not_owner, failed), the renewal round-trip histogram, losses by
  /// reason, releases by result and the leases held now. Every series is labelled
  /// `backend` (the URL scheme) and, except the round trips and the gauge, `prefix`:
  /// the lock name with leading '/' and ':' skipped, up to the next '/' or ':'. The
  /// first 32 distinct prefixes a client sees get their own series; later ones, and
  /// any prefix that is longer than 64 bytes, holds a byte outside [A-Za-z0-9_.-] or
  /// is empty, count under prefix="other". docs/metrics.md lists every family.
  /// Counters are kept per client (copies share them) and start at zero; empty when
  /// ClientOptions::metrics is false.
  ///
  /// Thread-safety: may be called from any thread while other threads acquire,
  /// release and renew; each counter is read atomically, so a scrape is a snapshot
  /// per counter (a histogram's _count always equals its +Inf bucket).
  ///
  /// Example:
  ///   auto client = distlock::connect("redis://127.0.0.1:6379");
  ///   { auto lease = client.acquire("orders/42"); }
  ///   std::string text = client.metrics();
  ///   // distlock_acquisitions_total{backend="redis",prefix="orders",result="ok"} 1
  ///   // distlock_releases_total{backend="redis",prefix="orders",result="ok"} 1
  std::string metrics() const;

  /// Renews every held lease now (what the background renewer does each tick).
  /// Returns the number of leases renewed. Mostly for tests and benchmarks.
  std::size_t renew_now();

 private:
  friend Client connect(std::string_view url, const ClientOptions& opts);
  friend Client connect(std::string_view url, const ClientOptions& opts, std::error_code& ec) noexcept;
  // The library's own parts (the primitives, the id generators and the tests) reach
  // the engine through detail::ClientAccess (src/api/client_access.hpp), not the public API.
  friend struct detail::ClientAccess;
  explicit Client(std::shared_ptr<detail::Engine> engine) noexcept : engine_(std::move(engine)) {}
  std::shared_ptr<detail::Engine> engine_;
};

/// Connects to the backend named by `url` (see the table above). Throws
/// `std::system_error` with errc::invalid_url (naming the offending part),
/// errc::backend_unavailable or errc::auth_failed.
DISTLOCK_EXPORT Client connect(std::string_view url = {}, const ClientOptions& opts = {});
DISTLOCK_EXPORT Client connect(std::string_view url, const ClientOptions& opts, std::error_code& ec) noexcept;

/// The URL `connect("")` would use: $DISTLOCK_URL, else the host-local default.
DISTLOCK_EXPORT std::string default_url();

/// The URL schemes this build supports, one paragraph each: how the URL is written,
/// what it locks on and, with `with_keys`, every query key it accepts (type, default,
/// meaning for that scheme). connect() rejects any other key. For help texts
/// (`distlock urls`); the text may change between versions.
DISTLOCK_EXPORT std::string describe_url_schemes(bool with_keys = true);

/// A standard Lockable + TimedLockable mutex over one lock name, reentrant per
/// thread: the thread that holds it may lock it again; it is released when the
/// hold count returns to zero. `unlock()` from a thread that does not hold it
/// throws `errc::not_owner`. Works with std::unique_lock, std::scoped_lock,
/// std::lock_guard and try_lock_for/try_lock_until like std::recursive_timed_mutex.
///
/// Example:
///   distlock::Mutex m = client.mutex("cron/cleanup", opts);
///   std::unique_lock lk(m, std::chrono::seconds(5));   // try_lock_for
///   if (lk) { cleanup(m.token()); }
class DISTLOCK_EXPORT Mutex {
 public:
  Mutex(Client client, std::string name, LockOptions opts);

  void lock();
  bool try_lock();
  template <class Rep, class Period>
  bool try_lock_for(const std::chrono::duration<Rep, Period>& d) {
    // Compared in floating point so that any duration type (hours::max() too)
    // saturates instead of overflowing on the way to milliseconds.
    const double ms = std::chrono::duration<double, std::milli>(d).count();
    if (!(ms > 0)) return try_lock_for_ms(Millis(0));
    if (ms >= static_cast<double>(LockOptions::max_wait.count())) return try_lock_for_ms(std::nullopt);
    return try_lock_for_ms(std::chrono::ceil<Millis>(std::chrono::duration<double, std::milli>(ms)));
  }
  template <class ClockT, class Duration>
  bool try_lock_until(const std::chrono::time_point<ClockT, Duration>& tp) {
    const auto now = ClockT::now();
    if (tp <= now) return try_lock_for_ms(Millis(0));
    // tp > now: the difference is positive; taken in floating point, it cannot overflow.
    return try_lock_for(std::chrono::duration<double, std::milli>(tp.time_since_epoch()) -
                        std::chrono::duration<double, std::milli>(now.time_since_epoch()));
  }
  void unlock();
  void unlock(std::error_code& ec) noexcept;

  /// For the calling thread's current hold: fencing token, loss signal, validity.
  std::uint64_t token() const;
  std::stop_token stop_token() const;
  bool owns() const noexcept;
  /// Lease::loss_reason()/loss_detail() of the calling thread's hold (none / empty
  /// when it holds none).
  LossReason loss_reason() const noexcept;
  std::string loss_detail() const;
  /// The calling thread's hold count (0 when it does not hold the lock).
  int hold_count() const noexcept;
  const std::string& name() const noexcept { return name_; }

 private:
  bool try_lock_for_ms(std::optional<Millis> d);  // nullopt: no limit
  Client client_;
  std::string name_;
  LockOptions opts_;
};

}  // namespace distlock

// MultiLease (Client::acquire_all's result) is complete wherever Client is.
#include "distlock/multi_lease.hpp"  // IWYU pragma: export
