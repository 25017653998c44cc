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
// subscription is live: a change there is either in the listing or delivered.
//
// The old leg is not stopped at the switch: the old master may still take writes from
// clients that have not switched yet (after a manual failover it stays writable until
// the sentinels reconfigure it; a frozen master that wakes up is writable until they
// do), and those changes may be missing on the new master. The old leg "drains": its
// events are not passed on (they are the old master's, which the listing replaces),
// but each one marks the watch, and the drainer thread (drain_legs) reports a gap for
// the marks every kDrainPoll. The drain ends when
// - the old master answers ROLE as a replica: proof that it refuses writes from then
//   on; a barrier on the old leg (its sync marker) then proves that every change it
//   published before has arrived, and been reported as a gap;
// - the old leg's channel breaks, or kDrainFor passes, without that proof: a gap (what
//   the old master took after that is not watched);
// - the watch stops.
// After a demotion the old master replays the new master's publications, so a few
// gaps in the kDrainPoll before the drainer sees the demotion may be needless; they
// are never missing.
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
  // When `replaced`, the leg replaced drains instead (see above): it is returned for
  // the caller to hand to the drainer, `was` names its master.
  std::shared_ptr<SentinelWatchLeg> install(std::shared_ptr<SentinelWatchLeg> leg, std::uint64_t generation,
                                            std::string why, bool replaced, const std::string& was = {}) {
    LockGuard lk(mu_);
    if (stopped_) return leg;
    std::swap(leg, leg_);
    generation_ = generation;
    if (replaced && leg) draining_.push_back({leg, was, false, {}});
    if (!why.empty()) {
      if (replaced) {
        sink_.on_source_replaced(std::move(why));
      } else {
        sink_.on_gap(std::move(why));
      }
    }
    return leg;
  }

  // No delivery after this returns; the caller destroys the legs returned.
  std::vector<std::shared_ptr<SentinelWatchLeg>> stop() {
    LockGuard lk(mu_);
    stopped_ = true;
    std::vector<std::shared_ptr<SentinelWatchLeg>> legs;
    legs.push_back(std::move(leg_));
    for (auto& d : draining_) legs.push_back(std::move(d.leg));
    draining_.clear();
    return legs;
  }

  void deliver(const SentinelWatchLeg* from, LockEvent&& ev) {
    LockGuard lk(mu_);
    if (stopped_) return;
    if (from == leg_.get()) {
      sink_.on_event(std::move(ev));
    } else if (Draining* d = find_draining(from)) {
      d->changed = true;  // reported as a gap by flush() or retire()
    }
  }

  void deliver_gap(const SentinelWatchLeg* from, std::string why) {
    {
      LockGuard lk(mu_);
      if (stopped_) return;
      if (from != leg_.get()) {
        if (Draining* d = find_draining(from); d && d->broke.empty()) d->broke = std::move(why);
        return;
      }
      sink_.on_gap(std::move(why));
    }
    backend_.request_recheck();
  }

  // The drainer: a gap if the draining `leg` carried a change since the last one.
  void flush(const SentinelWatchLeg* leg, const std::string& now) {
    LockGuard lk(mu_);
    Draining* d = stopped_ ? nullptr : find_draining(leg);
    if (!d || !d->changed) return;
    d->changed = false;
    sink_.on_gap(changed_why(*d, now));
  }

  // The drainer: whether `leg` still drains (not retired, its watch not stopped).
  bool draining(const SentinelWatchLeg* leg) const {
    LockGuard lk(mu_);
    return std::any_of(draining_.begin(), draining_.end(), [&](const auto& d) { return d.leg.get() == leg; });
  }

  // The drainer: why the draining `leg`'s channel broke ("" while it did not).
  std::string broke(const SentinelWatchLeg* leg) const {
    LockGuard lk(mu_);
    for (const auto& d : draining_)
      if (d.leg.get() == leg) return d.broke;
    return {};
  }

  // The drainer: ends the drain of `leg`, with a gap if it carried a change since the
  // last one, or if `unproven` (why the old master may still take writes unwatched) is
  // not empty. Returns the leg, for the caller to destroy outside every lock.
  std::shared_ptr<SentinelWatchLeg> retire(const SentinelWatchLeg* leg, const std::string& now,
                                           const std::string& unproven) {
    LockGuard lk(mu_);
    auto it =
        std::find_if(draining_.begin(), draining_.end(), [&](const auto& d) { return d.leg.get() == leg; });
    if (it == draining_.end()) return nullptr;
    if (!stopped_) {
      if (it->changed) sink_.on_gap(changed_why(*it, now));
      if (!unproven.empty())
        sink_.on_gap("the watch of the replaced master " + it->was + " of \"" + prefix + "\" ended (" +
                     unproven +
                     ") before it answered as a replica: changes it takes from clients that have not " +
                     "switched to " + now + " are not watched, and are missing on the new master");
    }
    auto leg_out = std::move(it->leg);
    draining_.erase(it);
    return leg_out;
  }

 private:
  SentinelBackend& backend_;
  LockEventSink& sink_;
  mutable AnnotatedMutex mu_;
  std::shared_ptr<SentinelWatchLeg> leg_ DISTLOCK_GUARDED_BY(mu_);
  std::uint64_t generation_ DISTLOCK_GUARDED_BY(mu_) = 0;
  bool stopped_ DISTLOCK_GUARDED_BY(mu_) = false;

  // A leg on a replaced master, kept until the drainer retires it.
  struct Draining {
    std::shared_ptr<SentinelWatchLeg> leg;
    std::string was;    // its master
    bool changed;       // it carried a change not yet reported as a gap
    std::string broke;  // why its channel broke ("" while it did not)
  };
  std::vector<Draining> draining_ DISTLOCK_GUARDED_BY(mu_);

  Draining* find_draining(const SentinelWatchLeg* leg) DISTLOCK_REQUIRES(mu_) {
    for (auto& d : draining_)
      if (d.leg.get() == leg) return &d;
    return nullptr;
  }
  std::string changed_why(const Draining& d, const std::string& now) const {
    return "the replaced master " + d.was + " published a change under \"" + prefix + "\" after the watch " +
           "switched to " + now +
           " (a client had not switched yet): it is not reported, and may be missing " + "on the new master";
  }
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
    auto legs = hub_->stop();
    legs.clear();  // their subscriptions and presence renewals stop here (a draining leg
                   // the drainer still holds stops when it lets go, without delivering)
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
                                          std::vector<DrainingLeg>& draining) {
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
    if (auto old = hub->install(std::move(leg), generation, std::move(why), true, was.text()))
      draining.push_back({hub, std::move(old)});
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

void SentinelBackend::start_drain(const Address& was, std::vector<DrainingLeg> legs) {
  {
    LockGuard lk(drain_mu_);
    drains_.push_back({was, Steady::now() + kDrainFor, std::move(legs)});
  }
  drainer_.wake();
}

std::string SentinelBackend::role_of(const Address& a) {
  ConnectionOptions o = master_tpl_;
  o.host = a.host;
  o.port = a.port;
  o.connect_timeout = std::min(o.connect_timeout, kDrainProbeTimeout);
  o.command_timeout = std::min(o.command_timeout, kDrainProbeTimeout);
  Connection c(o);
  Error ec;
  Reply r = c.command({"ROLE"}, ec);
  if (ec || r->type != REDIS_REPLY_ARRAY || r->elements == 0) return {};
  return std::string(redis::reply_str(r->element[0]));
}

// The drainer thread: every kDrainPoll, for each replaced master with draining legs,
// reports their changes as gaps, then asks the old master its role and retires the
// legs whose drain ended (see the top of this file).
void SentinelBackend::drain_legs() {
  while (!drainer_.stopping()) {
    std::vector<Drain> work;
    {
      LockGuard lk(drain_mu_);
      work = drains_;
    }
    if (work.empty()) {
      pollfd p{drainer_.wake_fd(), POLLIN, 0};
      if (::poll(&p, 1, -1) > 0) drainer_.clear_wake();
      continue;
    }
    const std::string now = current_addr().text();
    std::vector<std::shared_ptr<SentinelWatchLeg>> done;  // destroyed outside every lock
    for (const auto& d : work) {
      for (const auto& dl : d.legs) dl.hub->flush(dl.leg.get(), now);
      const std::string role = role_of(d.was);
      const bool demoted = !role.empty() && role != "master";
      const bool late = Steady::now() >= d.until;
      std::size_t ended = 0;
      for (const auto& dl : d.legs) {
        std::string unproven = dl.hub->broke(dl.leg.get());
        if (demoted) {
          // Everything the old master published before it refused writes arrives
          // before this marker, and is reported by retire().
          Error ec;
          unproven =
              dl.leg->sync(ec) ? std::string() : "the barrier after its demotion failed: " + ec.detail();
        } else if (unproven.empty() && late) {
          unproven =
              "it did not answer ROLE as a replica within " + std::to_string(kDrainFor.count()) + " ms" +
              (role.empty()
                   ? " (it did not answer within " + std::to_string(kDrainProbeTimeout.count()) + " ms)"
                   : " (it answers \"" + role + "\")");
        } else if (unproven.empty()) {
          continue;
        } else {
          unproven = "its subscription reported: " + unproven;
        }
        if (auto leg = dl.hub->retire(dl.leg.get(), now, unproven)) done.push_back(std::move(leg));
        ++ended;
      }
      if (ended == d.legs.size() || demoted || late) {
        log_.log(demoted ? LogLevel::debug : LogLevel::warning,
                 "{}: the prefix watches of the replaced master {} stop ({})", settings_.url, d.was.text(),
                 demoted ? "it answers ROLE as \"" + role + "\"" : "without proof that it was demoted");
      }
    }
    {
      // A drain ends once none of its legs is draining any more (retired, or its watch
      // stopped): drop the legs retired this round.
      LockGuard lk(drain_mu_);
      for (auto& d : drains_) {
        std::erase_if(d.legs, [](const DrainingLeg& dl) { return !dl.hub->draining(dl.leg.get()); });
      }
      std::erase_if(drains_, [](const Drain& d) { return d.legs.empty(); });
    }
    work.clear();
    done.clear();
    pollfd p{drainer_.wake_fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kDrainPoll.count())) > 0) drainer_.clear_wake();
  }
  LockGuard lk(drain_mu_);
  drains_.clear();
}

}  // namespace distlock::detail::redis
