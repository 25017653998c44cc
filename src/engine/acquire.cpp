// Engine: acquire (validate → lease table → wait loop → lease table), wait_free, release.
#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <string>

#include "engine/engine.hpp"

namespace distlock::detail {

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

bool Engine::validate(std::span<const std::string_view> names, std::string_view gate, LockOptions& opts,
                      std::optional<Millis>& wait, Error& ec) {
  // The code only: throw_acquire_error (src/api/client.cpp) names the problem itself.
  for (const std::string_view n : names) {
    if (const Error bad = check_name(n)) {
      ec = std::error_code(bad);
      log_.log(LogLevel::debug, "acquire rejected: {}", bad.detail());
      return false;
    }
  }
  if (const Error bad = gate.empty() ? Error() : check_name(gate)) {
    ec = std::error_code(bad);
    log_.log(LogLevel::debug, "acquire rejected: {}", bad.detail());
    return false;
  }
  if ((ec = opts.validate_and_fill())) return false;
  if (opts.lock_delay.count() > 0 && !caps_.lock_delay) {
    // A delay only the client would keep is no delay: a dead client keeps nothing.
    ec = make_error_code(errc::not_supported);
    ec.set_detail("lock_delay is not supported by this backend (" + backend_->url() +
                  "): its server cannot hold a lost lease's name back (docs/design.md \"Lock-delay\")");
    return false;
  }
  if (wait && wait->count() < 0) wait = Millis(0);
  // A wait too long to add to a clock reading is a wait without limit.
  if (wait && *wait >= LockOptions::max_wait) wait.reset();
  return true;
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
  std::optional<WaitTrace> trace;
  if (tracing_) trace = tracing_->begin_wait(in_opts, called);
  LockOptions opts = in_opts;
  if (!validate(names, gate, opts, wait, ec)) {
    count_acquire_failure(name, ec);
    if (trace)
      tracing_->deliver(tracing_->wait_span(*trace, name, {}, SpanOutcome::error, ec, clock_->now()));
    return nullptr;
  }
  // The owner, built in one string: the thread owner "<client id>:<thread seq>" (see
  // owner_for_this_thread), then, for a new acquisition, ".<acquisition seq>" and
  // "|<holder info>".
  std::string owner;
  constexpr std::size_t kMaxDigits = std::numeric_limits<std::uint64_t>::digits10 + 1;
  owner.reserve(client_id_.size() + 3 + 2 * kMaxDigits + opts.holder_info.size());
  owner.append(client_id_);
  owner.push_back(':');
  append_decimal(owner, this_thread_seq());
  const std::size_t thread_owner_len = owner.size();
  auto thread_owner = [&owner, thread_owner_len] {
    return std::string_view(owner).substr(0, thread_owner_len);
  };
  std::shared_ptr<HeldLock> expired;
  if (names.size() == 1) {  // Reentry by the same thread: no round trip.
    if (opts.max_hold && reentry == Reentry::by_thread) ensure_watchdog();
    if (auto h = leases_.reenter(LeaseTable::key(name, thread_owner()), reentry == Reentry::by_thread,
                                 opts.max_hold, expired))
      return h;
  }
  if (expired)
    declare_lost(expired, expired->expiry_reason(), "local deadline passed without a successful renewal");

  // Every acquisition is a new owner on the server: see HeldLock::owner.
  owner.push_back('.');
  append_decimal(owner, next_acquisition_.fetch_add(1, std::memory_order_relaxed));
  if (!opts.holder_info.empty()) {  // validated: printable, no '|', cut to max_holder_info
    owner.push_back('|');
    owner.append(opts.holder_info);
  }
  if (opts.max_hold) ensure_watchdog();

  leases_.begin(owner);
  std::shared_ptr<HeldLock> held;
  std::uint64_t epoch_at_send = 0;
  std::size_t got = 0;
  try {
    held = wait_loop(names, gate, opts, wait, owner, called, epoch_at_send, got, ec);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  if (ec || !held) {
    if (!ec) ec = make_error_code(errc::protocol_error);
    count_acquire_failure(name, ec);
    // Busy because this very thread holds the name (a Mutex, or another Lease): say so,
    // since the holder named by the server would be this process.
    const bool ask = (ec == errc::busy || ec == errc::timeout) && names.size() == 1 && ec.detail().empty();
    const LeaseTable::Key key = LeaseTable::key(name, thread_owner());
    if (leases_.abandon(owner, ask ? &key : nullptr)) {
      ec.set_detail(
          "held by this thread through a Mutex or another Lease; a Lease is not re-entrant, only "
          "Mutex re-enters (lock the Mutex again, or release the other Lease first)");
    }
    if (trace) {
      const SpanOutcome outcome = ec == errc::busy        ? SpanOutcome::busy
                                  : ec == errc::timeout   ? SpanOutcome::timed_out
                                  : ec == errc::cancelled ? SpanOutcome::cancelled
                                                          : SpanOutcome::error;
      tracing_->deliver(tracing_->wait_span(*trace, name, owner, outcome, ec, clock_->now()));
    }
    return nullptr;
  }
  if (index) *index = got;
  held->reentrant = reentry == Reentry::by_thread;
  try {
    record_grant(held, owner, called, epoch_at_send, trace ? &*trace : nullptr);
  } catch (...) {
    leases_.abandon(owner, nullptr);  // the table keeps no view of `owner` past this call
    throw;
  }
  return held;
}

void Engine::record_grant(const std::shared_ptr<HeldLock>& held, const std::string& owner,
                          Clock::time_point called, std::uint64_t epoch_at_send, const WaitTrace* trace) {
  n_acquired_.fetch_add(1, std::memory_order_relaxed);
  if (metrics_ || trace) held->granted_at = clock_->now();  // the wait ends, the hold begins
  if (metrics_) {  // before the lease is published: a loss from now on finds its series
    held->metrics = metrics_->series_for(held->name);
    metrics_->acquired(held->metrics, held->granted_at - called);
  }
  // The same: a loss from now on finds the hold's trace. The wait span is built now but
  // given to the tracer only once the lease is recorded (below): a tracer that blocks in it
  // must not keep the lease from the renewer.
  std::optional<Span> wait;
  if (trace) {
    wait = tracing_->wait_span(*trace, held->name, owner, SpanOutcome::acquired, {}, held->granted_at);
    if (held->has_token) wait->token = held->token;
    held->trace = tracing_->begin_hold(*trace, held->granted_at);
  }
  const LeaseTable::Recorded rec = leases_.record(held, owner, epoch_at_send);
  if (rec.replaced) {
    declare_lost(rec.replaced, rec.replaced->expiry_reason(),
                 "local deadline passed without a successful renewal");
  }
  if (rec.session_gone)
    declare_lost(held, LossReason::session_lost, "session lost while the lock was being granted");
  if (rec.lease_gone) {
    declare_lost(held, LossReason::lease_ended, "the server ended its lease while it was being granted");
  }
  if (wait) tracing_->deliver(*wait);
}

bool Engine::wait_free(std::string_view name, std::optional<Millis> wait, Error& ec) {
  ec.clear();
  if (forked()) {
    ec = make_error_code(errc::forked);
    return false;
  }
  if (const Error bad = check_name(name)) {
    ec = std::error_code(bad);  // the code only, as status() gives it
    return false;
  }
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
  return leases_.find(LeaseTable::key(name, owner_for_this_thread(client_id_)));
}

std::shared_ptr<HeldLock> Engine::mutex_hold_of_this_thread(std::string_view name) const {
  return leases_.find_reentrant(LeaseTable::key(name, owner_for_this_thread(client_id_)));
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
  switch (leases_.drop(held)) {
    case LeaseTable::Drop::not_held: ec = make_error_code(errc::not_owner); return;
    case LeaseTable::Drop::still_held: return;
    case LeaseTable::Drop::dropped: break;
  }
  // One clock read serves the hold time and the expiry check.
  const Clock::time_point now =
      held->metrics || held->trace || caps_.needs_renewal ? clock_->now() : Clock::time_point{};
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
    // The thread that declared the loss gives the hold and loss spans (trace_loss); this one
    // when it comes first (at a reading taken after the loss was declared), and in any case
    // sees them with the tracer before it returns (docs/tracing.md).
    if (held->trace) trace_hold_end(*held, SpanOutcome::lost, clock_->now());
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
    if (held->trace) trace_hold_end(*held, SpanOutcome::error, clock_->now(), ec);
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
    // The loss's spans were posted to the event thread: given here if it has not given them yet.
    if (held->trace) trace_hold_end(*held, SpanOutcome::lost, clock_->now());
    return;
  }
  n_released_.fetch_add(1, std::memory_order_relaxed);
  if (held->metrics) metrics_->release(held->metrics, ReleaseOutcome::ok);
  // The hold ends when the server has freed the name: after the release's round trip.
  if (held->trace) trace_hold_end(*held, SpanOutcome::released, clock_->now());
  on_change(held->name);  // wake this client's own waiters without a server hop
}

}  // namespace distlock::detail
