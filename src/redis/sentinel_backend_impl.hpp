// The redis+sentinel:// backend's private declarations, shared by sentinel_backend.cpp
// (finding the master, switching to it, factory), sentinel_monitor.cpp (the
// +switch-master monitor, watches of names) and sentinel_watch.cpp (prefix watches that
// follow the master). Not for use outside src/redis.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/log.hpp"
#include "engine/scheme.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/worker_loop.hpp"
#include "redis/connection.hpp"
#include "redis/redis_backend.hpp"

namespace distlock::detail::redis {

using Steady = std::chrono::steady_clock;

constexpr std::uint16_t kSentinelPort = 26379;
// The monitor asks a sentinel for the master this often even without a
// +switch-master message (one may be missed while it changes sentinels).
constexpr Millis kRecheckEvery{1000};
// A call that fails re-discovers at most this often (many threads fail at once).
constexpr Millis kMinRediscover{100};
// The monitor waits this long before subscribing again after losing a sentinel.
constexpr Millis kResubscribeDelay{200};
// A prefix watch keeps the replaced master's subscription after a switch ("draining",
// sentinel_watch.cpp) until that master answers ROLE as a replica, its channel breaks,
// or kDrainFor passes; it asks the old master every kDrainPoll, each ROLE bounded by
// kDrainProbeTimeout (a frozen old master must not hold up the others).
constexpr Millis kDrainFor{10000};
constexpr Millis kDrainPoll{50};
constexpr Millis kDrainProbeTimeout{250};

class SentinelWatchHub;
class SentinelWatchLeg;

struct Address {
  std::string host;
  std::uint16_t port = 0;
  bool operator==(const Address&) const = default;
  std::string text() const { return host + ":" + std::to_string(port); }
};

class SentinelBackend final : public Backend, private ChangeListener {
 public:
  SentinelBackend(std::vector<ConnectionOptions> sentinels, std::string master_name, ConnectionOptions master,
                  RedisSettings settings, const ClientOptions& opts)
      : sentinel_opts_(std::move(sentinels)),
        master_name_(std::move(master_name)),
        master_tpl_(counted(std::move(master))),
        settings_(std::move(settings)),
        client_opts_(opts),
        log_(opts.logger) {
    for (auto& o : sentinel_opts_) {
      o.round_trips = master_tpl_.round_trips;  // the sentinels' calls count with the masters'
      sentinel_conns_.emplace_back(o);
    }
    if (!monitor_.valid())
      throw std::system_error(monitor_.error(), std::generic_category(), "eventfd for the sentinel monitor");
    if (!drainer_.valid())
      throw std::system_error(drainer_.error(), std::generic_category(), "eventfd for the sentinel drainer");
  }

  ~SentinelBackend() override {
    monitor_.stop();
    drainer_.stop();  // it destroys the legs it still held while every member is alive
    LockGuard lk(mu_);
    current_.reset();  // stops its subscriber while every member is alive
  }

  // ec: backend_unavailable (no sentinel names a usable master), invalid_argument (no
  // sentinel monitors the name), or the master's connect error; the detail says why.
  void start(Error& ec);

  Capabilities capabilities() const noexcept override { return {true, true, true}; }
  void set_listener(ChangeListener* listener) override { listener_.store(listener); }

  AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override {
    return call(ec, [&](Backend& b, Error& e) { return b.try_acquire(req, e); });
  }

