// Watching every lock under a name prefix on redis+sentinel:// (Backend::watch_prefix).
//
// Not a second watch: each prefix watch runs the redis:// watch (redis_watch.cpp: the
// watcher-presence key, the subscription to "<prefix>:events", the sync barrier) on
// the backend of the master the sentinel backend currently uses. That redis:// watch
// and the sink it delivers to make one "leg"; the watch's hub passes on the deliveries
// of its current leg only.
//
// A switch to a new master (switch_to: a +switch-master message, the once-a-second
// re-check, or a call that failed on the old master) moves every prefix watch while it
// holds watch_mu_, right after the new master became current: it starts a leg on the new
// master (which registers the presence key there, then subscribes), makes it current,
// and only then reports the gap (on_source_replaced) naming both masters. The API layer
// re-lists after the gap, so its listing is read from the new master after the new
// subscription is live: a change there is either in the listing or delivered. The old
// leg's deliveries are dropped from that point on (whatever it still receives is the
// old master's, which the listing replaces), and it is stopped outside every lock.
//
// A leg that cannot be started on the new master (it refuses, it is not reachable yet)
// leaves the watch without one: the gap says so, sync fails, and the monitor tries
// again at each re-check (kRecheckEvery) and reports another gap when it succeeds.
// A break of the current leg's channel is passed on as a gap and makes the monitor ask
// the sentinels at once (a failover is one reason for a break).
#include "redis/sentinel_backend_impl.hpp"

namespace distlock::detail::redis {

// Receives one prefix watch's deliveries from its legs and passes on those of the
// current one. The sink is called under mu_, so stop() returns only after the last
// call ended. Thread-safety: every member from any thread.
class SentinelWatchHub {
 public:
  SentinelWatchHub(SentinelBackend& backend, std::string prefix, LockEventSink& sink)
      : prefix(std::move(prefix)), backend_(backend), sink_(sink) {}

  const std::string prefix;

  // The current leg and the generation of the master it watches (null: none).
  std::pair<std::shared_ptr<SentinelWatchLeg>, std::uint64_t> current() const {
    LockGuard lk(mu_);
    return {leg_, generation_};
  }

  // Makes `leg` (null: none could be started) the current leg for the master of
  // `generation`, then reports `why` to the sink (unless empty): as a replaced source
  // when `replaced`, else as a gap. Returns the leg replaced, for the caller to destroy
  // outside every lock (its destructor joins the threads that call deliver()).
  std::shared_ptr<SentinelWatchLeg> install(std::shared_ptr<SentinelWatchLeg> leg, std::uint64_t generation,
                                            std::string why, bool replaced) {
    LockGuard lk(mu_);
    if (stopped_) return leg;
    std::swap(leg, leg_);
    generation_ = generation;
    if (!why.empty()) {
      if (replaced) {
        sink_.on_source_replaced(std::move(why));
      } else {
        sink_.on_gap(std::move(why));
      }
    }
    return leg;
  }

  // No delivery after this returns; the caller destroys the leg returned.
  std::shared_ptr<SentinelWatchLeg> stop() {
    LockGuard lk(mu_);
    stopped_ = true;
    return std::move(leg_);
  }

  void deliver(const SentinelWatchLeg* from, LockEvent&& ev) {
    LockGuard lk(mu_);
    if (!stopped_ && from == leg_.get()) sink_.on_event(std::move(ev));
  }

  void deliver_gap(const SentinelWatchLeg* from, std::string why) {
    {
      LockGuard lk(mu_);
      if (stopped_ || from != leg_.get()) return;
      sink_.on_gap(std::move(why));
    }
    backend_.request_recheck();
  }

 private:
  SentinelBackend& backend_;
  LockEventSink& sink_;
  mutable AnnotatedMutex mu_;
  std::shared_ptr<SentinelWatchLeg> leg_ DISTLOCK_GUARDED_BY(mu_);
  std::uint64_t generation_ DISTLOCK_GUARDED_BY(mu_) = 0;
  bool stopped_ DISTLOCK_GUARDED_BY(mu_) = false;
};

// A redis:// prefix watch on one master's backend, and the sink it delivers to.
class SentinelWatchLeg final : public LockEventSink {
 public:
  SentinelWatchLeg(std::shared_ptr<SentinelWatchHub> hub, std::shared_ptr<Backend> backend)
      : hub_(std::move(hub)), backend_(std::move(backend)) {}

  // Starts the redis:// watch (redis_watch.cpp); null with `ec` when it failed.
  static std::shared_ptr<SentinelWatchLeg> start(const std::shared_ptr<SentinelWatchHub>& hub,
                                                 std::shared_ptr<Backend> backend, Error& ec) {
    auto leg = std::make_shared<SentinelWatchLeg>(hub, std::move(backend));
    leg->watch_ = leg->backend_->watch_prefix(hub->prefix, *leg, ec);
    if (ec || !leg->watch_) return nullptr;
    return leg;
  }

  bool sync(Error& ec) { return watch_->sync(ec); }

  void on_event(LockEvent&& ev) noexcept override { hub_->deliver(this, std::move(ev)); }
  void on_gap(std::string why) noexcept override { hub_->deliver_gap(this, std::move(why)); }

 private:
  const std::shared_ptr<SentinelWatchHub> hub_;
  const std::shared_ptr<Backend> backend_;  // the master's backend the watch uses
  std::unique_ptr<PrefixWatch> watch_;      // last: stopped first
};

// The PrefixWatch handed to the API layer.
class SentinelPrefixWatch final : public PrefixWatch {
 public:
  SentinelPrefixWatch(SentinelBackend& backend, std::shared_ptr<SentinelWatchHub> hub)
      : backend_(backend), hub_(std::move(hub)) {}

