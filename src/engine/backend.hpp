// The backend adapter interface: the few primitives a lock service must offer.
// Everything else (reentrancy, renewal scheduling, local deadlines, loss signals,
// waiting with deadlines) lives once in the engine (engine.hpp).
//
// A backend is one folder under src/ whose scheme entries (src/<name>/<name>_scheme.cpp,
// with its factory) src/connect/registry.cpp lists. All calls may come from several
// threads at once (user threads acquire/release, the renewer renews); a backend
// synchronises itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "distlock/client.hpp"
#include "distlock/options.hpp"
#include "engine/backend_error.hpp"
#include "engine/names.hpp"
#include "engine/url.hpp"

namespace distlock::detail {

struct Capabilities {
  bool fencing = true;  ///< issues strictly increasing tokens per name
  bool needs_renewal =
      true;  ///< leases expire unless renewed (false: held until released, e.g. kernel locks)
  /// The server enforces AcquireRequest::lock_delay (docs/design.md "Lock-delay"); the
  /// engine refuses a non-zero lock_delay with errc::not_supported where this is false.
  bool lock_delay = false;
};

struct AcquireRequest {
  std::string_view name;   ///< validated by the engine: non-empty, <= 4096 bytes, no NUL
  std::string_view owner;  ///< unique per client and thread: "<32 hex client id>:<thread seq>"
  Millis ttl{};
  /// Queue-based backends (etcd, ZooKeeper): when busy, keep this owner's place in
  /// the queue because the caller will wait; the engine calls cancel_acquire() if it
  /// gives up. Other backends ignore it.
  bool keep_queued = false;
  /// LockOptions::lock_delay (0: off), only where Capabilities::lock_delay: once this
  /// lease is lost (anything but a release), the server grants the name to nobody before
  /// the lease's end plus this delay; renewals keep that end moving with the lease.
  Millis lock_delay{0};
};

struct AcquireResult {
  bool acquired = false;
  std::uint64_t token = 0;  ///< fencing token when acquired and Capabilities::fencing
  /// When acquired: how long the lease is valid counted from the moment the request
  /// was sent (usually ttl; Redlock subtracts clock drift; a session-based backend
  /// gives its session timeout). The engine uses the same validity after each
  /// successful renewal. 0 means ttl.
  Millis validity{0};
  /// When busy: the current holder's remaining lease, if the backend knows it.
  std::optional<Millis> holder_ttl{};
};

struct RenewItem {
  std::string_view name;
  std::string_view owner;
  std::uint64_t token = 0;
  Millis ttl{};
};

enum class RenewStatus {
  renewed,    ///< extended by ttl from the send time
  not_owner,  ///< the server says somebody else (or nobody) holds it: lost
  failed,     ///< unknown (I/O error); the engine retries until the local deadline
};

/// How put_record treats an existing record.
enum class PutMode {
  always,     ///< overwrite
  if_absent,  ///< keep an existing record (the returned value is then the existing one)
  /// `value` begins with its writer's term ("<term>\n...", see record_term): stored unless
  /// the existing record's term is newer (greater); an existing record without a term is
  /// replaced. The returned value is then the existing one, so the caller tells a refusal
  /// by the answer differing from `value`. One atomic step on the server, like if_absent
  /// (the election's value: an older leader's late write never replaces a newer one's).
  fenced,
};

/// The term a record names for PutMode::fenced: the decimal number (1 to 20 digits, at
/// most 2^64 - 1) before the record's first '\n'; nullopt when the record has no such
/// prefix. The one parser every backend that checks terms in C++ uses.
std::optional<std::uint64_t> record_term(std::string_view record) noexcept;

/// Whether a PutMode::fenced put of `value` may replace the record `existing`: its term
/// is not newer than `value`'s (a record without a term is always replaced).
bool fenced_put_allowed(std::string_view existing, std::string_view value) noexcept;

/// PutMode::fenced on a backend with a compare-and-set: read, decide, then create if
/// absent or replace only if the record is still what was read; a race lost is read again
/// (at most 16 rounds, then errc::backend_unavailable naming the key). A race lost to a
/// put of the same term (the same leader writing from several threads) ends the call: when
/// the record read again is of this term and differs from the one the lost compare-and-set
/// expected, that put landed during this call, so this one counts as the earlier of the
/// two, replaced by it, and `value` is returned as stored. Without that, a leader's own
/// concurrent proclaims used up the 16 rounds (ZooKeeper: 31 of 200 proclaims from 8
/// threads failed).
///   get(Error&) -> std::optional<std::string>   the record now
///   create(Error&) -> std::string                PutMode::if_absent of `value`: what is stored after it
///   replace(std::string_view expected, Error&) -> bool   stored `value` if the record was `expected`
/// Returns the record stored after the call: `value` (also when overtaken by a put of the
/// same term, above), or the newer record that refused it.
template <class Get, class Create, class Replace>
std::string fenced_put_by_cas(std::string_view key, std::string_view value, Get&& get, Create&& create,
                              Replace&& replace, Error& ec) {
  // The record this call read before a compare-and-set it lost (`lost`), or none (`lost`
  // and `lost_absent`: it found no record, then its create found one). A record of this
  // call's term that differs from it was put by another writer during this call.
  std::string lost_at;
  bool lost = false, lost_absent = false;
  const auto overtaken = [&](std::string_view now) {
    return lost && (lost_absent || now != lost_at) && record_term(now) == record_term(value);
  };
  for (int round = 0; round < 16; ++round) {
    std::optional<std::string> now = get(ec);
    if (ec) return {};
    if (!now) {
      std::string stored = create(ec);
      if (ec) return {};
      if (stored == value || !fenced_put_allowed(stored, value)) return stored;
      lost = lost_absent = true;
      if (overtaken(stored)) return std::string(value);
      continue;  // created meanwhile with an older term: decide again
    }
    if (*now == value || !fenced_put_allowed(*now, value)) return std::move(*now);
    if (overtaken(*now)) return std::string(value);
    const bool replaced = replace(std::string_view(*now), ec);
    if (ec) return {};
    if (replaced) return std::string(value);
    lost = true;  // changed since read, or (zk) a connection lost: read again
    lost_absent = false;
    lost_at = std::move(*now);
  }
  ec.fail(errc::backend_unavailable,
          "record \"" + names::printable(key) +
              "\" kept changing during 16 rounds of a fenced put; nothing is known to be stored");
  return {};
}

/// Records: small values kept beside the locks, for the primitives built on them
/// (a semaphore's permit count, an election's proclaimed value, a job's last
/// once-per slot). A record key is validated by the caller like a lock name
/// (non-empty, <= 4096 bytes, no NUL) and lives in a namespace of its own: a
/// record and a lock of the same name never collide, and a record never expires.
/// Values are any bytes, at most kMaxRecordValue.
inline constexpr std::size_t kMaxRecordValue = 64 * 1024;

/// False, with errc::invalid_argument and an error detail naming the key and the size,
/// when `value` is larger than kMaxRecordValue. Every backend's put_record starts here.
bool record_value_fits(std::string_view key, std::string_view value, Error& ec);

/// One held lock, as listed by Backend::list_held.
struct ListedLock {
  std::string name;
  LockInfo info;  ///< what status(name) would say (held is true); fields the backend cannot tell stay empty
};

enum class ReleaseStatus {
  released,
  not_owner,  ///< nothing of ours was there (expired, or taken by another owner); nothing deleted
};

/// Implemented by the engine; backends call it from any thread, never while
/// holding a lock the engine could need to call back into the backend.
class ChangeListener {
 public:
  virtual ~ChangeListener() = default;
  /// A lock of this name may have become free (release notification, watch event).
  virtual void on_change(std::string_view name) noexcept = 0;
  /// Every lease of this client is gone (etcd lease revoked, ZooKeeper session expired).
  virtual void on_session_lost() noexcept = 0;
  /// One lease is gone (its session ended, its node was deleted from outside).
  virtual void on_lease_lost(std::string_view name, std::string_view owner) noexcept = 0;
  /// From now on a lease of this client is valid for at most `validity` after the send
  /// time of the request that last confirmed it (ZooKeeper: the session timeout the
  /// server granted on a reconnect, which an operator may have lowered). A held lease
  /// whose validity was longer has its local deadline moved earlier by the difference
  /// (it may pass at once: the lease is then lost), a lease acquired or renewed later
  /// gets at most this validity, and nothing is ever lengthened.
  virtual void on_validity_changed(Millis validity) noexcept = 0;
};

/// One change of a lock, as Backend::watch_prefix delivers it.
struct LockEvent {
  enum class Kind { acquired, released, lost, revoked };
  Kind kind = Kind::acquired;
  std::string name;
  std::uint64_t token = 0;  ///< the lease's fencing token (0 where the backend gives none)
  std::string owner;        ///< the holder's owner id
  std::optional<std::string> holder_info;
  /// Why a lease ended, where the backend knows more than its kind (empty: the API's own words).
  std::string detail;
};

/// Receives the events of one prefix watch, on the backend's notification thread, in
/// the order the server committed them. Never called after the PrefixWatch is gone.
class LockEventSink {
 public:
  virtual ~LockEventSink() = default;
  virtual void on_event(LockEvent&& ev) noexcept = 0;
  /// Events may have been missed (the channel broke, or was established again):
  /// `why` says what happened. The caller re-reads the state.
  virtual void on_gap(std::string why) noexcept = 0;
  /// Events of these names only may have been missed (zk://: a lease of one lock that may
  /// have come and gone between two readings). The default reports a gap of every name.
  virtual void on_names_gap(std::string why, std::vector<std::string> names) noexcept {
    (void)names;
    on_gap(std::move(why));
  }
  /// A gap after which the events come from another server (redis+sentinel://: the
  /// master moved in a failover), whose state may lack changes already delivered
  /// (asynchronous replication): the next read of a name may show an older token than
  /// the last one delivered, and that state is the truth from now on. `why` says what
  /// happened. The caller re-reads the state without dropping older tokens as stale.
  virtual void on_source_replaced(std::string why) noexcept { on_gap(std::move(why)); }
};

/// A live prefix watch (Backend::watch_prefix); its destructor stops the deliveries.
class PrefixWatch {
 public:
  virtual ~PrefixWatch() = default;
  /// Returns true once every event the server committed before this call has been
  /// given to the sink (a barrier through the notification channel); false with `ec`
  /// when it could not be confirmed in time.
  virtual bool sync(Error& ec) = 0;
  /// True where the server itself publishes the end of every lease, an expiry included (zk://:
  /// a holder's node goes with its session, and the watch reports it `lost`): the API layer then
  /// makes no expiry re-reads (WatchOptions::expiry_checks), which would only repeat it.
  virtual bool publishes_expiries() const noexcept { return false; }
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Capabilities capabilities() const noexcept = 0;