  // To the current master's backend: a wait queued on a master that was replaced
  // since is unknown there, and its entry expires with its ttl (docs/sentinel.md).
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override {
    current().first->cancel_acquire(name, owner);
  }

  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) override {
    call(ec, [&](Backend& b, Error& e) {
      b.renew(items, out, e);
      return 0;
    });
  }

  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        Error& ec) override {
    return call(ec, [&](Backend& b, Error& e) { return b.release(name, owner, token, e); });
  }

  // To the current master's backend: a lease taken on a master replaced since is
  // not there (or is another owner's now) and is left to its TTL.
  void forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept override {
    current().first->forget(name, owner, token);
  }

  LockInfo status(std::string_view name, Error& ec) override {
    return call(ec, [&](Backend& b, Error& e) { return b.status(name, e); });
  }

  // To the current master, as a release. A call that met a demoted master was refused
  // there before the script wrote anything (READONLY) and is repeated on the new one.
  Revoked revoke(std::string_view name, std::string_view note, Millis note_life, Error& ec) override {
    return call(ec, [&](Backend& b, Error& e) { return b.revoke(name, note, note_life, e); });
  }
  std::optional<std::string> revoke_note(std::string_view name, Error& ec) override {
    return call(ec, [&](Backend& b, Error& e) { return b.revoke_note(name, e); });
  }

  // Records and listing go to the current master like every lock call (a put that
  // met a demoted master is repeated once on the new one: `always` and `if_absent`
  // are idempotent there, see docs/sentinel.md).
  std::string put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) override {
    return call(ec, [&](Backend& b, Error& e) { return b.put_record(key, value, mode, e); });
  }

  std::optional<std::string> get_record(std::string_view key, Error& ec) override {
    return call(ec, [&](Backend& b, Error& e) { return b.get_record(key, e); });
  }

  bool erase_record(std::string_view key, Error& ec) override {
    return call(ec, [&](Backend& b, Error& e) { return b.erase_record(key, e); });
  }

  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    Error& ec) override {
    return call(ec, [&](Backend& b, Error& e) { return b.list_held(prefix, limit, truncated, e); });
  }

  void watch(std::string_view name, Error& ec) override;
  void unwatch(std::string_view name) noexcept override;

  // A redis:// prefix watch on the current master, moved to each new master by a
  // switch with a gap (sentinel_watch.cpp).
  std::unique_ptr<PrefixWatch> watch_prefix(std::string_view prefix, LockEventSink& sink, Error& ec) override;

  std::string url() const override { return settings_.url; }

 private:
  friend class SentinelPrefixWatch;
  friend class SentinelWatchHub;

  // ChangeListener of the inner backends: forwarded to the engine.
  void on_change(std::string_view name) noexcept override {
    if (auto* l = listener_.load()) l->on_change(name);
  }
  void on_session_lost() noexcept override {
    if (auto* l = listener_.load()) l->on_session_lost();
  }
  void on_lease_lost(std::string_view name, std::string_view owner) noexcept override {
    if (auto* l = listener_.load()) l->on_lease_lost(name, owner);
  }
  void on_validity_changed(Millis validity) noexcept override {
    if (auto* l = listener_.load()) l->on_validity_changed(validity);
  }

  /// The current master's backend's count (a failover starts it again from 0).
  std::uint64_t round_trips() const noexcept override { return master_tpl_.round_trips->count(); }
  std::uint64_t notification_channel_drops() const noexcept override {
    const auto b = current().first;
    return b ? b->notification_channel_drops() : 0;
  }

  std::pair<std::shared_ptr<Backend>, std::uint64_t> current() const {
    LockGuard lk(mu_);
    return {current_, generation_};
  }

  // Runs `f` on the current master; when it fails with backend_unavailable and the
  // sentinels name another master, runs it once more there (every operation is
  // owner-checked, so a repeat cannot act for somebody else).
  template <class F>
  std::invoke_result_t<F&, Backend&, Error&> call(Error& ec, F&& f) {
    auto [backend, generation] = current();
    auto result = f(*backend, ec);
    if (ec != errc::backend_unavailable) return result;
    if (!rediscover(generation, false)) return result;
    ec.clear();
    return f(*current().first, ec);
  }

  bool rediscover(std::uint64_t generation, bool forced);

  Address current_addr() const {
    LockGuard lk(mu_);
    return current_addr_;
  }

  std::string describe_sentinel(std::size_t i) const DISTLOCK_REQUIRES(discover_mu_) {
    return "sentinel " + sentinel_opts_[i].host + ":" + std::to_string(sentinel_opts_[i].port);
  }

  Reply sentinel_command(std::size_t i, std::initializer_list<std::string_view> argv, Error& ec)
      DISTLOCK_REQUIRES(discover_mu_);
  long long config_epoch(std::size_t i, Error& ec) DISTLOCK_REQUIRES(discover_mu_);
  std::optional<Address> discover(Error& ec, long long& epoch) DISTLOCK_REQUIRES(discover_mu_);
  std::string why_not_master(const Address& a);
  bool switch_to(const Address& a, Error& ec);
  void monitor();
  void listen(redis::Socket& sock, redisReader& reader);

  // Asks the sentinels now, then gives a prefix watch that has no leg on the current
  // master one (the monitor thread, every kRecheckEvery and on request).
  void recheck() {
    rediscover(current().second, true);
    retry_prefix_watches();
  }

  // From a prefix watch whose channel broke (a failover is one reason): the monitor
  // rechecks now rather than at its next kRecheckEvery.
  void request_recheck() noexcept {
    recheck_requested_.store(true);
    monitor_.wake();
  }

  // sentinel_watch.cpp. A switch moves every prefix watch to `fresh` (generation
  // `generation`) with a gap naming both masters; the legs replaced are destroyed by
  // the caller outside every lock.
  // The legs replaced keep running: they are handed to the drainer (drain_legs) with
  // the old master's address, which the caller passes to start_drain.
  struct DrainingLeg {
    std::shared_ptr<SentinelWatchHub> hub;
    std::shared_ptr<SentinelWatchLeg> leg;
  };
  void move_prefix_watches(const std::shared_ptr<Backend>& fresh, std::uint64_t generation,
                           const Address& was, const Address& now, std::vector<DrainingLeg>& draining)
      DISTLOCK_REQUIRES(watch_mu_);
  void retry_prefix_watches();
  void start_drain(const Address& was, std::vector<DrainingLeg> legs);
  void drain_legs();  // the drainer thread
  // The role the server at `a` answers ROLE with ("" when it does not answer within
  // kDrainProbeTimeout).
  std::string role_of(const Address& a);
  void forget_prefix_watch(const SentinelWatchHub* hub);

  void wait_wake(Millis d) {
    pollfd p{monitor_.wake_fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(d.count())) > 0) monitor_.clear_wake();
  }

  std::vector<ConnectionOptions> sentinel_opts_ DISTLOCK_GUARDED_BY(discover_mu_);
  const std::string master_name_;
  const ConnectionOptions master_tpl_;
  const RedisSettings settings_;
  const ClientOptions client_opts_;
  Logger log_;
  std::atomic<ChangeListener*> listener_{nullptr};

  AnnotatedMutex discover_mu_;  // serialises discovery and switches
  std::vector<Connection> sentinel_conns_ DISTLOCK_GUARDED_BY(discover_mu_);
  Steady::time_point last_discovery_ DISTLOCK_GUARDED_BY(discover_mu_){};
  bool no_master_ DISTLOCK_GUARDED_BY(discover_mu_) = false;
  long long current_epoch_ DISTLOCK_GUARDED_BY(discover_mu_) = -1;  // the current master's config-epoch

  AnnotatedMutex watch_mu_;  // taken before mu_
  std::map<std::string, int, std::less<>> watches_ DISTLOCK_GUARDED_BY(watch_mu_);
  std::vector<std::shared_ptr<SentinelWatchHub>> prefix_watches_ DISTLOCK_GUARDED_BY(watch_mu_);
  std::atomic<bool> recheck_requested_{false};

  mutable AnnotatedMutex mu_;
  std::shared_ptr<Backend> current_ DISTLOCK_GUARDED_BY(mu_);
  Address current_addr_ DISTLOCK_GUARDED_BY(mu_);
  std::uint64_t generation_ DISTLOCK_GUARDED_BY(mu_) = 0;

  // Replaced masters whose prefix-watch legs still run (sentinel_watch.cpp).
  struct Drain {
    Address was;
    Steady::time_point until;
    std::vector<DrainingLeg> legs;
  };
  AnnotatedMutex drain_mu_;
  std::vector<Drain> drains_ DISTLOCK_GUARDED_BY(drain_mu_);
  WorkerLoop drainer_;  // stopped after monitor_, before everything it uses

  WorkerLoop monitor_;  // last: stopped first, while everything it uses is alive
};

}  // namespace distlock::detail::redis
