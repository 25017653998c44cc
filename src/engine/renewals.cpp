// Engine: the renewer's and the watchdog's rounds (engine/renewer.hpp runs them):
// renewal batches and losses at local deadlines, over the lease table.
#include <algorithm>
#include <chrono>

#include "engine/engine.hpp"

namespace distlock::detail {

Clock::time_point Engine::declare_expired() {
  Clock::time_point next;
  for (auto& h : leases_.expired(clock_->now(), next)) {
    declare_lost(h, h->expiry_reason(), "local deadline passed without a successful renewal");
  }
  return next;
}

std::size_t Engine::tick() {
  if (forked()) return 0;
  // The local deadline is checked before anything else: a holder resumed after a
  // pause must see its loss before it renews or acts.
  declare_expired();
  std::vector<std::shared_ptr<HeldLock>> due = leases_.take_due(clock_->now(), false);
  if (due.empty()) return 0;
  return renew_items(std::move(due));
}

std::size_t Engine::renew_all() {
  if (forked()) return 0;
  // As in tick(): a lease past its local deadline is lost, never renewed back to life.
  declare_expired();
  std::vector<std::shared_ptr<HeldLock>> due = leases_.take_due(clock_->now(), true);
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

  const LeaseTable::Renewed r = leases_.apply_renewals(due, out, sent, replied);
  const std::size_t renewed = r.renewed;
  n_renewed_.fetch_add(renewed, std::memory_order_relaxed);
  if (ec) log_.log(LogLevel::warning, "renewal of {} lease(s) failed: {}", due.size(), ec.message());
  if (tracing_) trace_renewals(due, out, sent, replied, ec);  // before the losses they cause
  declare_refused(r.refused);
  for (auto& h : r.late) {
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
  return leases_.next_renewal(clock_->now() + std::chrono::seconds(1));
}

Clock::time_point Engine::watchdog_round() {
  const Clock::time_point next = declare_expired();
  sweep_idle_watches(false);
  return next;
}

}  // namespace distlock::detail