  /// Called once, before any other call. The engine outlives every callback: a
  /// backend stops its notification threads in its destructor.
  virtual void set_listener(ChangeListener* listener) = 0;

  /// One atomic attempt. Busy is {acquired=false}, not an error. Errors:
  /// backend_unavailable, auth_failed, protocol_error, invalid_argument.
  virtual AcquireResult try_acquire(const AcquireRequest& req, Error& ec) = 0;

  /// Gives up a place kept by keep_queued (queue-based backends). Never throws.
  virtual void cancel_acquire(std::string_view /*name*/, std::string_view /*owner*/) noexcept {}

  /// Renews many leases in as few round trips as possible; writes one status per
  /// item into `out` (same size as items). `ec` set means every item is `failed`.
  virtual void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) = 0;

  /// Releases if `owner` holds it (owner-checked, never a blind delete).
  virtual ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                                Error& ec) = 0;

  /// The engine has declared this lease lost (local deadline passed, hold bound reached,
  /// renewal refused, session ended) while the client lives. The backend frees at once
  /// whatever it still holds for exactly this (name, owner, token) — a kernel lock, a
  /// session's advisory lock, a key or queue entry of ours — owner-checked, so that this
  /// client or another can take the name again without waiting for the server to expire
  /// it. Never frees another owner's lock. Best effort: errors are swallowed (the server's
  /// own expiry stays the bound). Called at most once per lost lease, outside every engine
  /// lock, from an engine thread; may block for one round trip.
  /// The default is release() with the result ignored: release is owner-checked on every
  /// backend, so it frees exactly this lease or nothing. A backend overrides it only when a
  /// lost lease holds more than release frees.
  virtual void forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept {
    try {
      Error ignored;
      (void)release(name, owner, token, ignored);
    } catch (...) {  // no memory, or a backend's exception: the server's own expiry is the bound
    }
  }

  /// Starts delivering on_change(name); returns once notifications are live so a
  /// release after it returns cannot be missed. Calls are counted by the engine:
  /// one watch per name at a time, undone by unwatch.
  virtual void watch(std::string_view name, Error& ec) = 0;
  virtual void unwatch(std::string_view name) noexcept = 0;

  virtual LockInfo status(std::string_view name, Error& ec) = 0;

  /// Stores `value` under record `key` (see PutMode) and returns the value stored
  /// after the call. One atomic step on the server: two callers with if_absent get
  /// the same answer. Errors as try_acquire; errc::not_supported if the backend
  /// keeps no records.
  virtual std::string put_record(std::string_view /*key*/, std::string_view /*value*/, PutMode /*mode*/,
                                 Error& ec) {
    ec = make_error_code(errc::not_supported);
    return {};
  }
  /// The record under `key`, or nullopt when there is none.
  virtual std::optional<std::string> get_record(std::string_view /*key*/, Error& ec) {
    ec = make_error_code(errc::not_supported);
    return std::nullopt;
  }
  /// Deletes the record; returns whether there was one.
  virtual bool erase_record(std::string_view /*key*/, Error& ec) {
    ec = make_error_code(errc::not_supported);
    return false;
  }
  /// Locks held now whose name starts with `prefix` (empty: all), sorted by name, at
  /// most `limit` of them (`truncated` set when there were more). For `distlock list`:
  /// may cost a scan of the server's keys; never on a hot path.
  virtual std::vector<ListedLock> list_held(std::string_view /*prefix*/, std::size_t /*limit*/,
                                            bool& truncated, Error& ec) {
    truncated = false;
    ec = make_error_code(errc::not_supported);
    return {};
  }

  /// Revoke (Client::revoke): ends the current holder's lease of `name`, whoever holds it,
  /// in one atomic step on the server: the holder's lock record goes (its next renewal is
  /// refused), the lock is handed on no earlier than the server would have let the holder's
  /// lease expire (the moment its local deadline was computed against: two leases are
  /// never valid at once), in queue order, and a revoke note is stored beside the lock for
  /// `note_life`: "<token>\n<holder owner>\n<note>", so the holder's refused renewal can
  /// tell a revoke from any other loss and read who revoked it and why. Needs no rights
  /// beyond the lock's own. A free lock is no error: {revoked = false}, nothing stored.
  /// errc::not_supported where the backend cannot end another process's hold.
  struct Revoked {
    bool revoked = false;
    std::uint64_t token = 0;  ///< the token of the lease revoked (0 without fencing)
    std::string holder;       ///< the stored owner of the lease revoked; empty when not known (redlock://)
  };
  virtual Revoked revoke(std::string_view /*name*/, std::string_view /*note*/, Millis /*note_life*/,
                         Error& ec) {
    ec = make_error_code(errc::not_supported);
    return {};
  }
  /// The revoke note of `name` stored by the last revoke (see revoke), nullopt when there
  /// is none (never revoked, or its note_life passed). errc::not_supported as revoke.
  virtual std::optional<std::string> revoke_note(std::string_view /*name*/, Error& ec) {
    ec = make_error_code(errc::not_supported);
    return std::nullopt;
  }

  /// Starts delivering every acquire, release and loss of a lock whose name starts with
  /// `prefix` to `sink`; returns once the deliveries are live (a change committed after
  /// it returns is delivered or reported as a gap). errc::not_supported where the
  /// backend publishes no such events (docs/design.md "Watching locks" says why).
  virtual std::unique_ptr<PrefixWatch> watch_prefix(std::string_view /*prefix*/, LockEventSink& /*sink*/,
                                                    Error& ec) {
    ec = make_error_code(errc::not_supported);
    return nullptr;
  }

  /// How many times this backend found its notification channel dead without being told
  /// (a pub/sub connection that answered no PING: a partition) and dropped it to connect
  /// anew; waiters re-checked with the server meanwhile. Exported by Client::metrics() as
  /// distlock_notification_channel_drops_total. 0 where the backend has no such check.
  virtual std::uint64_t notification_channel_drops() const noexcept { return 0; }

  /// Request/response exchanges this backend has made with its servers since it was made
  /// (engine/round_trips.hpp says what counts as one), counted in its transport. Exported
  /// as ClientStats::round_trips. 0 where the backend does
  /// not count them (redlock://, file://, postgres://, mysql://: not in this version).
  virtual std::uint64_t round_trips() const noexcept { return 0; }

  /// URL with the password masked, for messages.
  virtual std::string url() const = 0;
};

