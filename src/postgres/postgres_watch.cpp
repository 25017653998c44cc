// Watching every lock under a name prefix on postgres:// (Backend::watch_prefix).
//
// The statements that change a lock (acquire: postgres_acquire.cpp; release and the
// give-up of a lease the engine declared lost: postgres_sessions.cpp) NOTIFY the channel
// distlock_events in the same transaction, so a watch gets an event only if it committed,
// and in commit order (PostgreSQL delivers a channel's notifications in commit order):
// "<kind> <token> <name as hex> <owner>" with kind acquired, released or lost (the owner
// last: it may carry a holder description with spaces). A payload that would pass
// PostgreSQL's 8000-byte limit (a name of thousands of bytes, a long owner) is sent as
// "overflow": a gap. A session that ends without a statement of ours (a killed holder, a
// cut connection, the idle timeout) NOTIFYs nothing: the API layer finds such a loss by
// its status re-read (src/api/watch.cpp).
//
// The statements publish only while a watch exists: each watch holds the watcher key
// (kWatchKeyHigh, kWatchKeyLow) shared on its LISTEN connection. A statement that changes a
// lock takes the in-flight key (kWatchKeyHigh, kInFlightKeyLow) shared to its commit
// (pg_try_advisory_xact_lock_shared: statements never conflict on it), then probes the
// watcher key exclusively and gives it back at once (pg_try_advisory_lock and
// pg_advisory_unlock in one expression); it NOTIFYs if either try fails. Nobody watching
// costs three in-memory lock-manager calls per change and no NOTIFY: two statements fail on
// each other only if their probes meet within microseconds. (A NOTIFY takes PostgreSQL's
// cluster-wide notify lock to its commit flush, so statements that published to nobody would
// serialise every client's commits.) The watch takes the watcher key after its LISTEN
// committed, then the in-flight key exclusively and back, which waits for every statement
// that probed before the watcher key was granted to commit: those are in the listing, every
// later statement finds the key held and publishes. The key lives exactly as long as the
// watch's connection, so it cannot lapse without that connection breaking, which the watch
// reports as a gap.
//
// Each watch has its own connection (application_name distlock-watch, no idle timeout).
// Its break is a gap, and so is its re-connection (a re-list run in between may have
// missed changes). An idle connection is checked with SELECT 1 every kIdleCheck: a
// server gone silent is a gap within kIdleCheck plus the command timeout. `sync` NOTIFYs a
// marker "sync <n> <watch id>" on the same channel from the shared connection and waits
// for it to come back: every event committed before is delivered by then.
#include <poll.h>

#include <charconv>
#include <condition_variable>
#include <random>

#include "engine/watch_payload.hpp"
#include "postgres/postgres_backend_impl.hpp"

namespace distlock::detail::postgres {

namespace {

constexpr Millis kIdleCheck{5000};
// Between attempts to connect the watch again.
constexpr Millis kReconnectPause{500};

int watch_hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::optional<std::string> watch_unhex(std::string_view h) {
  if (h.size() % 2 != 0) return std::nullopt;
  std::string out;
  out.reserve(h.size() / 2);
  for (std::size_t i = 0; i < h.size(); i += 2) {
    const int a = watch_hex_digit(h[i]), b = watch_hex_digit(h[i + 1]);
    if (a < 0 || b < 0) return std::nullopt;
    out.push_back(static_cast<char>(a * 16 + b));
  }
  return out;
}

class PostgresPrefixWatch final : public PrefixWatch {
 public:
  PostgresPrefixWatch(PostgresBackend& backend, const Config& cfg, Logger log, std::string prefix,
                      LockEventSink& sink)
      : backend_(backend),
        cfg_(cfg),
        log_(std::move(log)),
        timeout_(cfg.connect_timeout + cfg.command_timeout),
        prefix_(std::move(prefix)),
        sink_(sink) {}

  ~PostgresPrefixWatch() override {
    stopping_.store(true);
    loop_.stop();
    // conn_ closes with the watch: the server drops its LISTEN and the watcher key.
  }

