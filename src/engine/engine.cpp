#include "engine/engine.hpp"

#include <atomic>
#include <utility>

#include "engine/owner_id.hpp"

namespace distlock::detail {

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
      waits_(*backend_, clock_, log_),
      renewer_(
          clock_, [this] { return renew_round(); }, [this] { return watchdog_round(); }),
      leases_(clock_, caps_.needs_renewal, renewer_),
      hand_back_([this](HeldLock& held) { forget_now(held); }) {
  if (opts_.metrics || opts_.tracer) {
    const std::string url = backend_->url();
    const std::string scheme = url.substr(0, url.find("://"));
    if (opts_.metrics) metrics_ = std::make_unique<Metrics>(scheme);
    if (opts_.tracer) tracing_ = std::make_unique<TraceSpans>(opts_.tracer, scheme, opts_.traceparent, log_);
  }
}

Engine::~Engine() {
  renewer_.stop_and_join();
  // Leases still held when the last Client handle goes away are released (best
  // effort), so a process that forgets a guard does not block others for a TTL.
  const std::vector<std::shared_ptr<HeldLock>> left = leases_.take_all();
  for (auto& h : left) {
    if (h->lost.load()) continue;
    Error ec;
    backend_->release(h->name, h->owner, h->token, ec);
    if (h->trace) trace_hold_end(*h, ec ? SpanOutcome::error : SpanOutcome::released, clock_->now(), ec);
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

Error Engine::check_name(std::string_view name) {
  if (name.empty()) return {make_error_code(errc::invalid_argument), "lock name is empty"};
  if (name.size() > 4096) {
    return {make_error_code(errc::invalid_argument),
            "lock name is " + std::to_string(name.size()) + " bytes long; the limit is 4096"};
  }
  if (name.find('\0') != std::string_view::npos) {
    return {make_error_code(errc::invalid_argument), "lock name contains a NUL byte"};
  }
  return {};
}

Engine::NameWatch::NameWatch(std::shared_ptr<Engine> engine, std::string name)
    : engine_(std::move(engine)), name_(std::move(name)) {
  slot_ = engine_->waits_.join(name_);
}

Engine::NameWatch::~NameWatch() {
  engine_->waits_.leave(name_);
}

bool Engine::NameWatch::arm(Clock::time_point until) {
  return engine_->waits_.ensure_watched(name_, slot_, until);
}

std::uint64_t Engine::NameWatch::generation() const {
  return engine_->waits_.generation(*slot_);
}

bool Engine::NameWatch::wait(std::uint64_t seen, Clock::time_point until) {
  return engine_->waits_.wait(*slot_, seen, until);
}

void Engine::sweep_idle_watches(bool all) noexcept {
  waits_.sweep(all);
}

bool Engine::forked() const noexcept {
  return fork_generation() != fork_gen_;
}

bool Engine::on_own_thread() const noexcept {
  return renewer_.on_thread() || hand_back_.on_thread() || on_event_thread();
}

bool Engine::on_event_thread() const noexcept {
  return events_.on_thread();
}

void Engine::drain_events() {
  if (on_event_thread()) return;
  events_.drain();
  // And the hand-backs of the losses declared so far.
  hand_back_.drain();
}

LockInfo Engine::status(std::string_view name, Error& ec) {
  if (forked()) {
    ec = make_error_code(errc::forked);
    return {};
  }
  // The code only: the API names the problem itself.
  if (const Error bad = check_name(name)) {
    ec = std::error_code(bad);
    return {};
  }
  LockInfo info = backend_->status(name, ec);
  if (info.holder) {
    auto [id, desc] = split_owner(*info.holder);
    if (desc) {
      info.holder_info = std::string(*desc);
      info.holder = std::string(id);
    }
  }
  split_waiters(info);
  return info;
}

void split_waiters(LockInfo& info) {
  if (!info.waiters_listed) {
    info.waiter_list.clear();
    return;
  }
  std::size_t position = 0;
  for (WaiterInfo& w : info.waiter_list) {
    w.position = ++position;
    auto [id, desc] = split_owner(w.owner);
    if (!desc) continue;
    w.holder_info = std::string(*desc);
    w.owner = std::string(id);
  }
  info.waiters = info.waiter_list.size();
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
  for (auto& l : out) split_waiters(l.info);
  return out;
}

ClientStats Engine::stats() const noexcept {
  ClientStats s;
  s.acquired = n_acquired_.load(std::memory_order_relaxed);
  s.released = n_released_.load(std::memory_order_relaxed);
  s.release_failures = n_release_failures_.load(std::memory_order_relaxed);
  s.renew_round_trips = n_renew_round_trips_.load(std::memory_order_relaxed);
  s.round_trips = backend_->round_trips();
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
  return waits_.idle();
}

std::size_t Engine::held_count() const {
  return leases_.size();
}

}  // namespace distlock::detail