/// For a backend whose records and listing live in an object of their own (`Records`,
/// with put/get/erase/list_held taking the arguments of the calls below): the four
/// calls go to `records()`.
template <class Records>
class RecordsBackend : public Backend {
 public:
  std::string put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) override {
    return records().put(key, value, mode, ec);
  }
  std::optional<std::string> get_record(std::string_view key, Error& ec) override {
    return records().get(key, ec);
  }
  bool erase_record(std::string_view key, Error& ec) override { return records().erase(key, ec); }
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    Error& ec) override {
    return records().list_held(prefix, limit, truncated, ec);
  }

 protected:
  virtual Records& records() noexcept = 0;
};

/// The key of one (lock name, owner) pair in a backend's table of its own entries:
/// "name\0owner" (a name holds no NUL, so two pairs never share a key).
inline std::string name_owner_key(std::string_view name, std::string_view owner) {
  std::string k;
  k.reserve(name.size() + 1 + owner.size());
  k.append(name);
  k.push_back('\0');
  k.append(owner);
  return k;
}

/// Makes a backend for a parsed URL; each backend folder names its factory in its own
/// scheme entries (engine/scheme.hpp), which src/connect/registry.cpp lists.
/// On failure it returns nullptr and fills `err`: the code and the sentence naming the
/// problem (connect() scrubs it of the URL's secrets and throws it).
using BackendFactory = std::unique_ptr<Backend> (*)(const Url& url, const ClientOptions& opts, Error& err);

}  // namespace distlock::detail
