// `distlock run --lock`: MultiHold, several locks as one Hold (multi_hold.hpp).
#include "cli/run/multi_hold.hpp"

#include <algorithm>

#include "distlock/error.hpp"

namespace distlock::cli::run {

MultiHold::MultiHold(MultiLease multi) : multi_(std::move(multi)) {
  for (const Lease& lease : multi_.leases()) label_ += (label_.empty() ? "" : ",") + lease.name();
}

MultiHold::~MultiHold() = default;

bool MultiHold::owns() const noexcept {
  return multi_.owns();
}

const std::string& MultiHold::name() const noexcept {
  return label_;
}

std::uint64_t MultiHold::token() const {
  if (multi_.size() != 1) {
    throw std::system_error(make_error_code(errc::not_supported),
                            "locks \"" + label_ + "\" have one fencing token per name, not one");
  }
  return multi_.leases().front().token();
}

bool MultiHold::has_token() const noexcept {
  return multi_.size() == 1 && multi_.has_token();
}

std::stop_token MultiHold::stop_token() const noexcept {
  return multi_.stop_token();
}

void MultiHold::on_lost(std::function<void()> fn) {
  on_lost_.emplace_back(multi_.stop_token(), std::move(fn));
}

Millis MultiHold::remaining() const noexcept {
  return multi_.remaining();
}

std::optional<Millis> MultiHold::max_hold_remaining() const noexcept {
  std::optional<Millis> least;
  for (const Lease& lease : multi_.leases()) {
    if (const auto left = lease.max_hold_remaining(); left && (!least || *left < *least)) least = left;
  }
  return least;
}

const Lease* MultiHold::lost_lease() const noexcept {
  const auto& leases = multi_.leases();
  const auto it = std::find_if(leases.begin(), leases.end(),
                               [](const Lease& l) { return l.loss_reason() != LossReason::none; });
  return it == leases.end() ? nullptr : &*it;
}

LossReason MultiHold::loss_reason() const noexcept {
  const Lease* lost = lost_lease();
  return lost ? lost->loss_reason() : LossReason::none;
}

std::string MultiHold::loss_detail() const {
  const Lease* lost = lost_lease();
  if (!lost) return {};
  const std::string detail = lost->loss_detail();
  return "lock \"" + lost->name() +
         "\" of the set: " + (detail.empty() ? to_string(lost->loss_reason()) : detail);
}

void MultiHold::release() {
  on_lost_.clear();
  multi_.release();
}

void MultiHold::release(std::error_code& ec) noexcept {
  on_lost_.clear();
  multi_.release(ec);
}

std::string MultiHold::tokens_env() const {
  std::string out;
  for (const Lease& lease : multi_.leases()) {
    out += (out.empty() ? "" : ",") + lease.name() + "=" +
           (lease.has_token() ? std::to_string(lease.token()) : std::string("-"));
  }
  return "DISTLOCK_TOKENS=" + out;
}

}  // namespace distlock::cli::run
