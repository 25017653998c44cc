#include "engine/wait_registry.hpp"

#include <algorithm>
#include <random>
#include <system_error>

namespace distlock::detail {

Millis recheck_delay(std::optional<Millis> holder_ttl, Millis ttl) {
  Millis cap = holder_ttl.value_or(ttl);
  cap = std::clamp(cap, Millis(5), Millis(std::chrono::seconds(5)));
  thread_local std::minstd_rand rng{std::random_device{}()};
  std::uniform_int_distribution<std::int64_t> jitter(0, std::max<std::int64_t>(1, cap.count() / 10));
  return cap + Millis(jitter(rng));
}

std::shared_ptr<WaitRegistry::Slot> WaitRegistry::join(const std::string& name) {
  PartLock lk(mu_, slot_state);
  auto& slot = slots_[name];
  if (!slot) slot = std::make_shared<Slot>();
  if (slot->waiters++ == 0 && slot->watched) --idle_watches_;
  return slot;
}

bool WaitRegistry::ensure_watched(std::string_view name, const std::shared_ptr<Slot>& slot,
                                  Clock::time_point until, const std::stop_token& cancel) {
  {
    PartLock lk(mu_, slot_state);
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
    backend_.watch(name, ec);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  {
    PartLock lk(mu_, slot_state);
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

void WaitRegistry::leave(const std::string& name) {
  bool unwatch_now = false;
  {
    PartLock lk(mu_, slot_state);
    auto it = slots_.find(name);
    if (it == slots_.end() || --it->second->waiters > 0) return;
    Slot& slot = *it->second;
    if (slot.watch_pending) return;  // the subscribing waiter is still inside ensure_watched
    if (!slot.watched) {
      slots_.erase(it);
      return;
    }
    // Keep the subscription for a while: under contention the same name is
    // waited for again at once, and re-subscribing costs round trips on the
    // hand-off path. Idle subscriptions are bounded in number and age.
    if (idle_watches_ >= kMaxIdleWatches) {
      slots_.erase(it);
      unwatch_now = true;
    } else {
      slot.idle_since = clock_->now();
      ++idle_watches_;
    }
  }
  if (unwatch_now) backend_.unwatch(name);
}

std::uint64_t WaitRegistry::generation(const Slot& slot) const {
  PartLock lk(mu_, slot_state);
  return slot.generation;
}

bool WaitRegistry::wait(Slot& slot, std::uint64_t seen, Clock::time_point until) {
  PartLock lk(mu_, slot_state);
  while (slot.generation == seen && clock_->now() < until) clock_->wait_until(slot.cv, lk.native(), until);
  return slot.generation != seen;
}

void WaitRegistry::notify(std::string_view name) noexcept {
  PartLock lk(mu_, slot_state);
  auto it = slots_.find(name);
  if (it == slots_.end()) return;
  ++it->second->generation;
  it->second->cv.notify_all();
  for (std::condition_variable* l : it->second->listeners) l->notify_all();
}

void WaitRegistry::sweep(bool all) noexcept {
  std::vector<std::string> gone;
  {
    PartLock lk(mu_, slot_state);
    const Clock::time_point cutoff = clock_->now() - kIdleWatchKeep;
    for (auto it = slots_.begin(); it != slots_.end();) {
      const Slot& slot = *it->second;
      if (slot.waiters == 0 && slot.watched && (all || slot.idle_since <= cutoff)) {
        gone.push_back(it->first);
        --idle_watches_;
        it = slots_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& name : gone) backend_.unwatch(name);
}

std::size_t WaitRegistry::idle() const {
  LockGuard lk(mu_);
  return static_cast<std::size_t>(idle_watches_);
}

void WaitRegistry::join_listening(Entry& e, std::condition_variable* wake) {
  if (e.slot) return;
  e.slot = join(e.name);
  PartLock lk(mu_, slot_state);
  e.slot->listeners.push_back(wake);
  e.generation = e.slot->generation;
}

void WaitRegistry::leave_listening(Entry& e, std::condition_variable* wake) {
  if (!e.slot) return;
  {
    PartLock lk(mu_, slot_state);
    auto& l = e.slot->listeners;
    l.erase(std::remove(l.begin(), l.end(), wake), l.end());
  }
  leave(e.name);
}

void WaitRegistry::snapshot(std::span<Entry* const> entries) {
  PartLock lk(mu_, slot_state);
  for (Entry* e : entries) {
    if (e->try_now && e->slot) e->generation = e->slot->generation;
  }
}

void WaitRegistry::wake_slots(std::span<Entry* const> entries) noexcept {
  LockGuard lk(mu_);
  for (Entry* e : entries) {
    if (auto it = slots_.find(e->name); it != slots_.end()) it->second->cv.notify_all();
  }
}

bool WaitRegistry::wait_any(std::span<Entry* const> waited, std::condition_variable& wake,
                            const std::stop_token& cancel, Clock::time_point until) {
  PartLock lk(mu_, slot_state);
  auto any_changed = [&]() DISTLOCK_REQUIRES(slot_state) {
    for (const Entry* e : waited) {
      if (e->slot->generation != e->generation) return true;
    }
    return false;
  };
  bool changed = false;
  while (!(changed = any_changed()) && !cancel.stop_requested() && clock_->now() < until)
    clock_->wait_until(wake, lk.native(), until);
  for (Entry* e : waited) {
    // Try again what changed; a subscription dropped by sweep or failure shows
    // as !watched and is tried (and subscribed) again.
    if (e->slot->generation != e->generation || !e->slot->watched) e->try_now = true;
    if (!e->slot->watched) e->watched = false;
  }
  return changed;
}

}  // namespace distlock::detail