  ~SentinelPrefixWatch() override {
    backend_.forget_prefix_watch(hub_.get());
    auto leg = hub_->stop();
    leg.reset();  // its subscription and presence renewals stop here
  }

  // The barrier of the current leg, valid only if the master did not change meanwhile
  // (a switch during it has reported its gap).
  bool sync(Error& ec) override {
    auto [leg, generation] = hub_->current();
    const std::string what = "watch of \"" + hub_->prefix + "\" on " + backend_.settings_.url;
    if (!leg) {
      ec.fail(errc::backend_unavailable, what + ": the master " + backend_.current_addr().text() +
                                             " cannot be watched yet (tried again every " +
                                             std::to_string(kRecheckEvery.count()) + " ms)");
      return false;
    }
    if (!leg->sync(ec)) return false;
    if (hub_->current().second != generation || backend_.current().second != generation) {
      ec.fail(errc::backend_unavailable, what + ": the master changed during the barrier");
      return false;
    }
    return true;
  }

 private:
  SentinelBackend& backend_;
  const std::shared_ptr<SentinelWatchHub> hub_;
};

std::unique_ptr<PrefixWatch> SentinelBackend::watch_prefix(std::string_view prefix, LockEventSink& sink,
                                                           Error& ec) {
  auto hub = std::make_shared<SentinelWatchHub>(*this, std::string(prefix), sink);
  // A switch between the start of the leg and its registration: start again on the
  // new master (a few times at most; each switch is a failover).
  for (int attempt = 0; attempt < 3; ++attempt) {
    ec.clear();
    auto [backend, generation] = current();
    auto leg = SentinelWatchLeg::start(hub, backend, ec);
    if (!leg) {
      // As every call: on backend_unavailable, once more on a master found since.
      if (ec == errc::backend_unavailable && attempt == 0 && rediscover(generation, false)) continue;
      return nullptr;  // the redis:// watch's error names the master and the problem
    }
    {
      LockGuard wl(watch_mu_);
      if (current().second == generation) {
        hub->install(std::move(leg), generation, {}, false);
        prefix_watches_.push_back(hub);
        return std::make_unique<SentinelPrefixWatch>(*this, std::move(hub));
      }
    }
    // `leg` (on the replaced master) is destroyed here, outside watch_mu_.
  }
  ec.fail(errc::backend_unavailable, "cannot watch \"" + std::string(prefix) + "\" on " + settings_.url +
                                         ": the master changed " + "three times while the watch started");
  return nullptr;
}

void SentinelBackend::forget_prefix_watch(const SentinelWatchHub* hub) {
  LockGuard wl(watch_mu_);
  std::erase_if(prefix_watches_, [&](const auto& h) { return h.get() == hub; });
}

void SentinelBackend::move_prefix_watches(const std::shared_ptr<Backend>& fresh, std::uint64_t generation,
                                          const Address& was, const Address& now,
                                          std::vector<std::shared_ptr<SentinelWatchLeg>>& retired) {
  for (const auto& hub : prefix_watches_) {
    Error ec;
    auto leg = SentinelWatchLeg::start(hub, fresh, ec);
    std::string why = "the master of \"" + master_name_ + "\" moved from " + was.text() + " to " +
                      now.text() +
                      ": events may have been missed, and changes the new master lacks (asynchronous " +
                      "replication) are gone";
    if (!leg) {
      why += "; the new master cannot be watched yet (" + ec.detail() + "), tried again every " +
             std::to_string(kRecheckEvery.count()) + " ms";
      log_.log(LogLevel::warning, "{}: cannot watch \"{}\" on the new master {}: {}", settings_.url,
               hub->prefix, now.text(), ec.detail());
    }
    retired.push_back(hub->install(std::move(leg), generation, std::move(why), true));
  }
}

// The monitor thread: a prefix watch without a leg on the current master (its start
// there failed) gets one, and a gap (the master published unwatched meanwhile).
void SentinelBackend::retry_prefix_watches() {
  auto [backend, generation] = current();
  std::vector<std::shared_ptr<SentinelWatchHub>> due;
  {
    LockGuard wl(watch_mu_);
    for (const auto& hub : prefix_watches_) {
      auto [leg, gen] = hub->current();
      if (!leg || gen != generation) due.push_back(hub);
    }
  }
  for (const auto& hub : due) {
    Error ec;
    std::shared_ptr<SentinelWatchLeg> leg = SentinelWatchLeg::start(hub, backend, ec);
    if (!leg) {
      log_.log(LogLevel::debug, "{}: cannot watch \"{}\" on the master {} yet: {}", settings_.url,
               hub->prefix, current_addr().text(), ec.detail());
      continue;
    }
    std::shared_ptr<SentinelWatchLeg> old;
    {
      LockGuard wl(watch_mu_);
      const bool registered =
          std::find(prefix_watches_.begin(), prefix_watches_.end(), hub) != prefix_watches_.end();
      if (registered && current().second == generation) {
        old = hub->install(std::move(leg), generation,
                           "the watch of the master " + current_addr().text() +
                               " started late (after a failover): events may have been missed",
                           false);
      }
    }
    // `old`, and `leg` if it was not installed, are destroyed here, outside watch_mu_.
  }
}

}  // namespace distlock::detail::redis
