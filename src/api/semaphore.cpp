#include "distlock/semaphore.hpp"

#include <algorithm>

#include "api/client_access.hpp"
#include "api/primitives.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"

namespace distlock {

namespace {

std::string describe(std::string_view name) {
  return "semaphore \"" + std::string(name.substr(0, 200)) + "\"";
}

}  // namespace

std::string Semaphore::definition_key(std::string_view name) {
  return detail::names::semaphore_definition(name);
}

std::string Semaphore::permit_lock_name(int i) const {
  return detail::names::semaphore_permit(name_, static_cast<std::size_t>(i));
}

Semaphore::Semaphore(Client client, std::string name, int permits, LockOptions opts)
    : client_(std::move(client)), name_(std::move(name)), opts_(opts) {
  const std::string what = describe(name_);
  detail::check_primitive_name("semaphore", name_, detail::names::kSemaphoreSuffixBytes);
  if (permits < 1 || permits > kMaxPermits) {
    throw_error(
        make_error_code(errc::invalid_argument),
        what + ": permits must be 1.." + std::to_string(kMaxPermits) + ", not " + std::to_string(permits));
  }
  if (auto ec = opts_.validate_and_fill()) throw_error(ec, what + ": invalid lock options");
  permits_ = detail::define_size(*detail::engine_of(client_), definition_key(name_), permits, permits, what,
                                 "permits");
  locks_.reserve(static_cast<std::size_t>(permits_));
  for (int i = 0; i < permits_; ++i) locks_.push_back(permit_lock_name(i));
}

std::optional<Lease> Semaphore::take(std::optional<Millis> wait, detail::Error& ec) {
  // Start at a random permit: contenders that all started at permit 0 would collide
  // on it and then on permit 1, ...
  const std::size_t start = detail::random_start(locks_.size());
  std::vector<std::string> order;
  order.reserve(locks_.size());
  for (std::size_t i = 0; i < locks_.size(); ++i) order.push_back(locks_[(start + i) % locks_.size()]);
  const auto& engine = detail::engine_of(client_);
  auto held = engine->acquire_any(order, opts_, wait, ec);
  if (ec) return std::nullopt;
  return Lease(engine, std::move(held));
}

namespace {
[[noreturn]] void throw_take_error(const detail::Error& ec, const std::string& name) {
  std::string what = describe(name);
  if (ec == errc::timeout) what += ": no permit came free in time";
  if (ec == errc::busy) what += ": every permit is held";
  throw_error(ec, what + ec.suffix());
}
}  // namespace

Lease Semaphore::acquire() {
  detail::Error ec;
  auto lease = take(opts_.wait, ec);
  if (ec) throw_take_error(ec, name_);
  return std::move(*lease);
}

Lease Semaphore::acquire(std::error_code& ec) noexcept {
  ec.clear();
  try {
    detail::Error err;
    auto lease = take(opts_.wait, err);
    ec = err;
    if (!ec && lease) return std::move(*lease);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  if (!ec) ec = make_error_code(errc::protocol_error);
  return {};
}

std::optional<Lease> Semaphore::try_acquire() {
  detail::Error ec;
  auto lease = take(Millis(0), ec);
  if (ec == errc::busy) return std::nullopt;
  if (ec) throw_take_error(ec, name_);
  return lease;
}

std::optional<Lease> Semaphore::try_acquire_for(Millis wait) {
  detail::Error ec;
  auto lease = take(std::max(wait, Millis(0)), ec);
  if (ec == errc::busy || ec == errc::timeout) return std::nullopt;
  if (ec) throw_take_error(ec, name_);
  return lease;
}

std::size_t Semaphore::available() {
  std::size_t free = 0;
  for (const auto& lock : locks_) {
    std::error_code ec;
    const LockInfo info = client_.status(lock, ec);
    if (ec) throw_error(ec, describe(name_) + ": status of a permit");
    if (!info.held) ++free;
  }
  return free;
}

Semaphore Client::semaphore(std::string_view name, int permits, const LockOptions& opts) {
  return Semaphore(*this, std::string(name), permits, opts);
}

Semaphore Client::semaphore(std::string_view name, int permits) {
  return semaphore(name, permits, engine_->options().lock_defaults);
}

}  // namespace distlock
