// The MySQL backend's private declarations, shared by its files: mysql_backend.cpp
// (setup, acquire, renew, release, forget, status, factory), mysql_watch.cpp (waiting
// inside the server) and mysql_records.cpp (records, listing). Not for use outside
// src/mysql.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/log.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/worker_loop.hpp"
#include "mysql/my_conn.hpp"
#include "mysql/mysql_backend.hpp"

namespace distlock::detail::mysql {

using Clock = std::chrono::steady_clock;
using my::Config;
using my::Conn;
using my::Exec;

/// wait_timeout counts whole seconds, at most a year (MariaDB's and MySQL's maximum).
inline constexpr long long kMaxWaitSeconds = 31536000;

// One lease: its own session, whose wait_timeout is the lease's validity.
struct Lease {
  std::string name, owner;
  std::uint64_t token = 0;
  Millis validity{};  // the session's wait_timeout
  AnnotatedMutex mu;
  // Send time of the acquire or last renewal + validity: the holder's local deadline
  // lies before it.
  Clock::time_point valid_until DISTLOCK_GUARDED_BY(mu){};
  Conn conn DISTLOCK_GUARDED_BY(mu);  // null once the lease is over
};

// A watched name: a connection blocked in GET_LOCK while armed.
struct Watch {
  std::string name;
  int count = 0;
  Conn conn;
  unsigned long conn_id = 0;
  bool armed = false;
};

class MysqlBackend final : public Backend {
 public:
  MysqlBackend(Config cfg, const ClientOptions& opts) : cfg_(std::move(cfg)), log_(opts.logger) {}
  ~MysqlBackend() override;

  Error connect_now();

  // Lock-delay only where the table has its column (connect_now; docs/mysql.md).
  Capabilities capabilities() const noexcept override { return {true, true, has_delay_column_.load()}; }
  void set_listener(ChangeListener* l) override { listener_cb_.store(l); }

  AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override;
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) override;
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        Error& ec) override;
  void forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept override;
  void watch(std::string_view name, Error& ec) override;
  void unwatch(std::string_view name) noexcept override;
  LockInfo status(std::string_view name, Error& ec) override;

  std::string put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) override;
  std::optional<std::string> get_record(std::string_view key, Error& ec) override;
  bool erase_record(std::string_view key, Error& ec) override;
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    Error& ec) override;

  std::string url() const override { return cfg_.shown; }

  static std::string printable(std::string_view name) {
    std::string out;
    for (char c : name.substr(0, 64)) out.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
    if (name.size() > 64) out += "...";
    return out;
  }

 private:
  // A batch on the shared connection (reconnecting once when it failed); on failure an
  // Exec that is not ok() and `ec` with a detail naming the server and `what`.
  Exec shared(const std::string& sql, const char* what, Error& ec);
  // CREATE TABLE IF NOT EXISTS for the records table.
  std::string create_records_sql() const;
  // A connection for a new lease: an idle one (unless `fresh`), or a new one.
  Conn take_conn(bool fresh, bool& reused, Error& ec);
  // Keeps a session whose named locks are all given up for the next lease; the server
  // ends it `idle_for` after its last statement (its wait_timeout), so it is not used
  // after that.
  void give_back(Conn c, Millis idle_for);
  std::shared_ptr<Lease> find_lease(std::string_view name, std::string_view owner);
  void drop_lease(const std::shared_ptr<Lease>& l);
  // Marks the lease's row released (or clears it) and gives up its named lock on its
  // session. True when the row was ours and the named lock was held.
  // `lost` (forget): a row with a lock-delay is left naming its owner (its named lock is
  // given up all the same), so nobody takes it over before seen_at + ttl + delay.
  bool release_on(Lease& l, Exec& e, bool lost = false) DISTLOCK_REQUIRES(l.mu);
  // SQL: whether the lock row `row` (an alias of the lock table) was released by its
  // holder — its token is the one in distlock_released. FALSE without that table.
  std::string released_sql(const std::string& row) const;
  // Watches (mysql_watch.cpp).
  void arm_locked(Watch& w) DISTLOCK_REQUIRES(watch_mu_);
  // KILL QUERY `id` from the shared connection, on a new one when that one is gone (a
  // server restart ends it unnoticed). With aux_mu_ held.
  void kill_query_locked(unsigned long id) DISTLOCK_REQUIRES(aux_mu_);
  // The watch's statement is still blocked in the server: armed, and nothing (neither its
  // answer nor the end of its connection) waits to be read. Only then is its session id
  // one to KILL: after a server restart that id may name another client's session.
  static bool blocked(const Watch& w);
  void rearm(std::string_view name);
  void watch_loop();

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
  // distlock_released is there and usable (set once by connect_now): a release then
  // records the released token there, in a MEMORY table (no log flush), instead of
  // clearing the row's owner in InnoDB (one flush).
  bool fast_release_ = false;
  std::atomic<ChangeListener*> listener_cb_{nullptr};
  std::atomic<bool> failing_{false};
  // The lock table has delay_ms (set by connect_now): the lock-delay statements are used.
  std::atomic<bool> has_delay_column_{false};
  AnnotatedMutex mu_;
  std::map<std::string, std::shared_ptr<Lease>> leases_ DISTLOCK_GUARDED_BY(mu_);  // by name_owner_key
  struct Idle {
    Conn conn;
    Clock::time_point usable_until;
  };
  std::vector<Idle> idle_ DISTLOCK_GUARDED_BY(mu_);
  AnnotatedMutex aux_mu_;
  Conn aux_ DISTLOCK_GUARDED_BY(aux_mu_);  // status, records, KILL QUERY
  AnnotatedMutex watch_mu_;
  std::map<std::string, Watch> watches_ DISTLOCK_GUARDED_BY(watch_mu_);
  WorkerLoop watcher_;  // last: stopped in the destructor first
};

}  // namespace distlock::detail::mysql
