// The redis:// backend's private declarations, shared by its files: redis_queue.cpp
// (acquire and the queue hand-off), redis_lease.cpp (renew, release, watches),
// redis_status.cpp (status, records, listing) and redis_backend.cpp (scripts, the
// server's configuration check, factories). Not for use outside src/redis.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "engine/log.hpp"
#include "engine/thread_annotations.hpp"
#include "redis/connection.hpp"
#include "redis/key_layout.hpp"
#include "redis/lock_scripts.hpp"
#include "redis/records.hpp"
#include "redis/redis_backend.hpp"
#include "redis/shared_connection.hpp"
#include "redis/slots.hpp"
#include "redis/subscriber.hpp"
#include "redis/wait_queue.hpp"

namespace distlock::detail::redis {

// Keys renewed by one EVALSHA: large enough that 10,000 leases need 10 calls (sent
// as one pipeline), small enough that one call blocks the server only briefly.
constexpr std::size_t kRenewChunk = 1000;

// redis_backend.cpp
const Script& renew_script();
bool prefix_ok(std::string_view prefix);

class RedisBackend final : public Backend {
 public:
  RedisBackend(const ConnectionOptions& conn, std::string prefix, std::string url, const ClientOptions& opts,
               int wait_replicas = 0, Millis wait_timeout = Millis(0))
      : round_trips_(conn.round_trips ? conn.round_trips : std::make_shared<RoundTrips>()),
        conn_opts_(counted(conn, round_trips_)),
        prefix_(std::move(prefix)),
        url_(std::move(url)),
        wait_replicas_(wait_replicas),
        wait_timeout_(wait_timeout),
        log_(opts.logger),
        pool_(conn_opts_, 8),
        shared_(wait_replicas == 0 ? std::make_unique<redis::SharedConnection>(conn_opts_) : nullptr),
        waits_(
            opts.clock ? opts.clock : system_steady_clock(),
            [this](const std::vector<redis::WaitQueue::Wait>& w) { return refresh_waits(w); },
            [this](std::string_view name) { wake(name); },
            [this](const redis::WaitQueue::Wait& w) { return cancel_wait(w); }),
        subscriber_(conn_opts_, [this](std::string_view channel) { on_channel(channel); }) {}

  // The subscriber (declared last) stops its thread first, then the wait queue's
  // refresher; both call into this object.
  ~RedisBackend() override = default;

  Capabilities capabilities() const noexcept override { return {true, true, true}; }
  void set_listener(ChangeListener* listener) override { listener_.store(listener); }

