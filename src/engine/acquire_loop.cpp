// Engine::AcquireLoop: the wait loop of one acquisition, over one name or several
// (Engine::acquire_impl runs it between the lease table's re-entry check and its
// record of the grant). Whatever way it ends (acquired, busy, timeout, an error or an
// exception from the backend), its destructor leaves no wait slot joined and no
// queued place on the server behind.
#include <algorithm>
#include <condition_variable>
#include <optional>
#include <stop_token>

#include "engine/engine.hpp"

namespace distlock::detail {

namespace {
// One name an acquisition tries (or its gate).
struct AcquireCandidate {
  WaitRegistry::Entry w;  // name, slot (joined on the first wait), generation, watched, try_now
  bool queued = false;    // tried with keep_queued: may hold a place on the server
  std::optional<Millis> holder_ttl;
};
}  // namespace

class Engine::AcquireLoop {
 public:
  AcquireLoop(Engine& engine, std::span<const std::string_view> names, std::string_view gate,
              const LockOptions& opts, std::optional<Millis> wait, const std::string& owner,
              Clock::time_point start, Error& ec);
  ~AcquireLoop();
  AcquireLoop(const AcquireLoop&) = delete;
  AcquireLoop& operator=(const AcquireLoop&) = delete;

  /// The lease acquired, or nullptr with the error set.
  std::shared_ptr<HeldLock> run();
  /// The session epoch when the granted request was sent.
  std::uint64_t epoch_at_send() const noexcept { return epoch_at_send_; }
  /// The position in `names` of the name acquired.
  std::size_t index() const noexcept { return *acquired_; }

 private:
  using Candidate = AcquireCandidate;
  bool cancelled();
  /// One round of attempts: the gate's status, then the names due; false on an error.
  bool attempt(bool& gate_held);
  /// Subscribes what it waits for, then waits for a change or a re-check; false when
  /// cancelled.
  bool wait_for_change(bool gate_held);
  /// With LockOptions::on_queue_position: reads this waiter's place from the server
  /// and queues the callback on the event thread when the place changed.
  void report_position();
  std::shared_ptr<HeldLock> make_held();

