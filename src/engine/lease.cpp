#include "engine/lease.hpp"

#include <atomic>
#include <string>

#include "engine/owner_id.hpp"

namespace distlock::detail {

bool HeldLock::owns() const noexcept {
  return !lost.load(std::memory_order_acquire) && fork_gen == fork_generation() && clock->now() < deadline();
}

LossReason HeldLock::expiry_reason() const noexcept {
  const Clock::time_point limit = hold_limit();
  return limit != Clock::time_point::max() && deadline() >= limit ? LossReason::max_hold
                                                                  : LossReason::local_deadline;
}

distlock::LossReason public_loss_reason(LossReason r) noexcept {
  switch (r) {
    case LossReason::local_deadline: return distlock::LossReason::local_deadline;
    case LossReason::renewal_late: return distlock::LossReason::renewal_late;
    case LossReason::renewal_refused: return distlock::LossReason::renewal_refused;
    case LossReason::session_lost: return distlock::LossReason::session_lost;
    case LossReason::lease_ended: return distlock::LossReason::lease_ended;
    case LossReason::gone_at_release: return distlock::LossReason::gone_at_release;
    case LossReason::max_hold: return distlock::LossReason::max_hold;
    case LossReason::revoked: return distlock::LossReason::revoked;
    case LossReason::count_: break;
  }
  return distlock::LossReason::local_deadline;
}

std::string expiry_text(const HeldLock& h, LossReason r) {
  if (r == LossReason::max_hold && h.opts.max_hold) {
    return "max_hold " + std::to_string(h.opts.max_hold->count()) + "ms reached (held since the grant)";
  }
  return "local deadline passed without a successful renewal";
}

distlock::LossReason HeldLock::public_reason() const noexcept {
  if (fork_gen != fork_generation()) return distlock::LossReason::forked;
  {
    LockGuard lk(callbacks_mu);
    if (loss_reason) return public_loss_reason(*loss_reason);
  }
  if (clock->now() >= deadline()) return public_loss_reason(expiry_reason());
  return distlock::LossReason::none;
}

std::string HeldLock::public_detail() const {
  if (fork_gen != fork_generation()) return "used in a forked child process: the lease is the parent's";
  {
    LockGuard lk(callbacks_mu);
    if (loss_reason) return loss_detail;
  }
  if (clock->now() >= deadline()) return expiry_text(*this, expiry_reason());
  return {};
}

std::uint64_t this_thread_seq() noexcept {
  static std::atomic<std::uint64_t> next_thread_seq{1};
  thread_local const std::uint64_t seq = next_thread_seq.fetch_add(1, std::memory_order_relaxed);
  return seq;
}

std::string owner_for_this_thread(const std::string& client_id) {
  std::string out;
  out.reserve(client_id.size() + 21);
  out.append(client_id);
  out.push_back(':');
  append_decimal(out, this_thread_seq());
  return out;
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

}  // namespace distlock::detail
