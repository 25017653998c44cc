// api/multi_lease.cpp — Client::acquire_all and MultiLease (distlock/multi_lease.hpp).
//
// Built only on the public API (Client::acquire / try_acquire, Lease, stop tokens), so it
// works the same on every backend: the names are taken one by one in sorted order, which
// is what makes overlapping sets deadlock-free (docs/multi_lock.md).
#include "distlock/multi_lease.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "distlock/clock.hpp"
#include "distlock/error.hpp"
#include "engine/backend_error.hpp"
#include "engine/engine.hpp"  // Engine::options(): the client's lock_defaults

namespace distlock {

namespace {

/// Requests stop on the multi-lease's source when one name's lease is lost.
struct FireWhole {
  std::stop_source* source;
  void operator()() const noexcept { source->request_stop(); }
};

/// The names in the order they are taken: sorted bytewise, duplicates dropped.
std::vector<std::string> canonical(const std::vector<std::string>& names) {
  if (names.empty())
    throw_error(make_error_code(errc::invalid_argument), "acquire_all: the list of names is empty");
  std::vector<std::string> out(names);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string quoted(const std::string& name) {
  return "\"" + name + "\"";
}

}  // namespace

struct MultiLease::State {
  std::stop_source source;
  std::vector<Lease> leases;  // canonical order
  std::vector<std::unique_ptr<std::stop_callback<FireWhole>>> watches;