  Engine& e_;
  const LockOptions& opts_;
  const std::string& owner_;
  Error& ec_;
  const Clock::time_point wait_deadline_;
  const bool may_wait_;
  // A gated acquisition keeps no place in the names' queues: it may have to stop
  // trying them (the gate got held), and a place kept meanwhile would block the
  // gate's holder (a writer waiting for every reader slot).
  const bool keep_queued_;
  std::vector<Candidate> cands_;
  std::optional<Candidate> gate_;
  std::vector<WaitRegistry::Entry*> entries_;  // every entry, the gate first
  std::condition_variable wake_;               // registered in every joined slot
  std::optional<std::size_t> acquired_;
  AcquireResult res_;
  Clock::time_point sent_{};
  std::uint64_t epoch_at_send_ = 0;
  std::size_t reported_position_ = 0;  // the last position reported; 0: none yet
};

Engine::AcquireLoop::AcquireLoop(Engine& engine, std::span<const std::string_view> names,
                                 std::string_view gate, const LockOptions& opts, std::optional<Millis> wait,
                                 const std::string& owner, Clock::time_point start, Error& ec)
    : e_(engine),
      opts_(opts),
      owner_(owner),
      ec_(ec),
      wait_deadline_(wait ? start + *wait : Clock::time_point::max()),
      may_wait_(!wait || wait->count() > 0),
      keep_queued_(may_wait_ && gate.empty()),
      cands_(names.size()) {
  for (std::size_t i = 0; i < names.size(); ++i) cands_[i].w.name = std::string(names[i]);
  if (!gate.empty()) {
    gate_.emplace();
    gate_->w.name = std::string(gate);
    entries_.push_back(&gate_->w);
  }
  for (auto& c : cands_) entries_.push_back(&c.w);
}

Engine::AcquireLoop::~AcquireLoop() {
  if (gate_) e_.waits_.leave_listening(gate_->w, &wake_);
  for (std::size_t i = 0; i < cands_.size(); ++i) {
    e_.waits_.leave_listening(cands_[i].w, &wake_);
    if (cands_[i].queued && acquired_ != i) e_.backend_->cancel_acquire(cands_[i].w.name, owner_);
  }
}

bool Engine::AcquireLoop::cancelled() {
  if (!opts_.cancel.stop_requested()) return false;
  ec_ = make_error_code(errc::cancelled);
  return true;
}

std::shared_ptr<HeldLock> Engine::AcquireLoop::run() {
  if (cancelled()) return nullptr;
  // A cancel wakes the wait; taking the registry's mutex first means the waiter is
  // either asleep on `wake_` (and notified) or has not yet tested the stop (and will
  // see it). A waiter waiting for another waiter's subscription (ensure_watched) waits
  // on its names' slots: those are notified too (the other waiters there only look again).
  std::stop_callback on_cancel(opts_.cancel, [this] {
    e_.waits_.wake_slots(entries_);
    wake_.notify_all();
  });
  for (;;) {
    bool gate_held = false;
    if (!attempt(gate_held)) return nullptr;
    if (acquired_) return make_held();
    if (cancelled()) return nullptr;
    if (!may_wait_ || e_.clock_->now() >= wait_deadline_) {
      ec_ = make_error_code(may_wait_ ? errc::timeout : errc::busy);
      return nullptr;
    }
    if (opts_.on_queue_position) report_position();
    if (!wait_for_change(gate_held)) return nullptr;
  }
}

bool Engine::AcquireLoop::attempt(bool& gate_held) {
  e_.waits_.snapshot(entries_);  // generations before the attempts: a change after this is not missed
  if (gate_) {
    const LockInfo info = e_.backend_->status(gate_->w.name, ec_);
    if (ec_) return false;
    gate_held = info.held;
    gate_->holder_ttl = info.ttl_remaining;
    if (gate_held) {
      for (auto& c : cands_) c.w.try_now = true;  // all of them once the gate is free
      return true;
    }
  }
  for (std::size_t i = 0; i < cands_.size(); ++i) {
    Candidate& c = cands_[i];
    if (!c.w.try_now) continue;
    AcquireRequest req{c.w.name, owner_, opts_.ttl, keep_queued_, opts_.lock_delay};
    epoch_at_send_ = e_.leases_.session_epoch();
    sent_ = e_.clock_->now();
    c.queued = c.queued || keep_queued_;
    res_ = e_.backend_->try_acquire(req, ec_);
    if (ec_) return false;
    if (res_.acquired) {
      acquired_ = i;
      return true;
    }
    c.w.try_now = false;
    c.holder_ttl = res_.holder_ttl;
  }
  return true;
}

bool Engine::AcquireLoop::wait_for_change(bool gate_held) {
  // What to wait for: the gate while it is held, else every name.
  std::vector<Candidate*> waited;
  if (gate_held) {
    waited.push_back(&*gate_);
  } else {
    for (auto& c : cands_) waited.push_back(&c);
  }
  std::vector<WaitRegistry::Entry*> waited_entries;
  for (Candidate* c : waited) waited_entries.push_back(&c->w);
  // Subscribe (or wait for the waiter that is subscribing), then look again before
  // sleeping: a change between the attempt and the subscription must not be missed.
  bool again = false, degraded = false;
  for (Candidate* c : waited) {
    e_.waits_.join_listening(c->w, &wake_);
    if (c->w.watched) continue;
    c->w.watched = e_.waits_.ensure_watched(c->w.name, c->w.slot, wait_deadline_, opts_.cancel);
    if (c->w.watched) {
      c->w.try_now = true;
      again = true;
    } else {
      degraded = true;
    }
  }
  if (cancelled()) return false;  // no attempt after a cancel
  if (again) return true;
  const Clock::time_point now = e_.clock_->now();
  Millis delay = Millis::max();
  for (Candidate* c : waited) delay = std::min(delay, recheck_delay(c->holder_ttl, opts_.ttl));
  if (degraded) delay = std::min(delay, kDegradedRecheck);
  const Clock::time_point recheck = std::min(wait_deadline_, now + delay);
  if (!e_.waits_.wait_any(waited_entries, wake_, opts_.cancel, recheck)) {
    for (Candidate* c : waited) c->w.try_now = true;  // re-check due: all of them
  }
  return true;
}

// Runs after an attempt that left this owner queued, so at most once per wake-up of
// the wait (a notification or a re-check): no polling of its own.
void Engine::AcquireLoop::report_position() {
  if (cands_.size() != 1 || gate_ || !keep_queued_) return;
  Error ec;
  LockInfo info = e_.backend_->status(cands_.front().w.name, ec);
  if (ec || !info.waiters_listed) {
    if (ec) e_.log_.log(LogLevel::debug, "queue position of \"{}\": {}", cands_.front().w.name, ec.detail());
    return;
  }
  const auto& list = info.waiter_list;
  const auto me =
      std::find_if(list.begin(), list.end(), [&](const WaiterInfo& w) { return w.owner == owner_; });
  if (me == list.end()) return;  // granted meanwhile, or the place lapsed: the next attempt tells
  const std::size_t position = static_cast<std::size_t>(me - list.begin()) + 1;
  if (position == reported_position_) return;
  reported_position_ = position;
  WaiterInfo ahead;
  if (position > 1) {
    ahead = list[position - 2];
    ahead.position = position - 1;
  } else {
    ahead.owner = info.holder.value_or(std::string());  // position 0: the holder
  }
  auto [id, desc] = split_owner(ahead.owner);
  if (desc) ahead.holder_info = std::string(*desc);
  ahead.owner = std::string(id);
  e_.events_.post([&log = e_.log_, fn = opts_.on_queue_position, position, ahead = std::move(ahead),
                   name = cands_.front().w.name] {
    try {
      fn(position, ahead);
    } catch (...) {
      log.log(LogLevel::error, "queue position callback of lock \"{}\" threw; the exception was dropped",
              name);
    }
  });
}

std::shared_ptr<HeldLock> Engine::AcquireLoop::make_held() {
  auto held = std::make_shared<HeldLock>();
  // A name whose slot was never joined is not read again (the destructor leaves only
  // joined slots, and cancels only the names not acquired): moved, not copied.
  Candidate& c = cands_[*acquired_];
  held->name = c.w.slot ? c.w.name : std::move(c.w.name);
  held->owner = owner_;
  held->fork_gen = e_.fork_gen_;
  held->token = res_.token;
  held->has_token = e_.caps_.fencing;
  held->opts = opts_;
  held->clock = e_.clock_;
  held->hold_count = 1;
  e_.leases_.schedule(*held, sent_, res_.validity.count() > 0 ? res_.validity : opts_.ttl);
  return held;
}

std::shared_ptr<HeldLock> Engine::wait_loop(std::span<const std::string_view> names, std::string_view gate,
                                            const LockOptions& opts, std::optional<Millis> wait,
                                            const std::string& owner, Clock::time_point start,
                                            std::uint64_t& epoch_at_send, std::size_t& index, Error& ec) {
  AcquireLoop loop(*this, names, gate, opts, wait, owner, start, ec);
  std::shared_ptr<HeldLock> held = loop.run();
  if (held) {
    epoch_at_send = loop.epoch_at_send();
    index = loop.index();
  }
  return held;
}

}  // namespace distlock::detail
