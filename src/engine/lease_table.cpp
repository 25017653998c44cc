#include "engine/lease_table.hpp"

#include <algorithm>

namespace distlock::detail {

void LeaseTable::set(Held::iterator it, std::shared_ptr<HeldLock> h) {
  // The node keeps its place (the new key compares equal: same name, same thread owner);
  // only the strings its key views change.
  auto node = held_.extract(it);
  node.key() = key(h->name, thread_owner_of(h->owner));
  node.mapped() = std::move(h);
  held_.insert(std::move(node));
}

std::shared_ptr<HeldLock> LeaseTable::reenter(Key key, bool by_thread, std::optional<Millis> max_hold,
                                              std::shared_ptr<HeldLock>& expired) {
  PartLock lk(mu_, lease_table_state);
  auto it = held_.find(key);
  if (it == held_.end()) return nullptr;
  HeldLock& h = *it->second;
  if (!h.lost.load() && h.owns() && h.reentrant && by_thread) {
    // The re-entered hold shares the outer one's lease: its max_hold bounds that
    // lease from now on (the limit only ever comes nearer).
    if (max_hold) {
      const Clock::time_point limit = clock_->now() + *max_hold;
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
  // Past its local deadline but not yet declared (the watchdog has not run): the new
  // acquisition will replace it here, where the watchdog would never see it again, so
  // its loss is signalled by the caller.
  if (!h.released && !h.lost.load() && !h.owns()) expired = it->second;
  return nullptr;
}

void LeaseTable::begin(const std::string& owner) {
  LockGuard lk(mu_);
  inflight_.emplace(owner, InflightLosses{});
}

bool LeaseTable::abandon(const std::string& owner, const Key* key) {
  PartLock lk(mu_, lease_table_state);
  inflight_.erase(owner);
  if (!key) return false;
  auto it = held_.find(*key);
  return it != held_.end() && !it->second->released && !it->second->lost.load();
}

void LeaseTable::schedule(HeldLock& h, Clock::time_point sent, Millis validity) {
  // Not yet published: the lock only tells the analysis what owns these fields.
  PartLock lk(mu_, lease_table_state);
  h.validity = validity;
  // A backend may grant less than the TTL (a ZooKeeper session shorter than it,
  // Redlock's drift): renew on the validity's schedule, never after its deadline.
  h.renew_interval = std::max(Millis(1), std::min(h.opts.renew_interval, validity / 3));
  if (h.opts.max_hold) h.set_hold_limit(sent + *h.opts.max_hold);
  h.confirmed_sent = sent;
  if (needs_renewal_) {
    h.set_deadline(std::min(sent + validity - h.opts.safety_margin, h.hold_limit()));
    h.next_renew = h.deadline() >= h.hold_limit() ? kNever : sent + h.renew_interval;
  } else {
    h.set_deadline(h.hold_limit());  // kNever without a max_hold
    h.next_renew = kNever;
  }
}

LeaseTable::Recorded LeaseTable::record(const std::shared_ptr<HeldLock>& held, const std::string& owner,
                                        std::uint64_t epoch_at_send) {
  Recorded r;
  PartLock lk(mu_, lease_table_state);
  // The acquisition's entry first: its key views the caller's owner, and nothing below
  // that may throw runs before it is gone.
  Millis min_cap{0};
  if (auto f = inflight_.find(owner); f != inflight_.end()) {
    min_cap = f->second.min_cap;
    // A loss of this very lease reported before it was recorded.
    const auto& lost = f->second;
    r.lease_gone =
        lost.all || std::find(lost.names.begin(), lost.names.end(), held->name) != lost.names.end();
    inflight_.erase(f);
  }
  const Key k = key(held->name, thread_owner_of(held->owner));
  auto it = held_.find(k);
  if (it != held_.end()) {
    const std::shared_ptr<HeldLock>& entry = it->second;
    // This thread's earlier hold of the name, if still listed and not yet declared
    // lost, is past its local deadline (re-entry refused it). Once replaced here the
    // watchdog would never see it: the caller declares its loss.
    if (entry != held && !entry->released && !entry->lost.load()) r.replaced = entry;
    // A lost hold of this thread not yet unlocked (nested re-lock after a loss):
    // kept so that the outer unlock finds it again once this one is released.
    if (!entry->released) held->displaced = entry;
    set(it, held);
  } else {
    held_.emplace(k, held);
  }
  // A validity lowered while this grant was under way (its answer may have counted
  // the old one), even if raised again since.
  cap(*held, validity_cap_);
  cap(*held, min_cap);
  // session_lost() bumps the epoch and collects held_ under mu_: a session lost
  // after this grant was sent but before this insertion missed this lease.
  r.session_gone = session_epoch() != epoch_at_send;
  // Wake the renewer only if this lease needs it earlier than it planned to wake:
  // an uncontended acquire should not cost a context switch.
  if (needs_renewal_) renewer_.renew_earlier(held->next_renew - held->renew_interval / 4);
  // The watchdog: woken if this deadline comes first, or (awake, its last scan may
  // predate this lease) scans again before sleeping.
  if (needs_renewal_ || held->hold_limit() != kNever) renewer_.deadline_earlier(held->deadline());
  return r;
}

std::shared_ptr<HeldLock> LeaseTable::find(Key key) const {
  LockGuard lk(mu_);
  auto it = held_.find(key);
  return it == held_.end() ? nullptr : it->second;
}

std::shared_ptr<HeldLock> LeaseTable::find_reentrant(Key key) const {
  PartLock lk(mu_, lease_table_state);
  auto it = held_.find(key);
  if (it == held_.end()) return nullptr;
  for (const std::shared_ptr<HeldLock>* h = &it->second; *h; h = &(*h)->displaced) {
    if ((*h)->reentrant && !(*h)->released) return *h;
  }
  return nullptr;
}

LeaseTable::Drop LeaseTable::drop(const std::shared_ptr<HeldLock>& held) {
  PartLock lk(mu_, lease_table_state);
  if (held->released) return Drop::not_held;
  if (--held->hold_count > 0) return Drop::still_held;
  held->released = true;
  auto it = held_.find(key(held->name, thread_owner_of(held->owner)));
  if (it != held_.end() && it->second == held) {
    if (held->displaced && !held->displaced->released) {
      set(it, held->displaced);  // the outer, lost hold this one replaced
    } else {
      held_.erase(it);
    }
  }
  held->displaced.reset();
  return Drop::dropped;
}

std::vector<std::shared_ptr<HeldLock>> LeaseTable::take_all() {
  std::vector<std::shared_ptr<HeldLock>> all;
  LockGuard lk(mu_);
  for (auto& [k, h] : held_) all.push_back(h);
  held_.clear();
  return all;
}

std::size_t LeaseTable::size() const {
  LockGuard lk(mu_);
  return held_.size();
}

std::vector<std::shared_ptr<HeldLock>> LeaseTable::session_lost() {
  std::vector<std::shared_ptr<HeldLock>> all;
  LockGuard lk(mu_);
  session_epoch_.fetch_add(1, std::memory_order_acq_rel);
  for (auto& [k, h] : held_) all.push_back(h);
  return all;
}

std::shared_ptr<HeldLock> LeaseTable::lease_lost(std::string_view name, std::string_view owner) noexcept {
  LockGuard lk(mu_);
  auto it = held_.find(key(name, thread_owner_of(owner)));
  if (it != held_.end() && it->second->owner == owner) return it->second;
  // Not recorded yet: an acquisition of this owner may be under way.
  if (auto f = inflight_.find(owner); f != inflight_.end()) {
    try {
      f->second.names.emplace_back(name);
    } catch (...) {
      f->second.all = true;  // cannot tell which: take it for the one won
    }
  }
  return nullptr;
}

void LeaseTable::cap_validity(Millis validity) noexcept {
  PartLock lk(mu_, lease_table_state);
  validity_cap_ = validity;
  for (auto& [owner, f] : inflight_) {
    f.min_cap = f.min_cap.count() == 0 ? validity : std::min(f.min_cap, validity);
  }
  for (auto& [k, h] : held_) {
    if (!h->released && !h->lost.load()) cap(*h, validity);
  }
}

void LeaseTable::cap(HeldLock& h, Millis cap) {
  if (cap.count() <= 0 || h.validity <= cap || !needs_renewal_) return;
  // Counted again from the last confirmation's send time with the new validity.
  h.validity = cap;
  h.renew_interval = std::max(Millis(1), std::min(h.renew_interval, cap / 3));
  const Clock::time_point d = std::min(h.confirmed_sent + cap - h.opts.safety_margin, h.hold_limit());
  if (d < h.deadline()) h.set_deadline(d);
  // Confirm it again now, against the new validity, rather than on the old schedule
  // (also when renewals had stopped because the deadline had reached the hold limit).
  h.next_renew = h.deadline() >= h.hold_limit() ? kNever : std::min(h.next_renew, clock_->now());
  renewer_.renew_earlier(Clock::time_point::min());
  renewer_.deadline_earlier(h.deadline());
}

std::vector<std::shared_ptr<HeldLock>> LeaseTable::expired(Clock::time_point now,
                                                           Clock::time_point& next) const {
  std::vector<std::shared_ptr<HeldLock>> out;
  next = Clock::time_point::max();
  LockGuard lk(mu_);
  for (auto& [k, h] : held_) {
    if (h->lost.load()) continue;
    if (now >= h->deadline()) {
      out.push_back(h);
    } else {
      next = std::min(next, h->deadline());
    }
  }
  return out;
}

std::vector<std::shared_ptr<HeldLock>> LeaseTable::take_due(Clock::time_point now, bool all) {
  std::vector<std::shared_ptr<HeldLock>> due;
  PartLock lk(mu_, lease_table_state);
  for (auto& [k, h] : held_) {
    if (h->lost.load() || h->renew_in_flight) continue;
    if (all) {
      if (!needs_renewal_ || h->deadline() >= h->hold_limit()) continue;  // never extended past max_hold
    } else {
      if (now >= h->deadline()) continue;
      // Batch: renew everything due within a quarter interval, so leases taken
      // at different moments converge onto the same round trips.
      if (h->next_renew > now + h->renew_interval / 4) continue;
    }
    h->renew_in_flight = true;
    due.push_back(h);
  }
  return due;
}

LeaseTable::Renewed LeaseTable::apply_renewals(std::span<const std::shared_ptr<HeldLock>> due,
                                               std::span<const RenewStatus> out, Clock::time_point sent,
                                               Clock::time_point replied) {
  Renewed r;
  PartLock lk(mu_, lease_table_state);
  // The answers count from when they are applied, not from when the reply was read:
  // owns() reads the deadline without this lock, so a deadline that passed in between
  // has already been reported. Read under the lock, after every earlier reading.
  const Clock::time_point applied = std::max(replied, clock_->now());
  for (std::size_t i = 0; i < due.size(); ++i) {
    HeldLock& h = *due[i];
    h.renew_in_flight = false;
    if (h.released || h.lost.load()) continue;
    switch (out[i]) {
      case RenewStatus::renewed: {
        // Applied after the local deadline: owns() has already answered
        // false, and the holder may have acted on it. A loss once seen stays a
        // loss, and is signalled (the server record expires by its TTL).
        if (applied >= h.deadline()) {
          r.late.push_back(due[i]);
          break;
        }
        // Never past the hold limit: once the deadline reaches it, no more renewals.
        const Clock::time_point d = std::min(sent + h.validity - h.opts.safety_margin, h.hold_limit());
        if (d > h.deadline()) h.set_deadline(d);
        h.confirmed_sent = std::max(h.confirmed_sent, sent);
        h.next_renew = h.deadline() >= h.hold_limit() ? kNever : sent + h.renew_interval;
        ++r.renewed;
        break;
      }
      case RenewStatus::not_owner: r.refused.push_back(due[i]); break;
      case RenewStatus::failed:
        // Retry soon, but never in a tight loop: after max(10 ms, interval/4). take_due
        // renews what falls due within a quarter interval, so the retry is set that much
        // later (a retry time nearer than that would be due again at once).
        h.next_renew = clock_->now() + std::max(Millis(10), h.renew_interval / 4) + h.renew_interval / 4;
        break;
    }
  }
  return r;
}

Clock::time_point LeaseTable::next_renewal(Clock::time_point cap) const {
  Clock::time_point wake = cap;
  PartLock lk(mu_, lease_table_state);
  for (auto& [k, h] : held_) {
    if (h->lost.load() || h->renew_in_flight) continue;
    wake = std::min(wake, h->next_renew - h->renew_interval / 4);
  }
  return wake;
}

}  // namespace distlock::detail