  void connect_now(Error& ec);
  AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override;
  AcquireResult acquire_queued(const AcquireRequest& req, Error& ec);
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override;
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) override;
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                        Error& ec) override;
  void forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept override;
  Revoked revoke(std::string_view name, std::string_view note, Millis note_life, Error& ec) override;
  std::optional<std::string> revoke_note(std::string_view name, Error& ec) override;
  void watch(std::string_view name, Error& ec) override;
  void unwatch(std::string_view name) noexcept override;
  LockInfo status(std::string_view name, Error& ec) override;
  std::string put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) override;
  std::optional<std::string> get_record(std::string_view key, Error& ec) override;
  bool erase_record(std::string_view key, Error& ec) override;
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    Error& ec) override;

  std::unique_ptr<PrefixWatch> watch_prefix(std::string_view prefix, LockEventSink& sink, Error& ec) override;
  /// PUBLISH `message` on `channel` (redis_watch.cpp: a prefix watch's sync marker).
  bool publish(const std::string& channel, const std::string& message, Error& ec);
  /// Creates or lengthens the watcher-presence key to `life`; its generation
  /// (redis_watch.cpp). nullopt with `ec` on failure.
  std::optional<std::string> keep_watch_presence(Millis life, Error& ec);

  std::string url() const override { return url_; }

  std::uint64_t notification_channel_drops() const noexcept override { return subscriber_.silent_drops(); }
  std::uint64_t round_trips() const noexcept override { return round_trips_->count(); }
  RedisStats stats() const {
    RedisStats st;
    st.grants_received = waits_.grants_received();
    st.release_messages = release_messages_.load();
    st.queued_waits = waits_.size();
    st.subscriber_silent_drops = subscriber_.silent_drops();
    return st;
  }

 private:
  // The hash slot of lock_key(name) (`len` long), without building it on the heap when short.
  std::uint16_t lock_slot(std::string_view name, std::size_t len) const {
    char small[256];
    if (len > sizeof small) return redis::key_slot(lock_key(name));
    char* at = std::copy(prefix_.begin(), prefix_.end(), small);
    *at++ = ':';
    *at++ = '{';
    at = std::copy(name.begin(), name.end(), at);
    *at++ = '}';
    return redis::key_slot(std::string_view(small, len));
  }
  // The keys and the release channel of one name, in one allocation (the views point
  // into `buf`, which a move keeps in place): a lock call builds them each time.
  struct Keys {
    std::unique_ptr<char[]> buf;
    std::string_view lock, queue, expiries, fence, released;
  };
  Keys keys_of(std::string_view name) const {
    // "<prefix>:{<name>}", then ":q", ":qx", ":released" after a copy of it each, and
    // "<prefix>:{<tag>}:fence" (redis/key_layout.hpp).
    const std::size_t lock_len = prefix_.size() + name.size() + 3;
    const std::string& tag = redis::slot_tag(lock_slot(name, lock_len));
    const std::size_t fence_len = prefix_.size() + tag.size() + 9;
    Keys k;
    k.buf = std::make_unique_for_overwrite<char[]>(4 * lock_len + 2 + 3 + 9 + fence_len);
    char* at = k.buf.get();
    auto put = [&at](std::string_view part) { at = std::copy(part.begin(), part.end(), at); };
    auto key = [&](std::string_view tail) {
      char* const begin = at;
      put(prefix_), put(":{"), put(name), put("}"), put(tail);
      return std::string_view(begin, static_cast<std::size_t>(at - begin));
    };
    k.lock = key("");
    k.queue = key(":q");
    k.expiries = key(":qx");
    k.released = key(":released");
    char* const fence = at;
    put(prefix_), put(":{"), put(tag), put("}:fence");
    k.fence = std::string_view(fence, static_cast<std::size_t>(at - fence));
    return k;
  }

  // The keys of `name` for a lock call (acquire, release), kept per thread for the last
  // name it used with this backend: a client that locks one name over and over builds
  // them (and hashes the name for its slot) once, not on every call. Valid until the
  // calling thread's next keys_for_call(); the lock calls use them only within the call.
  const Keys& keys_for_call(std::string_view name) const {
    thread_local struct {
      std::uint64_t backend = 0;  // serial_ of the backend they belong to; 0: none
      std::string name;
      Keys keys;
    } cache;
    if (cache.backend != serial_ || cache.name != name) {
      cache.backend = 0;  // left invalid if what follows throws
      cache.keys = keys_of(name);
      cache.name.assign(name);
      cache.backend = serial_;
    }
    return cache.keys;
  }

  using Answer = redis::QueueAnswer;

  Answer acquire_answer(redis::Link& conn, const AcquireRequest& req, const Reply& r, Error& ec);
  void subscribe_grants(std::string_view owner);
  std::vector<redis::WaitQueue::Answer> refresh_waits(const std::vector<redis::WaitQueue::Wait>& waits);
  bool cancel_wait(const redis::WaitQueue::Wait& w);
  void on_grant_message(std::string_view payload);

  void hold_entry(std::string_view name, std::string_view owner, const std::string& entry) {
    LockGuard lk(held_mu_);
    auto it = held_entries_.find(std::pair(name, owner));
    if (it != held_entries_.end()) {
      it->second = entry;
    } else {
      held_entries_.emplace(std::pair(std::string(name), std::string(owner)), entry);
    }
  }
  void unhold_entry(std::string_view name, std::string_view owner) noexcept {
    LockGuard lk(held_mu_);
    auto it = held_entries_.find(std::pair(name, owner));
    if (it != held_entries_.end()) held_entries_.erase(it);
  }

  void wake(std::string_view name) {
    ChangeListener* l = listener_.load();
    if (l) l->on_change(name);
  }

  // The detail of a failure: the transport's (naming the server), the server's answer,
  // or what was wrong with the reply.
  std::vector<LockInfo> statuses(Connection& conn, std::span<const std::string> names, Error& ec);

  // The layout (redis/key_layout.hpp): "<prefix>:{<name>}", its counter
  // "<prefix>:{<tag>}:fence", one per hash slot in the slot of the lock (docs/redis.md
  // "Tokens"): locking any number of names leaves at most 16,384 counters, and the
  // acquire script's keys stay in one slot.
  std::string fence_key(std::string_view lock) const { return redis::fence_key(prefix_, lock); }
  std::string lock_key(std::string_view name) const { return redis::lock_key(prefix_, name); }
  std::string record_key(std::string_view key) const { return redis::record_key(prefix_, key); }
  /// "<prefix>:{<name>}:rv": the note of the last revoke of `name` (redis/key_layout.hpp).
  std::string revoke_note_key(std::string_view name) const { return redis::revoke_note_key(prefix_, name); }

  bool answered(const Reply& r, const char* what, Error& ec);
  bool replicated_record(Connection& conn, std::string_view key, Error& ec);

  void unexpected(const char* what, Error& ec) {
    ec = make_error_code(errc::protocol_error);
    ec.set_detail(conn_opts_.describe() + ": unexpected reply to " + what);
  }

  // `cause` by value: it is often ec's own detail.
  void listing_failed(const Connection& conn, std::string cause, Error& ec) {
    if (!ec) ec = make_error_code(errc::protocol_error);
    if (!conn.connected()) report("list: " + cause, ec);
    ec.set_detail("list: " + cause);
  }

  void on_channel(std::string_view channel);
  void check_config(Connection& conn);
  bool replicated(redis::Link& conn, const char* what, long long* acked_out = nullptr);
  bool replicated_acquire(redis::Link& conn, const AcquireRequest& req, Error& ec);

  // The link a lock call runs on: the client's shared, auto-pipelined connection,
  // or with wait=N an exclusive one from the pool (WAIT counts the writes of its
  // own connection, and would stall every other call on a shared one).
  class CallLink {
   public:
    redis::Link& operator*() const noexcept { return *link_; }
    redis::Link* operator->() const noexcept { return link_; }

   private:
    friend class RedisBackend;
    redis::PooledConnection pooled_;
    redis::Link* link_ = nullptr;
  };
  CallLink lock_link(Error& ec) {
    CallLink l;
    ec.clear();
    if (shared_) {
      l.link_ = shared_.get();
      return l;
    }
    l.pooled_ = checkout(ec);
    if (!ec) l.link_ = &*l.pooled_;
    return l;
  }

  // A failure's error names the server and the cause.
  redis::PooledConnection checkout(Error& ec) {
    auto conn = pool_.checkout(ec);
    if (ec) report(ec.detail(), ec);
    return conn;
  }

  // After a transport failure on a link: ec's detail (the link's, naming the server)
  // is said with what failed.
  void failed(const char* what, Error& ec) { report(std::string(what) + ": " + ec.detail(), ec); }

  // One warning when the server becomes unreachable, one note when it is back,
  // rather than a line per failed call during an outage.
  // Logged once per outage; every failing call's error names the server and cause.
  void report(std::string message, Error& ec) {
    if (!failing_.exchange(true)) log_.log(LogLevel::warning, "{}", message);
    ec.set_detail(std::move(message));
  }
  void ok() {
    if (failing_.exchange(false)) log_.log(LogLevel::info, "{} answers again", conn_opts_.describe());
  }

  // Every connection below adds to it (ConnectionOptions::round_trips): the one `conn`
  // carries (a redis+sentinel:// backend's, shared by its masters over failovers), else
  // its own. Before conn_opts_.
  const std::shared_ptr<RoundTrips> round_trips_;
  const ConnectionOptions conn_opts_;
  const std::string prefix_;
  const std::string url_;
  const int wait_replicas_;
  const Millis wait_timeout_;
  Logger log_;
  std::atomic<ChangeListener*> listener_{nullptr};
  std::atomic<bool> failing_{false};
  std::atomic<std::uint64_t> release_messages_{0};
  ConnectionPool pool_;  // records, listing, status, and lock calls with wait=N
  // Lock calls (acquire, renew, release, queue refresh and give-up) from every
  // thread, pipelined on one socket; null with wait=N.
  const std::unique_ptr<redis::SharedConnection> shared_;
  const std::string grant_prefix_ = prefix_ + ":grant:";  // + client id: one grant channel per client
  AnnotatedMutex grants_mu_;
  bool grants_subscribed_ DISTLOCK_GUARDED_BY(grants_mu_) = false;
  std::string grant_channel_ DISTLOCK_GUARDED_BY(grants_mu_);
  // Unique in the process (never 0): the per-thread cache of keys_for_call() tells
  // backends apart by it, not by address (a backend made after another was destroyed may
  // get its address).
  const std::uint64_t serial_ = [] {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }();
  AnnotatedMutex held_mu_;
  // Locks this client took from a queue: (name, owner) -> entry, until released; found
  // by views (a lookup builds no key strings).
  struct HeldLess {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const noexcept {
      return std::pair<std::string_view, std::string_view>(a.first, a.second) <
             std::pair<std::string_view, std::string_view>(b.first, b.second);
    }
  };
  std::map<std::pair<std::string, std::string>, std::string, HeldLess> held_entries_
      DISTLOCK_GUARDED_BY(held_mu_);
  redis::WaitQueue waits_;        // its refresher calls refresh_waits() and wake()
  redis::Subscriber subscriber_;  // last: destroyed first, its thread calls on_channel
};

}  // namespace distlock::detail::redis
