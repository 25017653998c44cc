// Engine: the loss signal (declare_lost, fire_loss), loss callbacks and signals, the
// hand-back of a lost lease, and the backend's ChangeListener calls.
#include <string>

#include "engine/engine.hpp"

namespace distlock::detail {

void Engine::on_change(std::string_view name) noexcept {
  waits_.notify(name);
}

void Engine::on_session_lost() noexcept {
  for (auto& h : leases_.session_lost()) declare_lost(h, LossReason::session_lost, "session lost");
}

void Engine::on_lease_lost(std::string_view name, std::string_view owner) noexcept {
  if (auto held = leases_.lease_lost(name, owner)) {
    declare_lost(held, LossReason::lease_ended, "the server ended its lease");
  }
}

void Engine::on_validity_changed(Millis validity) noexcept {
  if (validity.count() > 0) leases_.cap_validity(validity);
}

void Engine::declare_lost(const std::shared_ptr<HeldLock>& held, LossReason reason, const char* why,
                          const std::string* revoke_reason) noexcept {
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
      if (revoke_reason) held->revoke_reason = *revoke_reason;
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
  if (held->trace) {
    try {
      trace_loss(*held, reason, std::string(why), clock_->now());
    } catch (...) {  // no memory for the text: the loss itself is signalled
    }
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

}  // namespace distlock::detail