  // Listens and holds the watcher key before it returns: a change committed after this
  // is delivered, or its loss reported as a gap.
  void start(Error& ec) {
    if (!loop_.valid()) {
      ec.fail(errc::backend_unavailable,
              "no eventfd for the watch thread (errno " + std::to_string(loop_.error()) + ")");
      return;
    }
    conn_ = connect(ec);
    if (ec) return;
    loop_.start([this] { run(); });
  }

  bool sync(Error& ec) override {
    std::uint64_t n = 0;
    {
      LockGuard lk(mu_);
      n = ++sync_sent_;
    }
    if (!backend_.notify_event_channel("sync " + std::to_string(n) + " " + id_, ec)) return false;
    const auto deadline = Clock::now() + timeout_;
    UniqueLock lk(mu_);
    while (sync_seen_ < n && cv_.wait_until(lk.native(), deadline) != std::cv_status::timeout) {
    }
    if (sync_seen_ < n) {
      ec.fail(errc::backend_unavailable, "watch of \"" + prefix_ + "\": the channel " + kEventsChannel +
                                             " of " + cfg_.shown + " did not deliver a marker within " +
                                             std::to_string(timeout_.count()) + " ms");
      return false;
    }
    return true;
  }

 private:
  // A connection that LISTENs and holds the watcher key shared (so the statements publish).
  Conn connect(Error& ec) {
    Conn c = open(cfg_, Millis(0), "distlock-watch", ec);
    if (ec) return nullptr;
    Exec e = pg::run(c.get(), "LISTEN distlock_events", {}, cfg_.command_timeout);
    if (e.ok())
      e = pg::run(c.get(), "SELECT pg_advisory_lock_shared($1::integer, $2::integer)",
                  {std::to_string(kWatchKeyHigh), std::to_string(kWatchKeyLow)}, cfg_.command_timeout);
    // Waits for every lock statement that probed the watcher key before it was granted
    // (each holds the in-flight key shared to its commit): what those committed is in the
    // listing that follows, and every later statement finds the watcher key held.
    if (e.ok())
      e = pg::run(
          c.get(),
          "SELECT pg_advisory_lock($1::integer, $2::integer), pg_advisory_unlock($1::integer, $2::integer)",
          {std::to_string(kWatchKeyHigh), std::to_string(kInFlightKeyLow)}, cfg_.command_timeout);
    if (!e.ok()) {
      ec = code_of(e);
      ec.set_detail(cfg_.shown + ": LISTEN distlock_events and the watcher key: " + e.error);
      return nullptr;
    }
    return c;
  }

  void broke(const std::string& reason) {
    conn_.reset();
    if (stopping_.load()) return;
    log_.log(LogLevel::warning, "{}: the watch connection of \"{}\" broke: {}", cfg_.shown, prefix_, reason);
    sink_.on_gap("the PostgreSQL LISTEN connection to " + cfg_.shown + " broke: " + reason);
  }

  // The watch thread: delivers notifications, checks an idle connection, reconnects.
  void run() {
    auto last_traffic = Clock::now();
    while (!loop_.stopping()) {
      if (!conn_) {
        Error ec;
        Conn c = connect(ec);
        if (!c) {
          pollfd w{loop_.wake_fd(), POLLIN, 0};
          ::poll(&w, 1, static_cast<int>(kReconnectPause.count()));
          if (w.revents & POLLIN) loop_.clear_wake();
          continue;
        }
        conn_ = std::move(c);
        last_traffic = Clock::now();
        if (!stopping_.load())
          sink_.on_gap("the PostgreSQL LISTEN connection to " + cfg_.shown +
                       " was established again: changes meanwhile were not delivered");
      }
      pollfd pfd[2] = {{loop_.wake_fd(), POLLIN, 0}, {PQsocket(conn_.get()), POLLIN, 0}};
      const auto idle = std::chrono::duration_cast<Millis>(Clock::now() - last_traffic);
      const int wait_ms = static_cast<int>(std::max<long long>(0, (kIdleCheck - idle).count()));
      const int n = ::poll(pfd, 2, wait_ms);
      if (pfd[0].revents & POLLIN) loop_.clear_wake();
      if (loop_.stopping()) break;
      if (n > 0 && pfd[1].revents != 0) {
        if (!PQconsumeInput(conn_.get()) || PQstatus(conn_.get()) != CONNECTION_OK) {
          broke(pq_message(conn_.get()));
          continue;
        }
        last_traffic = Clock::now();
      } else if (Clock::now() - last_traffic >= kIdleCheck) {
        Exec e = pg::run(conn_.get(), "SELECT 1", {}, cfg_.command_timeout);
        if (e.io_failed) {
          broke(e.error);
          continue;
        }
        last_traffic = Clock::now();
      }
      while (PGnotify* note = PQnotifies(conn_.get())) {
        if (std::string_view(note->relname) == kEventsChannel) on_payload(note->extra);
        PQfreemem(note);
      }
    }
  }

