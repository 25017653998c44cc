#include "core/engine.hpp"

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>

#include "core/owner_id.hpp"

namespace distlock::detail {

namespace {

std::string held_key(std::string_view name, std::string_view owner) {
  std::string key;
  key.reserve(name.size() + owner.size() + 1);
  key.append(name);
  key.push_back('\0');
  key.append(owner);
  return key;
}

constexpr Clock::time_point kNever = Clock::time_point::max();

// Re-check interval while waiting when no notification arrives: capped by the
// holder's remaining TTL (a lost notification cannot stall a waiter longer than
// the lease it waits for), jittered so waiters do not re-check in lockstep.
Millis recheck_delay(std::optional<Millis> holder_ttl, Millis ttl) {
  Millis cap = holder_ttl.value_or(ttl);
  cap = std::clamp(cap, Millis(5), Millis(std::chrono::seconds(5)));
  thread_local std::minstd_rand rng{std::random_device{}()};
  std::uniform_int_distribution<std::int64_t> jitter(0, std::max<std::int64_t>(1, cap.count() / 10));
  return cap + Millis(jitter(rng));
}

}  // namespace

std::string owner_for_this_thread(const std::string& client_id) {
  static std::atomic<std::uint64_t> next_thread_seq{1};
  thread_local const std::uint64_t seq = next_thread_seq.fetch_add(1, std::memory_order_relaxed);
  return client_id + ":" + std::to_string(seq);
}

std::pair<std::string_view, std::optional<std::string_view>> split_owner(std::string_view owner) noexcept {
  const auto bar = owner.find('|');
  if (bar == std::string_view::npos) return {owner, std::nullopt};
  return {owner.substr(0, bar), owner.substr(bar + 1)};
}

std::string_view thread_owner_of(std::string_view owner) noexcept {
  owner = split_owner(owner).first;
  const auto dot = owner.rfind('.');
  return dot == std::string_view::npos ? owner : owner.substr(0, dot);
}

namespace {
// What a forked child inherits of its parent's engines is kept, untouched, for the
// life of the child: their threads do not exist there (joining would hang), their
// condition variables may count the parent's waiters (destroying them would hang),
// and their backends' sockets are still the parent's (closing a session or
// releasing from the child would act for the parent).
void keep_forked_engine(Engine* engine) noexcept {
  static std::mutex mu;
  static auto* kept = new std::vector<Engine*>;  // never destroyed, never read
  std::lock_guard lk(mu);
  try {
    kept->push_back(engine);
  } catch (...) {
  }
}
}  // namespace

std::shared_ptr<Engine> Engine::create(std::unique_ptr<Backend> backend, ClientOptions opts) {
  std::shared_ptr<Engine> engine(new Engine(std::move(backend), std::move(opts)), [](Engine* e) {
    if (e->forked()) {
      keep_forked_engine(e);
    } else if (UserCodeScope::active() || e->on_own_thread()) {
      // The last handle went on a thread the destructor must join (a loss callback
      // on the event thread, a std::stop_callback run by the renewer, the watchdog or
      // a backend's notifier while it signalled a loss): finish on a thread of its
      // own, which can join them.
      try {
        std::thread([e] { delete e; }).detach();
      } catch (...) {
        keep_forked_engine(e);  // no thread to be had: keep it rather than crash
      }
    } else {
      delete e;
    }
  });
  // Before the listener: a backend may report a loss (whose callbacks are queued for
  // this thread) as soon as it has one.
  engine->events_.start();
  engine->backend_->set_listener(engine.get());
  if (engine->opts_.background_renewal && engine->caps_.needs_renewal) engine->renewer_.start();
  return engine;
}

Engine::Engine(std::unique_ptr<Backend> backend, ClientOptions opts)
    : backend_(std::move(backend)),
      opts_(std::move(opts)),
      caps_(backend_->capabilities()),
      clock_(opts_.clock ? opts_.clock : system_steady_clock()),
      client_id_(random_client_id()),
      fork_gen_(fork_generation()),
      log_(opts_.logger),
      renewer_(
          clock_, [this] { return renew_round(); }, [this] { return watchdog_round(); }),
      hand_back_([this](HeldLock& held) { forget_now(held); }) {
  if (opts_.metrics) {
    const std::string url = backend_->url();
    metrics_ = std::make_unique<Metrics>(url.substr(0, url.find("://")));
  }
}

Engine::~Engine() {
  renewer_.stop_and_join();
  // Leases still held when the last Client handle goes away are released (best
  // effort), so a process that forgets a guard does not block others for a TTL.
  std::vector<std::shared_ptr<HeldLock>> left;
  {
    LockGuard lk(mu_);
    for (auto& [k, h] : held_) left.push_back(h);
    held_.clear();
  }
  for (auto& h : left) {
    if (h->lost.load()) continue;
    Error ec;
    backend_->release(h->name, h->owner, h->token, ec);
  }
  // Lost leases not yet handed back: the hand-back thread finishes the batch under way
  // and is joined; the rest is handed back here, while the backend still exists.
  std::vector<std::shared_ptr<HeldLock>> unforgotten = hand_back_.close_and_join();
  for (auto& h : unforgotten) forget_now(*h);
  // The backend (and its notification threads) goes before the engine's members.
  backend_.reset();
  // Last: nothing can queue a callback any more. Callbacks already queued still run
  // (a loss seen is reported), then the event thread ends.
  events_.stop_and_join();
}

std::error_code Engine::check_name(std::string_view name, std::string& why) {
  if (name.empty()) {
    why = "lock name is empty";
    return make_error_code(errc::invalid_argument);
  }
  if (name.size() > 4096) {
    why = "lock name is " + std::to_string(name.size()) + " bytes long; the limit is 4096";
    return make_error_code(errc::invalid_argument);
  }
  if (name.find('\0') != std::string_view::npos) {
    why = "lock name contains a NUL byte";
    return make_error_code(errc::invalid_argument);
  }
  return {};
}

std::shared_ptr<Engine::WaitSlot> Engine::join_wait(const std::string& name) {
  LockGuard lk(mu_);
  auto& slot = waits_[name];
  if (!slot) slot = std::make_shared<WaitSlot>();
  if (slot->waiters++ == 0 && slot->watched) --idle_watches_;
  return slot;
}

bool Engine::ensure_watched(std::string_view name, const std::shared_ptr<WaitSlot>& slot,
                            Clock::time_point until, const std::stop_token& cancel) {
  {
    UniqueLock lk(mu_);
    // Another waiter of this name is subscribing: wait for it, so that the
    // re-check that follows happens with notifications live (a release in
    // between is then either seen by the re-check or notified). A cancelled
    // acquire stops waiting (its stop callback notifies slot->cv under mu_).
    while (slot->watch_pending && !cancel.stop_requested() && clock_->now() < until)
      clock_->wait_until(slot->cv, lk.native(), until);
    if (slot->watched) return true;
    if (cancel.stop_requested()) return false;
    if (slot->watch_pending || clock_->now() < slot->watch_retry_at) return false;
    slot->watch_pending = true;
  }
  Error ec;
  try {
    backend_->watch(name, ec);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  {
    LockGuard lk(mu_);
    slot->watch_pending = false;
    slot->watched = !ec;
    if (ec) slot->watch_retry_at = clock_->now() + kWatchRetry;
    slot->cv.notify_all();
  }
  if (ec) {
    // Degraded, not failed: the waiter re-checks on a short bounded period until a
    // later subscription succeeds. Said once per client at warning level.
    const LogLevel level = warned_watch_failure_.exchange(true) ? LogLevel::debug : LogLevel::warning;
    log_.log(
        level,
        "cannot watch lock \"{}\" for releases: {}{}; waiting by re-checks every {} ms until a watch works",
        name, ec.message(), ec.detail().empty() ? std::string() : " (" + ec.detail() + ")",
        kDegradedRecheck.count());
  }
  return !ec;
}

void Engine::leave_wait(const std::string& name) {
  bool unwatch_now = false;
  {
    LockGuard lk(mu_);
    auto it = waits_.find(name);
    if (it == waits_.end() || --it->second->waiters > 0) return;
    WaitSlot& slot = *it->second;
    if (slot.watch_pending) return;  // the subscribing waiter is still inside ensure_watched
    if (!slot.watched) {
      waits_.erase(it);
      return;
    }
    // Keep the subscription for a while: under contention the same name is
    // waited for again at once, and re-subscribing costs round trips on the
    // hand-off path. Idle subscriptions are bounded in number and age.
    if (idle_watches_ >= kMaxIdleWatches) {
      waits_.erase(it);
      unwatch_now = true;
    } else {
      slot.idle_since = clock_->now();
      ++idle_watches_;
    }
  }
  if (unwatch_now) backend_->unwatch(name);
}

Engine::NameWatch::NameWatch(std::shared_ptr<Engine> engine, std::string name)
    : engine_(std::move(engine)), name_(std::move(name)) {
  slot_ = engine_->join_wait(name_);
}

Engine::NameWatch::~NameWatch() {
  engine_->leave_wait(name_);
}

bool Engine::NameWatch::arm(Clock::time_point until) {
  return engine_->ensure_watched(name_, slot_, until);
}

std::uint64_t Engine::NameWatch::generation() const {
  LockGuard lk(engine_->mu_);
  return slot_->generation;
}

bool Engine::NameWatch::wait(std::uint64_t seen, Clock::time_point until) {
  UniqueLock lk(engine_->mu_);
  while (slot_->generation == seen && engine_->clock_->now() < until) {
    engine_->clock_->wait_until(slot_->cv, lk.native(), until);
  }
  return slot_->generation != seen;
}

void Engine::sweep_idle_watches(bool all) noexcept {
  std::vector<std::string> gone;
  {
    LockGuard lk(mu_);
    const Clock::time_point cutoff = clock_->now() - kIdleWatchKeep;
    for (auto it = waits_.begin(); it != waits_.end();) {
      const WaitSlot& slot = *it->second;
      if (slot.waiters == 0 && slot.watched && (all || slot.idle_since <= cutoff)) {
        gone.push_back(it->first);
        --idle_watches_;
        it = waits_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& name : gone) backend_->unwatch(name);
}

bool Engine::forked() const noexcept {
  return fork_generation() != fork_gen_;
}

std::shared_ptr<HeldLock> Engine::acquire(std::string_view name, const LockOptions& opts,
                                          std::optional<Millis> wait, Error& ec, Reentry reentry) {
  const std::string_view names[1] = {name};
  return acquire_impl(names, {}, opts, wait, ec, reentry, nullptr);
}

std::shared_ptr<HeldLock> Engine::acquire_any(std::span<const std::string> names, const LockOptions& opts,
                                              std::optional<Millis> wait, Error& ec, std::string_view gate,
                                              std::size_t* index) {
  ec.clear();
  if (names.empty()) {
    ec = make_error_code(errc::invalid_argument);
    return nullptr;
  }
  std::vector<std::string_view> views(names.begin(), names.end());
  return acquire_impl(views, gate, opts, wait, ec, Reentry::never, index);
}

std::shared_ptr<HeldLock> Engine::acquire_impl(std::span<const std::string_view> names, std::string_view gate,
                                               const LockOptions& in_opts, std::optional<Millis> wait,
                                               Error& ec, Reentry reentry, std::size_t* index) {
  ec.clear();
  if (forked()) {
    ec = make_error_code(errc::forked);  // not counted: the counters are the parent's
    return nullptr;
  }
  const Clock::time_point called = clock_->now();  // the wait counts from here
  // Metrics count a multi-name acquisition under its first name.
  const std::string_view name = names.front();
  std::string why;
  for (const std::string_view n : names) {
    if ((ec = check_name(n, why))) {
      log_.log(LogLevel::debug, "acquire rejected: {}", why);
      count_acquire_failure(name, ec);
      return nullptr;
    }
  }
  if (!gate.empty() && (ec = check_name(gate, why))) {
    log_.log(LogLevel::debug, "acquire rejected: {}", why);
    count_acquire_failure(name, ec);
    return nullptr;
  }
  LockOptions opts = in_opts;
  if ((ec = opts.validate_and_fill())) {
    count_acquire_failure(name, ec);
    return nullptr;
  }
  if (wait && wait->count() < 0) wait = Millis(0);
  // A wait too long to add to a clock reading is a wait without limit.
  if (wait && *wait >= LockOptions::max_wait) wait.reset();

  const std::string thread_owner = owner_for_this_thread(client_id_);

  std::shared_ptr<HeldLock> expired;
  if (names.size() == 1) {  // Reentry by the same thread: no round trip.
    const std::string key = held_key(name, thread_owner);
    if (opts.max_hold && reentry == Reentry::by_thread) ensure_watchdog();
    LockGuard lk(mu_);
    auto it = held_.find(key);
    if (it != held_.end() && !it->second->lost.load() && it->second->owns() && it->second->reentrant &&
        reentry == Reentry::by_thread) {
      HeldLock& h = *it->second;
      // The re-entered hold shares the outer one's lease: its max_hold bounds that
      // lease from now on (the limit only ever comes nearer).
      if (opts.max_hold) {
        const Clock::time_point limit = clock_->now() + *opts.max_hold;
        if (limit < h.hold_limit()) {
          h.set_hold_limit(limit);
          if (h.deadline() > limit) h.set_deadline(limit);
          if (h.deadline() >= limit) h.next_renew = kNever;
          renewer_.deadline_earlier(h.deadline());
        }
      }
      ++h.hold_count;
      return it->second;
    }
    // Past its local deadline but not yet declared (the watchdog has not run): the
    // new acquisition below will replace it in held_, where the watchdog would never
    // see it again, so its loss is signalled here.
    if (it != held_.end() && !it->second->released && !it->second->lost.load() && !it->second->owns()) {
      expired = it->second;
    }
  }
  if (expired)
    declare_lost(expired, expired->expiry_reason(), "local deadline passed without a successful renewal");

  // Every acquisition is a new owner on the server: see HeldLock::owner.
  std::string owner = thread_owner;
  owner.push_back('.');
  owner.append(std::to_string(next_acquisition_.fetch_add(1, std::memory_order_relaxed)));
  if (!opts.holder_info.empty()) {  // validated: printable, no '|', cut to max_holder_info
    owner.push_back('|');
    owner.append(opts.holder_info);
  }
  if (opts.max_hold) ensure_watchdog();

  {
    LockGuard lk(mu_);
    inflight_.emplace(owner, InflightLosses{});
  }
  std::shared_ptr<HeldLock> held;
  std::uint64_t epoch_at_send = 0;
  std::size_t got = 0;
  try {
    held = acquire_loop(names, gate, opts, wait, owner, called, epoch_at_send, got, ec);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  if (ec || !held) {
    if (!ec) ec = make_error_code(errc::protocol_error);
    count_acquire_failure(name, ec);
    LockGuard lk(mu_);
    inflight_.erase(owner);
    // Busy because this very thread holds the name (a Mutex, or another Lease): say so,
    // since the holder named by the server would be this process.
    if ((ec == errc::busy || ec == errc::timeout) && names.size() == 1 && ec.detail().empty()) {
      auto it = held_.find(held_key(name, thread_owner));
      if (it != held_.end() && !it->second->released && !it->second->lost.load()) {
        ec.set_detail(
            "held by this thread through a Mutex or another Lease; a Lease is not re-entrant, only "
            "Mutex re-enters (lock the Mutex again, or release the other Lease first)");
      }
    }
    return nullptr;
  }
  if (index) *index = got;
  const std::string key = held_key(held->name, thread_owner);
  held->reentrant = reentry == Reentry::by_thread;
  n_acquired_.fetch_add(1, std::memory_order_relaxed);
  if (metrics_) {  // before the lease is published: a loss from now on finds its series
    held->metrics = metrics_->series_for(held->name);
    held->granted_at = clock_->now();
    metrics_->acquired(held->metrics, held->granted_at - called);
  }
  bool session_gone = false, lease_gone = false;
  // This thread's earlier hold of the name, if still listed and not yet declared
  // lost, is past its local deadline (re-entry above refused it). Once replaced here
  // the watchdog would never see it: its loss is declared below.
  std::shared_ptr<HeldLock> replaced;
  {
    LockGuard lk(mu_);
    auto& entry = held_[key];
    if (entry && entry != held && !entry->released && !entry->lost.load()) replaced = entry;
    // A lost hold of this thread not yet unlocked (nested re-lock after a loss):
    // kept so that the outer unlock finds it again once this one is released.
    if (entry && !entry->released) held->displaced = entry;
    entry = held;
    // A validity lowered while this grant was under way (its answer may have counted
    // the old one), even if raised again since.
    cap_validity(*held, validity_cap_);
    if (auto f = inflight_.find(owner); f != inflight_.end()) cap_validity(*held, f->second.min_cap);
    // on_session_lost bumps the epoch and collects held_ under mu_: a session lost
    // after this grant was sent but before this insertion missed this lease.
    session_gone = session_epoch_.load(std::memory_order_acquire) != epoch_at_send;
    // Likewise a loss of this very lease reported before it was recorded.
    if (auto f = inflight_.find(owner); f != inflight_.end()) {
      const auto& lost = f->second;
      lease_gone =
          lost.all || std::find(lost.names.begin(), lost.names.end(), held->name) != lost.names.end();
      inflight_.erase(f);
    }
    // Wake the renewer only if this lease needs it earlier than it planned to wake:
    // an uncontended acquire should not cost a context switch.
    if (caps_.needs_renewal) renewer_.renew_earlier(held->next_renew - held->opts.renew_interval / 4);
    // The watchdog: woken if this deadline comes first, or (awake, its last scan may
    // predate this lease) scans again before sleeping.
    if (caps_.needs_renewal || held->hold_limit() != kNever) renewer_.deadline_earlier(held->deadline());
  }
  if (replaced)
    declare_lost(replaced, replaced->expiry_reason(), "local deadline passed without a successful renewal");
  if (session_gone)
    declare_lost(held, LossReason::session_lost, "session lost while the lock was being granted");
  if (lease_gone) {
    declare_lost(held, LossReason::lease_ended, "the server ended its lease while it was being granted");
  }
  return held;
}

// The acquire loop proper, over one name or several. Whatever way it ends
// (acquired, busy, timeout, an error or an exception from the backend), it leaves no
// wait slot joined and no queued place on the server behind.
std::shared_ptr<HeldLock> Engine::acquire_loop(std::span<const std::string_view> names, std::string_view gate,
                                               const LockOptions& opts, std::optional<Millis> wait,
                                               const std::string& owner, Clock::time_point start,
                                               std::uint64_t& epoch_at_send, std::size_t& index, Error& ec) {
  const Clock::time_point wait_deadline = wait ? start + *wait : kNever;
  const bool may_wait = !wait || wait->count() > 0;
  // A gated acquisition keeps no place in the names' queues: it may have to stop
  // trying them (the gate got held), and a place kept meanwhile would block the
  // gate's holder (a writer waiting for every reader slot).
  const bool keep_queued = may_wait && gate.empty();

  struct Candidate {
    std::string name;
    std::shared_ptr<WaitSlot> slot;  // joined on the first wait
    std::uint64_t generation = 0;    // the slot's generation before the last try
    bool watched = false;
    bool queued = false;  // tried with keep_queued: may hold a place on the server
    bool try_now = true;
    std::optional<Millis> holder_ttl;
  };
  std::vector<Candidate> cands(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) cands[i].name = std::string(names[i]);
  std::optional<Candidate> gate_cand;
  if (!gate.empty()) {
    gate_cand.emplace();
    gate_cand->name = std::string(gate);
  }
  std::condition_variable wake;  // registered in every joined slot
  std::optional<std::size_t> acquired;
  const auto cancelled = [&] {
    if (!opts.cancel.stop_requested()) return false;
    ec = make_error_code(errc::cancelled);
    return true;
  };
  if (cancelled()) return nullptr;
  // A cancel wakes the wait below; taking mu_ first means the waiter is either asleep
  // on `wake` (and notified) or has not yet tested the stop (and will see it).
  // A waiter waiting for another waiter's subscription (ensure_watched) waits on its
  // names' slots: those are notified too (the other waiters there only look again).
  std::stop_callback on_cancel(opts.cancel, [&] {
    {
      LockGuard lk(mu_);
      for (std::size_t i = 0; i <= cands.size(); ++i) {
        const std::string* name = i < cands.size() ? &cands[i].name : gate_cand ? &gate_cand->name : nullptr;
        if (!name) continue;
        if (auto it = waits_.find(*name); it != waits_.end()) it->second->cv.notify_all();
      }
    }
    wake.notify_all();
  });

  struct Cleanup {
    Engine* engine;
    std::vector<Candidate>& cands;
    std::optional<Candidate>& gate;
    std::condition_variable* wake;
    const std::optional<std::size_t>& acquired;
    std::string_view owner;
    ~Cleanup() {
      auto leave = [&](Candidate& c) {
        if (!c.slot) return;
        {
          LockGuard lk(engine->mu_);
          auto& l = c.slot->listeners;
          l.erase(std::remove(l.begin(), l.end(), wake), l.end());
        }
        engine->leave_wait(c.name);
      };
      if (gate) leave(*gate);
      for (std::size_t i = 0; i < cands.size(); ++i) {
        leave(cands[i]);
        if (cands[i].queued && acquired != i) engine->backend_->cancel_acquire(cands[i].name, owner);
      }
    }
  } cleanup{this, cands, gate_cand, &wake, acquired, owner};

  auto join = [&](Candidate& c) {
    if (c.slot) return;
    c.slot = join_wait(c.name);
    LockGuard lk(mu_);
    c.slot->listeners.push_back(&wake);
    c.generation = c.slot->generation;
  };

  AcquireResult res;
  Clock::time_point sent{};
  for (;;) {
    {  // Generations before the attempts: a change after this is not missed.
      LockGuard lk(mu_);
      if (gate_cand && gate_cand->slot) gate_cand->generation = gate_cand->slot->generation;
      for (auto& c : cands) {
        if (c.try_now && c.slot) c.generation = c.slot->generation;
      }
    }
    bool gate_held = false;
    if (gate_cand) {
      const LockInfo info = backend_->status(gate_cand->name, ec);
      if (ec) return nullptr;
      gate_held = info.held;
      gate_cand->holder_ttl = info.ttl_remaining;
      if (gate_held) {
        for (auto& c : cands) c.try_now = true;  // all of them once the gate is free
      }
    }
    if (!gate_held) {
      for (std::size_t i = 0; i < cands.size(); ++i) {
        Candidate& c = cands[i];
        if (!c.try_now) continue;
        AcquireRequest req{c.name, owner, opts.ttl, keep_queued};
        epoch_at_send = session_epoch_.load(std::memory_order_acquire);
        sent = clock_->now();
        c.queued = c.queued || keep_queued;
        res = backend_->try_acquire(req, ec);
        if (ec) return nullptr;
        if (res.acquired) {
          acquired = i;
          break;
        }
        c.try_now = false;
        c.holder_ttl = res.holder_ttl;
      }
      if (acquired) break;
    }
    Clock::time_point now = clock_->now();
    if (cancelled()) return nullptr;
    if (!may_wait || now >= wait_deadline) {
      ec = make_error_code(may_wait ? errc::timeout : errc::busy);
      return nullptr;
    }
    // What to wait for: the gate while it is held, else every name.
    std::vector<Candidate*> waited;
    if (gate_held) {
      waited.push_back(&*gate_cand);
    } else {
      for (auto& c : cands) waited.push_back(&c);
    }
    // Subscribe (or wait for the waiter that is subscribing), then look again before
    // sleeping: a change between the attempt and the subscription must not be missed.
    bool again = false, degraded = false;
    for (Candidate* c : waited) {
      join(*c);
      if (c->watched) continue;
      c->watched = ensure_watched(c->name, c->slot, wait_deadline, opts.cancel);
      if (c->watched) {
        c->try_now = true;
        again = true;
      } else {
        degraded = true;
      }
    }
    if (cancelled()) return nullptr;  // no attempt after a cancel
    if (again) continue;
    now = clock_->now();
    Millis delay = Millis::max();
    for (Candidate* c : waited) delay = std::min(delay, recheck_delay(c->holder_ttl, opts.ttl));
    if (degraded) delay = std::min(delay, kDegradedRecheck);
    const Clock::time_point recheck = std::min(wait_deadline, now + delay);
    bool changed = false;
    {
      UniqueLock lk(mu_);
      auto any_changed = [&] {
        for (Candidate* c : waited) {
          if (c->slot->generation != c->generation) return true;
        }
        return false;
      };
      while (!(changed = any_changed()) && !opts.cancel.stop_requested() && clock_->now() < recheck)
        clock_->wait_until(wake, lk.native(), recheck);
      for (Candidate* c : waited) {
        // Try again what changed; a subscription dropped by sweep or failure shows
        // as !watched and is tried (and subscribed) again.
        if (c->slot->generation != c->generation || !c->slot->watched) c->try_now = true;
        if (!c->slot->watched) c->watched = false;
      }
    }
    if (!changed) {
      for (Candidate* c : waited) c->try_now = true;  // re-check due: all of them
    }
  }

  index = *acquired;
  auto held = std::make_shared<HeldLock>();
  held->name = cands[index].name;
  held->owner = owner;
  held->fork_gen = fork_gen_;
  held->token = res.token;
  held->has_token = caps_.fencing;
  held->opts = opts;
  held->clock = clock_;
  held->hold_count = 1;
  held->validity = res.validity.count() > 0 ? res.validity : opts.ttl;
  // A backend may grant less than the TTL (a ZooKeeper session shorter than it,
  // Redlock's drift): renew on the validity's schedule, never after its deadline.
  held->opts.renew_interval = std::max(Millis(1), std::min(opts.renew_interval, held->validity / 3));
  if (opts.max_hold) held->set_hold_limit(sent + *opts.max_hold);
  held->confirmed_sent = sent;
  if (caps_.needs_renewal) {
    held->set_deadline(std::min(sent + held->validity - opts.safety_margin, held->hold_limit()));
    held->next_renew = held->deadline() >= held->hold_limit() ? kNever : sent + held->opts.renew_interval;
  } else {
    held->set_deadline(held->hold_limit());  // kNever without a max_hold
    held->next_renew = kNever;
  }
  return held;
}

bool Engine::wait_free(std::string_view name, std::optional<Millis> wait, Error& ec) {
  ec.clear();
  if (forked()) {
    ec = make_error_code(errc::forked);
    return false;
  }
  std::string why;
  if ((ec = check_name(name, why))) return false;
  if (wait && wait->count() < 0) wait = Millis(0);
  if (wait && *wait >= LockOptions::max_wait) wait.reset();
  const Clock::time_point deadline = wait ? clock_->now() + *wait : kNever;
  const Millis ttl = opts_.lock_defaults.ttl;
  try {
    std::optional<NameWatch> watch;
    bool live = false;
    for (;;) {
      std::uint64_t seen = 0;
      if (watch) seen = watch->generation();
      const LockInfo info = backend_->status(name, ec);
      if (ec) return false;
      if (!info.held) return true;
      const Clock::time_point now = clock_->now();
      if (now >= deadline) return false;
      if (!watch) {
        // Subscribe, then look again: a release in between is then seen or notified.
        watch.emplace(shared_from_this(), std::string(name));
        live = watch->arm(deadline);
        continue;
      }
      if (!live && (live = watch->arm(deadline))) continue;  // now live: look again first
      Millis delay = recheck_delay(info.ttl_remaining, ttl);
      if (!live) delay = std::min(delay, kDegradedRecheck);
      watch->wait(seen, std::min(deadline, now + delay));
    }
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return false;
}

std::shared_ptr<HeldLock> Engine::held_by_this_thread(std::string_view name) const {
  const std::string key = held_key(name, owner_for_this_thread(client_id_));
  LockGuard lk(mu_);
  auto it = held_.find(key);
  return it == held_.end() ? nullptr : it->second;
}

void Engine::release(const std::shared_ptr<HeldLock>& held, Error& ec) noexcept {
  ec.clear();
  if (!held) {
    ec = make_error_code(errc::not_owner);
    return;
  }
  if (forked()) {
    ec = make_error_code(errc::forked);  // the parent's lease: not ours to release
    return;
  }
  {
    LockGuard lk(mu_);
    if (held->released) {
      ec = make_error_code(errc::not_owner);
      return;
    }
    if (--held->hold_count > 0) return;
    held->released = true;
    auto it = held_.find(held_key(held->name, thread_owner_of(held->owner)));
    if (it != held_.end() && it->second == held) {
      if (held->displaced && !held->displaced->released) {
        it->second = held->displaced;  // the outer, lost hold this one replaced
      } else {
        held_.erase(it);
      }
    }
    held->displaced.reset();
  }
  // One clock read serves the hold time and the expiry check.
  const Clock::time_point now = held->metrics || caps_.needs_renewal ? clock_->now() : Clock::time_point{};
  end_hold(*held, now);
  if (held->lost.load(std::memory_order_acquire)) {
    // Another thread may be between marking the lease lost and firing its stop token
    // (declare_lost): the caller learns of the loss here, so the token fires no later.
    held->stop.request_stop();
    // Its internal signals too, before the hand-back below frees the name: the thread
    // that declared the loss may still be inside the stop token's callbacks.
    fire_signals(*held);
    // What the backend still holds for it is freed before this call returns (or was
    // already): the caller may take the name again at once.
    forget_now(*held);
    if (held->metrics) metrics_->release(held->metrics, ReleaseOutcome::lost);
    ec = make_error_code(errc::lost);
    return;
  }
  const bool expired = caps_.needs_renewal && now >= held->deadline();
  ReleaseStatus st = ReleaseStatus::released;
  try {
    st = backend_->release(held->name, held->owner, held->token, ec);
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  if (ec) {
    n_release_failures_.fetch_add(1, std::memory_order_relaxed);
    if (held->metrics) metrics_->release(held->metrics, ReleaseOutcome::error);
    log_.log(LogLevel::warning, "release of lock \"{}\" failed ({}); it will expire by its TTL", held->name,
             ec.message());
    return;
  }
  if (st == ReleaseStatus::not_owner) {
    // Lost while the holder still believed it held it: signal it like any other
    // loss (stop token, callbacks), so no loss is only ever seen as an error code.
    if (!expired) n_brain_splits_.fetch_add(1, std::memory_order_relaxed);
    declare_lost(held, LossReason::gone_at_release, "the server no longer had it at release");
    if (held->metrics) metrics_->release(held->metrics, ReleaseOutcome::lost);
    ec = make_error_code(errc::lost);
    return;
  }
  n_released_.fetch_add(1, std::memory_order_relaxed);
  if (held->metrics) metrics_->release(held->metrics, ReleaseOutcome::ok);
  on_change(held->name);  // wake this client's own waiters without a server hop
}

void Engine::on_change(std::string_view name) noexcept {
  LockGuard lk(mu_);
  auto it = waits_.find(name);
  if (it == waits_.end()) return;
  ++it->second->generation;
  it->second->cv.notify_all();
  for (std::condition_variable* l : it->second->listeners) l->notify_all();
}

void Engine::on_session_lost() noexcept {
  std::vector<std::shared_ptr<HeldLock>> all;
  {
    LockGuard lk(mu_);
    session_epoch_.fetch_add(1, std::memory_order_acq_rel);
    for (auto& [k, h] : held_) all.push_back(h);
  }
  for (auto& h : all) declare_lost(h, LossReason::session_lost, "session lost");
}

void Engine::on_lease_lost(std::string_view name, std::string_view owner) noexcept {
  std::shared_ptr<HeldLock> held;
  {
    LockGuard lk(mu_);
    auto it = held_.find(held_key(name, thread_owner_of(owner)));
    if (it == held_.end() || it->second->owner != owner) {
      // Not recorded yet: an acquisition of this owner may be under way.
      if (auto f = inflight_.find(owner); f != inflight_.end()) {
        try {
          f->second.names.emplace_back(name);
        } catch (...) {
          f->second.all = true;  // cannot tell which: take it for the one won
        }
      }
      return;
    }
    held = it->second;
  }
  declare_lost(held, LossReason::lease_ended, "the server ended its lease");
}

void Engine::on_validity_changed(Millis validity) noexcept {
  if (validity.count() <= 0) return;
  LockGuard lk(mu_);
  validity_cap_ = validity;
  for (auto& [owner, f] : inflight_) {
    f.min_cap = f.min_cap.count() == 0 ? validity : std::min(f.min_cap, validity);
  }
  for (auto& [k, h] : held_) {
    if (!h->released && !h->lost.load()) cap_validity(*h, validity);
  }
}

void Engine::cap_validity(HeldLock& h, Millis cap) {
  if (cap.count() <= 0 || h.validity <= cap || !caps_.needs_renewal) return;
  // Counted again from the last confirmation's send time with the new validity.
  h.validity = cap;
  h.opts.renew_interval = std::max(Millis(1), std::min(h.opts.renew_interval, cap / 3));
  const Clock::time_point d = std::min(h.confirmed_sent + cap - h.opts.safety_margin, h.hold_limit());
  if (d < h.deadline()) h.set_deadline(d);
  // Confirm it again now, against the new validity, rather than on the old schedule
  // (also when renewals had stopped because the deadline had reached the hold limit).
  h.next_renew = h.deadline() >= h.hold_limit() ? kNever : std::min(h.next_renew, clock_->now());
  renewer_.renew_earlier(Clock::time_point::min());
  renewer_.deadline_earlier(h.deadline());
}

void Engine::declare_lost(const std::shared_ptr<HeldLock>& held, LossReason reason,
                          const char* why) noexcept {
  // The stop request below runs the user's std::stop_callbacks on this thread, and one
  // may drop the last Client handle. While this counter is up the engine's deleter
  // hands destruction to a thread of its own (this may be a backend thread the
  // destructor joins), and `self` keeps the engine alive until this call is done.
  const UserCodeScope signalling;
  const std::shared_ptr<Engine> self = weak_from_this().lock();
  std::string text;
  if (reason == LossReason::local_deadline || reason == LossReason::max_hold) {
    try {
      text = expiry_text(*held, reason);
    } catch (...) {
    }
    why = text.empty() ? why : text.c_str();
  }
  {
    // The reason is recorded before `lost` turns true: whoever sees the loss sees why.
    LockGuard lk(held->callbacks_mu);
    if (held->loss_reason) return;
    held->loss_reason = reason;
    try {
      held->loss_detail = why;
    } catch (...) {
    }
    if (held->lost.exchange(true, std::memory_order_acq_rel)) return;
  }
  held->stop.request_stop();  // first: whoever sees `lost` from now on finds the token fired soon
  n_lost_.fetch_add(1, std::memory_order_relaxed);
  // The internal signals (a read-write lease's combined token) are part of the stop
  // signal: given before the hand-back below lets anyone else take the name.
  fire_signals(*held);
  // Then what the server still holds for it is handed back (Backend::forget), on the
  // hand-back thread: after the stop signal, so the holder is told before anyone else
  // can take the name; a lease the server no longer had at release has nothing to free.
  if (reason != LossReason::gone_at_release && !forked()) hand_back_.queue(held);
  if (held->metrics) {
    metrics_->loss(held->metrics, reason);
    end_hold(*held, clock_->now());
  }
  // The internal signals first, then the log line on the event thread: the logger
  // sink is user code, and one that blocks must not hold this lease's read-write
  // token or the next lease of a batch (a session loss, a watchdog round).
  fire_loss(held);
  try {
    events_.post([this, name = held->name, line = std::string(why)] {
      log_.log(LogLevel::warning, "lock \"{}\" lost: {}", name, line);
    });
  } catch (...) {  // no memory for the message: the loss itself is signalled
  }
}

void Engine::forget_now(HeldLock& held) noexcept {
  {
    LockGuard lk(held.callbacks_mu);
    if (held.loss_reason == LossReason::gone_at_release) return;
  }
  bool called = false;
  try {
    std::call_once(held.forget_once, [&] {
      called = true;
      backend_->forget(held.name, held.owner, held.token);
    });
  } catch (...) {  // call_once's own failure (std::system_error): the server's expiry is the bound
  }
  if (called) on_change(held.name);  // this client's waiters need no server hop to learn of it
}

bool Engine::on_own_thread() const noexcept {
  return renewer_.on_thread() || hand_back_.on_thread() || on_event_thread();
}

bool Engine::on_event_thread() const noexcept {
  return events_.on_thread();
}

// The loss signal (stop token, internal signals) happens here, on the detecting
// thread; the user's callbacks are only queued, so a slow or blocking callback can
// never delay the signal of this or any other lease.
void Engine::fire_signals(HeldLock& held) noexcept {
  std::vector<std::function<void()>> signals;
  {
    LockGuard lk(held.callbacks_mu);
    if (held.signals_fired) return;
    held.signals_fired = true;
    signals.swap(held.signals);
  }
  for (auto& s : signals) s();  // noexcept by contract (add_loss_signal)
}

void Engine::fire_loss(const std::shared_ptr<HeldLock>& held) noexcept {
  held->stop.request_stop();
  fire_signals(*held);
  bool queued = true;
  {
    // Queued under callbacks_mu: a callback added after this (queued directly by
    // add_loss_callback) runs after these; queued once (callbacks_fired).
    LockGuard lk(held->callbacks_mu);
    if (held->callbacks_fired) return;
    held->callbacks_fired = true;
    if (!held->callbacks.empty()) {
      queued = false;
      try {
        auto cbs = std::make_shared<std::vector<std::function<void()>>>(std::move(held->callbacks));
        held->callbacks.clear();
        queued = events_.post([this, held, cbs] {
          for (auto& cb : *cbs) {
            try {
              cb();
            } catch (...) {
              log_.log(LogLevel::error, "loss callback of lock \"{}\" threw; the exception was dropped",
                       held->name);
            }
          }
        });
      } catch (...) {
      }
    }
  }
  // Logged outside callbacks_mu: the logger sink is user code.
  if (!queued) log_.log(LogLevel::error, "loss callbacks of lock \"{}\" dropped: out of memory", held->name);
}

void Engine::add_loss_callback(const std::shared_ptr<HeldLock>& held, std::function<void()> fn) {
  // A forked child has no event thread, and the parent's threads may have held the
  // queue's lock at the fork: refused, as every other call of the child's copy is.
  if (forked()) {
    throw_error(make_error_code(errc::forked),
                "Lease::on_lost in a forked child: the lease belongs to the parent process");
  }
  LockGuard lk(held->callbacks_mu);
  if (!held->callbacks_fired) {
    held->callbacks.push_back(std::move(fn));
    return;
  }
  if (!events_.post([this, held, fn = std::move(fn)] {
        try {
          fn();
        } catch (...) {
          log_.log(LogLevel::error, "loss callback of lock \"{}\" threw; the exception was dropped",
                   held->name);
        }
      })) {
    throw_error(make_error_code(errc::exhausted), "cannot queue the loss callback: out of memory");
  }
}

void Engine::add_loss_signal(const std::shared_ptr<HeldLock>& held, std::function<void()> fn) {
  {
    LockGuard lk(held->callbacks_mu);
    if (!held->signals_fired) {
      held->signals.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void Engine::drain_events() {
  if (on_event_thread()) return;
  events_.drain();
  // And the hand-backs of the losses declared so far.
  hand_back_.drain();
}

Clock::time_point Engine::declare_expired() {
  const Clock::time_point now = clock_->now();
  Clock::time_point next = Clock::time_point::max();
  std::vector<std::shared_ptr<HeldLock>> expired;
  {
    LockGuard lk(mu_);
    for (auto& [k, h] : held_) {
      if (h->lost.load()) continue;
      if (now >= h->deadline()) {
        expired.push_back(h);
      } else {
        next = std::min(next, h->deadline());
      }
    }
  }
  for (auto& h : expired) {
    declare_lost(h, h->expiry_reason(), "local deadline passed without a successful renewal");
  }
  return next;
}

std::size_t Engine::tick() {
  if (forked()) return 0;
  // The local deadline is checked before anything else: a holder resumed after a
  // pause must see its loss before it renews or acts.
  declare_expired();
  const Clock::time_point now = clock_->now();
  std::vector<std::shared_ptr<HeldLock>> due;
  {
    LockGuard lk(mu_);
    for (auto& [k, h] : held_) {
      if (h->lost.load() || now >= h->deadline()) continue;
      // Batch: renew everything due within a quarter interval, so leases taken
      // at different moments converge onto the same round trips.
      if (!h->renew_in_flight && h->next_renew <= now + h->opts.renew_interval / 4) {
        h->renew_in_flight = true;
        due.push_back(h);
      }
    }
  }
  if (due.empty()) return 0;
  return renew_items(std::move(due));
}

std::size_t Engine::renew_all() {
  if (forked()) return 0;
  // As in tick(): a lease past its local deadline is lost, never renewed back to life.
  declare_expired();
  std::vector<std::shared_ptr<HeldLock>> due;
  {
    LockGuard lk(mu_);
    for (auto& [k, h] : held_) {
      if (h->lost.load() || h->renew_in_flight || !caps_.needs_renewal) continue;
      if (h->deadline() >= h->hold_limit()) continue;  // never extended past max_hold
      h->renew_in_flight = true;
      due.push_back(h);
    }
  }
  if (due.empty()) return 0;
  return renew_items(std::move(due));
}

std::size_t Engine::renew_items(std::vector<std::shared_ptr<HeldLock>> due) {
  std::vector<RenewItem> items;
  items.reserve(due.size());
  for (auto& h : due) items.push_back(RenewItem{h->name, h->owner, h->token, h->opts.ttl});
  std::vector<RenewStatus> out(items.size(), RenewStatus::failed);
  Error ec;
  const Clock::time_point sent = clock_->now();
  try {
    backend_->renew(items, out, ec);
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  if (ec) std::fill(out.begin(), out.end(), RenewStatus::failed);
  n_renew_round_trips_.fetch_add(1, std::memory_order_relaxed);
  const Clock::time_point replied = clock_->now();
  if (metrics_) {
    metrics_->renewal_round_trip(replied - sent);
    for (std::size_t i = 0; i < due.size(); ++i) {
      if (due[i]->metrics) metrics_->renewal(due[i]->metrics, out[i]);
    }
  }

  std::size_t renewed = 0;
  std::vector<std::shared_ptr<HeldLock>> refused, late;
  {
    LockGuard lk(mu_);
    for (std::size_t i = 0; i < due.size(); ++i) {
      auto& h = due[i];
      h->renew_in_flight = false;
      if (h->released || h->lost.load()) continue;
      switch (out[i]) {
        case RenewStatus::renewed: {
          // The reply came after the local deadline: owns() has already answered
          // false, and the holder may have acted on it. A loss once seen stays a
          // loss, and is signalled (the server record expires by its TTL).
          if (replied >= h->deadline()) {
            late.push_back(h);
            break;
          }
          // Never past the hold limit: once the deadline reaches it, no more renewals.
          const Clock::time_point d = std::min(sent + h->validity - h->opts.safety_margin, h->hold_limit());
          if (d > h->deadline()) h->set_deadline(d);
          h->confirmed_sent = std::max(h->confirmed_sent, sent);
          h->next_renew = h->deadline() >= h->hold_limit() ? kNever : sent + h->opts.renew_interval;
          ++renewed;
          break;
        }
        case RenewStatus::not_owner: refused.push_back(h); break;
        case RenewStatus::failed:
          // Retry soon, but never in a tight loop.
          h->next_renew = clock_->now() + std::max(Millis(10), h->opts.renew_interval / 4);
          break;
      }
    }
  }
  n_renewed_.fetch_add(renewed, std::memory_order_relaxed);
  if (ec) log_.log(LogLevel::warning, "renewal of {} lease(s) failed: {}", due.size(), ec.message());
  for (auto& h : refused) {
    if (clock_->now() < h->deadline()) n_brain_splits_.fetch_add(1, std::memory_order_relaxed);
    declare_lost(h, LossReason::renewal_refused, "the server says another owner (or nobody) holds it");
  }
  for (auto& h : late) {
    if (h->expiry_reason() == LossReason::max_hold) {
      declare_lost(h, LossReason::max_hold, "max_hold reached");
    } else {
      declare_lost(h, LossReason::renewal_late, "local deadline passed before the renewal's reply arrived");
    }
  }
  return renewed;
}

void Engine::ensure_watchdog() {
  if (caps_.needs_renewal || !opts_.background_renewal) return;  // started at create(), or never
  renewer_.start();
}

Clock::time_point Engine::renew_round() {
  tick();
  LockGuard lk(mu_);
  Clock::time_point wake = clock_->now() + std::chrono::seconds(1);
  for (auto& [k, h] : held_) {
    if (h->lost.load() || h->renew_in_flight) continue;
    wake = std::min(wake, h->next_renew - h->opts.renew_interval / 4);
  }
  return wake;
}

Clock::time_point Engine::watchdog_round() {
  const Clock::time_point next = declare_expired();
  sweep_idle_watches(false);
  return next;
}

LockInfo Engine::status(std::string_view name, Error& ec) {
  if (forked()) {
    ec = make_error_code(errc::forked);
    return {};
  }
  std::string why;
  if ((ec = check_name(name, why))) return {};
  LockInfo info = backend_->status(name, ec);
  if (info.holder) {
    auto [id, desc] = split_owner(*info.holder);
    if (desc) {
      info.holder_info = std::string(*desc);
      info.holder = std::string(id);
    }
  }
  return info;
}

std::vector<ListedLock> Engine::list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                          Error& ec) {
  truncated = false;
  if (forked()) {
    ec = make_error_code(errc::forked);
    return {};
  }
  std::vector<ListedLock> out = backend_->list_held(prefix, limit, truncated, ec);
  if (ec) return {};
  for (auto& l : out) {
    if (!l.info.holder) continue;
    auto [id, desc] = split_owner(*l.info.holder);
    if (desc) {
      l.info.holder_info = std::string(*desc);
      l.info.holder = std::string(id);
    }
  }
  return out;
}

ClientStats Engine::stats() const noexcept {
  ClientStats s;
  s.acquired = n_acquired_.load(std::memory_order_relaxed);
  s.released = n_released_.load(std::memory_order_relaxed);
  s.release_failures = n_release_failures_.load(std::memory_order_relaxed);
  s.renew_round_trips = n_renew_round_trips_.load(std::memory_order_relaxed);
  s.renewed_leases = n_renewed_.load(std::memory_order_relaxed);
  s.lost = n_lost_.load(std::memory_order_relaxed);
  s.brain_splits = n_brain_splits_.load(std::memory_order_relaxed);
  return s;
}

void Engine::end_hold(HeldLock& held, Clock::time_point now) noexcept {
  if (held.metrics && !held.hold_observed.exchange(true, std::memory_order_acq_rel)) {
    metrics_->hold_ended(held.metrics, now - held.granted_at);
  }
}

void Engine::count_acquire_failure(std::string_view name, const std::error_code& ec) noexcept {
  if (!metrics_) return;
  const AcquireOutcome outcome = ec == errc::busy      ? AcquireOutcome::busy
                                 : ec == errc::timeout ? AcquireOutcome::timeout
                                                       : AcquireOutcome::error;
  metrics_->acquire_failed(metrics_->series_for(name), outcome);
}

std::string Engine::metrics_text() const {
  return metrics_ ? metrics_->text(held_count(), backend_->notification_channel_drops()) : std::string();
}

std::size_t Engine::idle_watches() const {
  LockGuard lk(mu_);
  return static_cast<std::size_t>(idle_watches_);
}

std::size_t Engine::held_count() const {
  LockGuard lk(mu_);
  return held_.size();
}

}  // namespace distlock::detail