  /// Links every lease's loss to `source` (a lease already lost fires it at once).
  void watch() {
    watches.reserve(leases.size());
    for (auto& l : leases)
      watches.push_back(std::make_unique<std::stop_callback<FireWhole>>(l.stop_token(), FireWhole{&source}));
  }
  /// Releases every lease, the last taken first. The first "lost" wins, else the first other
  /// error; the detail says which name's release it was.
  detail::Error release_all() noexcept {
    watches.clear();
    detail::Error err;
    for (auto it = leases.rbegin(); it != leases.rend(); ++it) {
      std::error_code one;
      const std::string name = it->name();
      it->release(one);
      if (one && (!err || (one == errc::lost && err != errc::lost))) {
        err.fail(one, one == errc::lost
                          ? quoted(name) + " had been lost"
                          : "the release of " + quoted(name) + " failed (it expires by its TTL)");
      }
    }
    leases.clear();
    return err;
  }
};

MultiLease::MultiLease() noexcept = default;
MultiLease::MultiLease(std::unique_ptr<State> state) noexcept : state_(std::move(state)) {}
MultiLease::MultiLease(MultiLease&&) noexcept = default;
MultiLease& MultiLease::operator=(MultiLease&& other) noexcept {
  if (this != &other) {
    if (state_) {
      state_->release_all();
    }
    state_ = std::move(other.state_);
  }
  return *this;
}
MultiLease::~MultiLease() {
  // Each Lease::release logs and counts its own failure; nothing is thrown here.
  if (state_) {
    state_->release_all();
  }
}

bool MultiLease::owns() const noexcept {
  if (!state_ || state_->leases.empty() || state_->source.stop_requested()) return false;
  return std::all_of(state_->leases.begin(), state_->leases.end(), [](const Lease& l) { return l.owns(); });
}

std::vector<std::string> MultiLease::names() const {
  std::vector<std::string> out;
  if (!state_) return out;
  out.reserve(state_->leases.size());
  for (const auto& l : state_->leases) out.push_back(l.name());
  return out;
}

std::size_t MultiLease::size() const noexcept {
  return state_ ? state_->leases.size() : 0;
}

const std::vector<Lease>& MultiLease::leases() const noexcept {
  static const std::vector<Lease> none;
  return state_ ? state_->leases : none;
}

const Lease& MultiLease::lease(std::string_view name) const {
  const auto& all = leases();
  auto it = std::lower_bound(all.begin(), all.end(), name, [](const Lease& l, std::string_view n) {
    return std::string_view(l.name()) < n;
  });
  if (it == all.end() || it->name() != name) {
    throw_error(make_error_code(errc::invalid_argument),
                "\"" + std::string(name) + "\" is not one of the names this multi-lease holds");
  }
  return *it;
}

std::uint64_t MultiLease::token(std::string_view name) const {
  return lease(name).token();
}

bool MultiLease::has_token() const noexcept {
  return state_ && !state_->leases.empty() && state_->leases.front().has_token();
}

std::stop_token MultiLease::stop_token() const noexcept {
  return state_ ? state_->source.get_token() : std::stop_token{};
}

Millis MultiLease::remaining() const noexcept {
  if (!owns()) return Millis(0);
  Millis least = Millis::max();
  for (const auto& l : state_->leases) least = std::min(least, l.remaining());
  return least;
}

void MultiLease::release(std::error_code& ec) noexcept {
  ec.clear();
  if (!state_) return;
  ec = state_->release_all();
}

void MultiLease::release() {
  if (!state_) return;
  const detail::Error err = state_->release_all();
  if (err) throw_error(err, "released every name; " + err.detail());
}

MultiLease Client::acquire_all(const std::vector<std::string>& names, const LockOptions& opts) {
  const std::vector<std::string> order = canonical(names);
  const std::shared_ptr<Clock> clock = system_steady_clock();
  // The whole call's bound: opts.wait from now (none: no bound; zero or less: one attempt each).
  std::optional<Clock::time_point> deadline;
  const bool one_attempt = opts.wait && opts.wait->count() <= 0;
  if (opts.wait && !one_attempt && *opts.wait < LockOptions::max_wait) deadline = clock->now() + *opts.wait;
  for (;;) {
    auto state = std::make_unique<MultiLease::State>();
    state->leases.reserve(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      LockOptions each = opts;
      bool out_of_time = false;
      if (deadline) {
        const auto left = std::chrono::ceil<Millis>(*deadline - clock->now());
        out_of_time = left.count() <= 0;
        each.wait = out_of_time ? Millis(0) : left;
      }
      try {
        state->leases.push_back(acquire(order[i], each));
      } catch (const std::system_error& e) {
        const std::size_t taken = state->leases.size();
        // The partial set goes before the error is thrown. A release the server did not confirm
        // is told in the error (its code stays the call's own: cancelled, timeout, ...): that
        // name may still be held until the client's retry or the lease's TTL frees it.
        const detail::Error unreleased = state->release_all();
        std::error_code code = e.code();
        if (out_of_time && code == errc::busy) code = make_error_code(errc::timeout);
        throw_error(code, "acquire_all: " + quoted(order[i]) + " (" + std::to_string(i + 1) + " of " +
                              std::to_string(order.size()) + " in sorted order): " + e.what() + "; the " +
                              std::to_string(taken) + " name(s) taken before it " +
                              (!unreleased                ? std::string("were released")
                               : unreleased == errc::lost ? "were released (" + unreleased.detail() + ")"
                                                          : "were given back, but " + unreleased.detail()));
      }
    }
    state->watch();
    if (!state->source.stop_requested()) return MultiLease(std::move(state));
    // A name taken early was lost while a later one was awaited: give back the whole set and
    // start again in order (taking the lost name again while holding later ones would break
    // the order that rules out deadlock), as long as the wait allows.
    state->release_all();
    if (one_attempt || (deadline && clock->now() >= *deadline)) {
      throw_error(make_error_code(one_attempt ? errc::busy : errc::timeout),
                  "acquire_all: a name was lost while the later ones were taken, and the wait ran out");
    }
  }
}

MultiLease Client::acquire_all(const std::vector<std::string>& names) {
  return acquire_all(names, engine_->options().lock_defaults);
}

MultiLease Client::acquire_all(const std::vector<std::string>& names, const LockOptions& opts,
                               std::error_code& ec) noexcept {
  ec.clear();
  try {
    return acquire_all(names, opts);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return {};
}

std::optional<MultiLease> Client::try_acquire_all(const std::vector<std::string>& names,
                                                  const LockOptions& opts) {
  const std::vector<std::string> order = canonical(names);
  auto state = std::make_unique<MultiLease::State>();
  state->leases.reserve(order.size());
  for (const auto& name : order) {
    std::optional<Lease> one;
    try {
      one = try_acquire(name, opts);
    } catch (...) {
      state->release_all();
      throw;
    }
    if (!one) {
      state->release_all();
      return std::nullopt;
    }
    state->leases.push_back(std::move(*one));
  }
  state->watch();
  if (state->source.stop_requested()) {
    state->release_all();
    return std::nullopt;
  }
  return MultiLease(std::move(state));
}

std::optional<MultiLease> Client::try_acquire_all(const std::vector<std::string>& names) {
  return try_acquire_all(names, engine_->options().lock_defaults);
}

}  // namespace distlock