  // "<kind> <token> <name hex> <owner>", "overflow", or a watch's "sync <n> <id>".
  void on_payload(std::string_view p) {
    if (stopping_.load()) return;
    auto field = [&p] { return take_field(p); };
    const std::string_view kind = field();
    if (kind == "sync") {
      const std::string_view n = field();
      if (p != id_) return;  // another watch's marker
      std::uint64_t v = 0;
      std::from_chars(n.data(), n.data() + n.size(), v);
      {
        LockGuard lk(mu_);
        sync_seen_ = std::max(sync_seen_, v);
      }
      cv_.notify_all();
      return;
    }
    if (kind == "overflow") {
      sink_.on_gap(
          "a lock changed whose name and owner exceed PostgreSQL's 8000-byte NOTIFY payload: "
          "its event carried neither");
      return;
    }
    LockEvent ev;
    if (const auto k = lock_event_kind(kind); k && *k != LockEvent::Kind::revoked) {
      ev.kind = *k;
    } else {
      return;  // a kind of a newer version (or one postgres:// never publishes): not ours to guess
    }
    const std::string_view token = field();
    if (std::from_chars(token.data(), token.data() + token.size(), ev.token).ec != std::errc{}) return;
    auto name = watch_unhex(field());
    if (!name || name->compare(0, prefix_.size(), prefix_) != 0) return;
    ev.name = std::move(*name);
    ev.owner = std::string(p);
    sink_.on_event(std::move(ev));
  }

  // 64 random bits: tells this watch's sync markers from those of every other watch.
  static std::string random_id() {
    std::random_device rd;
    const std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    return std::to_string(v);
  }

  PostgresBackend& backend_;
  const Config& cfg_;
  Logger log_;
  const std::string id_ = random_id();
  const Millis timeout_;
  const std::string prefix_;
  LockEventSink& sink_;
  std::atomic<bool> stopping_{false};
  AnnotatedMutex mu_;
  std::condition_variable cv_;  // sync_seen_ moved
  std::uint64_t sync_sent_ DISTLOCK_GUARDED_BY(mu_) = 0;
  std::uint64_t sync_seen_ DISTLOCK_GUARDED_BY(mu_) = 0;
  Conn conn_;        // set by start(), then the watch thread's alone
  WorkerLoop loop_;  // last: its thread stops first
};

}  // namespace

bool PostgresBackend::notify_event_channel(const std::string& payload, Error& ec) {
  ec.clear();
  runner()("SELECT pg_notify('distlock_events', $1)", {payload}, "watch marker", ec);
  return !ec;
}

std::unique_ptr<PrefixWatch> PostgresBackend::watch_prefix(std::string_view prefix, LockEventSink& sink,
                                                           Error& ec) {
  ec.clear();
  auto w = std::make_unique<PostgresPrefixWatch>(*this, cfg_, log_, std::string(prefix), sink);
  w->start(ec);
  if (ec) {
    ec.set_detail("cannot watch \"" + printable(prefix) + "\": " + ec.detail());
    return nullptr;
  }
  return w;
}

}  // namespace distlock::detail::postgres
