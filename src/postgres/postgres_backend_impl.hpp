// The PostgreSQL backend's private declarations, shared by its files:
// postgres_acquire.cpp (acquire), postgres_sessions.cpp (renew, release, the per-TTL
// sessions), postgres_listen.cpp (LISTEN/NOTIFY for waiters) and postgres_backend.cpp
// (connect, status, the shared connection, factory) and postgres_watch.cpp (prefix
// watches). Not for use outside src/postgres.
#pragma once

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/log.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/worker_loop.hpp"
#include "postgres/pg_conn.hpp"
#include "postgres/postgres_backend.hpp"
#include "postgres/postgres_records.hpp"

namespace distlock::detail::postgres {

using Clock = std::chrono::steady_clock;
using pg::code_of;
using pg::Config;
using pg::Conn;
using pg::Exec;
using pg::open;
using pg::pq_message;
using pg::Result;
using pg::run;
using pg::to_hex;

// The watcher key (two-int advisory key space, never met by the bigint keys of lock
// names): every prefix watch holds it shared on its LISTEN connection, and a statement
// that changes a lock NOTIFYs its event when a probe of it (exclusive, given back at once)
// fails. The in-flight key: each such statement holds it shared to its commit, and a
// starting watch takes it exclusively once to wait for the statements that probed before it
// (postgres_watch.cpp). The SQL of postgres_acquire.cpp and postgres_sessions.cpp spells
// them as the literals (1684632419, 2) and (1684632419, 4); (1684632419, 1) guards the table
// setup, (1684632419, 3) pg_segment.cpp.
constexpr std::int32_t kWatchKeyHigh = 1684632419;
constexpr std::int32_t kWatchKeyLow = 2;
constexpr std::int32_t kInFlightKeyLow = 4;
// The channel of lock events (postgres_watch.cpp has the payload).
constexpr const char* kEventsChannel = "distlock_events";

inline std::string key_payload(std::int64_t key) {
  return to_hex(std::string_view(reinterpret_cast<const char*>(&key), sizeof key));
}

// One database session carrying every lease of one TTL: the server ends it (and
// every advisory lock it holds) after `ttl` without a statement.
struct Session {
  explicit Session(Millis t) : ttl(t) {}
  const Millis ttl;
  AnnotatedMutex mu;
  Conn conn DISTLOCK_GUARDED_BY(mu);
  struct Held {
    std::string name, owner;
    std::uint64_t token = 0;
    // Send time of its last acquire/renewal + ttl: the engine's local deadline for
    // it lies before this, so past it the holder knows the lease is lost.
    Clock::time_point valid_until;
    // The engine declared it lost (forget) and giving it up failed with an SQL error:
    // retried at the next statement on the session.
    bool forgotten = false;
  };
  std::map<std::int64_t, Held> held DISTLOCK_GUARDED_BY(mu);  // by advisory key
};

using Lost = std::vector<std::pair<std::string, std::string>>;  // (name, owner)

class PostgresBackend final : public Backend {
 public:
  // Without an eventfd (listener_.valid() false) the listener still works: it then
  // notices a new socket or the stop request at its next poll timeout (<= 1 s).
  PostgresBackend(Config cfg, const ClientOptions& opts) : cfg_(std::move(cfg)), log_(opts.logger) {}

  ~PostgresBackend() override { listener_.stop(); }

  Error connect_now();

  // Lock-delay only where the table has its column (connect_now; docs/postgres.md).
  Capabilities capabilities() const noexcept override { return {true, true, has_delay_column_.load()}; }
  void set_listener(ChangeListener* l) override { listener_cb_.store(l); }

  AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override;
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) override;
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                        Error& ec) override;
  void forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept override;
  void watch(std::string_view name, Error& ec) override;
  void unwatch(std::string_view name) noexcept override;
  LockInfo status(std::string_view name, Error& ec) override;

  // Records and listing: postgres_records.cpp, on the shared connection.
  std::string put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) override {
    return pg::put_record(runner(), key, value, mode, ec);
  }
  std::optional<std::string> get_record(std::string_view key, Error& ec) override {
    return pg::get_record(runner(), key, ec);
  }
  bool erase_record(std::string_view key, Error& ec) override { return pg::erase_record(runner(), key, ec); }
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    Error& ec) override {
    return pg::list_held(runner(), prefix, limit, truncated, ec);
  }

  std::string url() const override { return cfg_.shown; }

  // postgres_watch.cpp.
  std::unique_ptr<PrefixWatch> watch_prefix(std::string_view prefix, LockEventSink& sink, Error& ec) override;
  // NOTIFY distlock_events, `payload` on the shared connection (a watch's sync marker).
  bool notify_event_channel(const std::string& payload, Error& ec);

 private:
  pg::Runner runner();

  static std::string printable(std::string_view name) {
    std::string out;
    for (char c : name.substr(0, 64)) out.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
    if (name.size() > 64) out += "...";
    return out;
  }

  Session& session(Millis ttl);
  Session* find_holder(std::string_view name, std::string_view owner);
  bool ensure_connected(Session& s, Lost& lost, Error& ec) DISTLOCK_REQUIRES(s.mu);
  void expire_stale(Session& s, Lost& lost) DISTLOCK_REQUIRES(s.mu);
  void give_up(Session& s, std::map<std::int64_t, Session::Held>::iterator it, Lost& lost)
      DISTLOCK_REQUIRES(s.mu);
  void drop(Session& s, Lost& lost) DISTLOCK_REQUIRES(s.mu);
  void report_lost(const Lost& lost);
  Error listen_now();
  Error listen_now_locked() DISTLOCK_REQUIRES(listen_mu_);
  void listen_loop();

  // Logged once per outage. Returns the sentence naming the server and the cause, for
  // the error of the call that failed.
  std::string failure(const std::string& what, const std::string& cause) {
    if (!failing_.exchange(true)) log_.log(LogLevel::warning, "{}: {}: {}", cfg_.shown, what, cause);
    return cause.find(cfg_.shown) != std::string::npos ? what + ": " + cause
                                                       : cfg_.shown + ": " + what + ": " + cause;
  }
  void ok() {
    if (failing_.exchange(false)) log_.log(LogLevel::info, "{} answers again", cfg_.shown);
  }

  const Config cfg_;
  Logger log_;
  std::atomic<ChangeListener*> listener_cb_{nullptr};
  std::atomic<bool> failing_{false};
  // public.distlock_locks has delay_ms (set by connect_now): the lock-delay SQL is used.
  std::atomic<bool> has_delay_column_{false};
  AnnotatedMutex sessions_mu_;
  std::map<Millis, std::unique_ptr<Session>> sessions_ DISTLOCK_GUARDED_BY(sessions_mu_);  // never erased
  AnnotatedMutex aux_mu_;
  Conn aux_ DISTLOCK_GUARDED_BY(aux_mu_);  // status queries
  AnnotatedMutex listen_mu_;
  Conn listen_conn_ DISTLOCK_GUARDED_BY(listen_mu_);
  std::map<std::int64_t, std::map<std::string, int>> watched_;  // key → name → watch count
  WorkerLoop listener_;  // last: stopped in the destructor before anything above goes
};

}  // namespace distlock::detail::postgres
