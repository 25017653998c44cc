// Leader election on the engine (include/distlock/election.hpp): the leader holds
// the lock `<name>\x1felect`, its term is that lock's token, its value is the record
// `<name>\x1felect` = "<term>\n<value>". Observers wait by the engine's per-name
// watch (engine.hpp, Engine::NameWatch) on the election lock and on the bell.
#include "distlock/election.hpp"

#include <algorithm>
#include <charconv>
#include <stop_token>

#include "api/client_access.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "engine/names.hpp"

namespace distlock {

using detail::Engine;

namespace {

// Room for the "<term>\n" header (20 digits + newline) within a record.
constexpr std::size_t kMaxValue = detail::kMaxRecordValue - 32;

using detail::names::printable;

[[noreturn]] void fail(const detail::Error& ec, const std::string& what) {
  throw_error(ec, what + ec.suffix());
}

Millis clamp_cap(Millis m) {
  return std::clamp(m, Millis(5), Millis(std::chrono::seconds(5)));
}

}  // namespace

Election::Election(Client client, std::string name, LockOptions opts)
    : client_(std::move(client)), name_(std::move(name)), opts_(opts) {
  if (name_.empty()) throw_error(make_error_code(errc::invalid_argument), "election name is empty");
  if (name_.find('\0') != std::string::npos) {
    throw_error(make_error_code(errc::invalid_argument), "election name contains a NUL byte");
  }
  lock_name_ = detail::names::election(name_);
  bell_name_ = detail::names::election_bell(name_);
}

Election Client::election(std::string_view name, const LockOptions& opts) {
  return Election(*this, std::string(name), opts);
}
Election Client::election(std::string_view name) {
  return election(name, engine_->options().lock_defaults);
}

std::string Election::encode_record(std::uint64_t term, std::string_view value) {
  std::string r = std::to_string(term);
  r.push_back('\n');
  r.append(value);
  return r;
}

std::optional<std::pair<std::uint64_t, std::string>> Election::decode_record(std::string_view record) {
  const auto nl = record.find('\n');
  if (nl == std::string_view::npos || nl == 0) return std::nullopt;
  std::uint64_t term = 0;
  const auto [p, err] = std::from_chars(record.data(), record.data() + nl, term);
  if (err != std::errc() || p != record.data() + nl) return std::nullopt;
  return std::pair{term, std::string(record.substr(nl + 1))};
}

Lease Election::campaign(std::string_view value, std::error_code& ec) noexcept {
  ec.clear();
  try {
    if (value.size() > kMaxValue) {
      ec = make_error_code(errc::invalid_argument);
      return {};
    }
    Lease lease = client_.acquire(lock_name_, opts_, ec);
    if (ec) return {};
    const std::uint64_t term = lease.has_token() ? lease.token() : 0;
    detail::Error err;
    write_value(term, value, errc::lost, err);
    ec = err;
    if (ec) {
      std::error_code ignored;
      lease.release(ignored);  // a leader whose value is not written does not stay leader
      return {};
    }
    ring();
    return lease;
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return {};
}

Lease Election::campaign(std::string_view value) {
  if (value.size() > kMaxValue) {
    throw_error(make_error_code(errc::invalid_argument),
                "election \"" + printable(name_) + "\": value is " + std::to_string(value.size()) +
                    " bytes; the limit is " + std::to_string(kMaxValue));
  }
  Lease lease;
  try {
    lease = client_.acquire(lock_name_, opts_);
  } catch (const std::system_error& e) {
    throw std::system_error(e.code(), "election \"" + printable(name_) + "\": campaign: " +
                                          printable(std::string_view(e.what()).substr(0, 200)));
  }
  const std::uint64_t term = lease.has_token() ? lease.token() : 0;
  detail::Error ec;
  write_value(term, value, errc::lost, ec);
  if (ec) {
    std::error_code ignored;
    lease.release(ignored);
    throw_error(ec, "election \"" + printable(name_) + "\": won term " + std::to_string(term) +
                        " but could not write its value, so gave it up" + ec.suffix());
  }
  ring();
  return lease;
}

void Election::proclaim(const Lease& leadership, std::string_view value) {
  if (leadership.name() != lock_name_) {
    throw_error(make_error_code(errc::not_owner),
                "proclaim on election \"" + printable(name_) + "\" with a lease that is not its leadership");
  }
  if (!leadership.owns()) {
    throw_error(make_error_code(errc::not_owner),
                "proclaim on election \"" + printable(name_) + "\": leadership is no longer held");
  }
  if (value.size() > kMaxValue) {
    throw_error(make_error_code(errc::invalid_argument),
                "election \"" + printable(name_) + "\": value is " + std::to_string(value.size()) +
                    " bytes; the limit is " + std::to_string(kMaxValue));
  }
  const std::uint64_t term = leadership.has_token() ? leadership.token() : 0;
  detail::Error ec;
  write_value(term, value, errc::not_owner, ec);
  if (ec) fail(ec, "election \"" + printable(name_) + "\": proclaim");
  ring();
}

void Election::write_value(std::uint64_t term, std::string_view value, errc refused, detail::Error& ec) {
  const std::string record = encode_record(term, value);
  const std::string stored =
      detail::engine_of(client_)->backend().put_record(lock_name_, record, detail::PutMode::fenced, ec);
  if (ec || stored == record) return;
  const auto newer = detail::record_term(stored);
  ec.fail(refused, "the value of term " + std::to_string(term) +
                       " was not written: the election's record is of term " +
                       (newer ? std::to_string(*newer) : std::string("?")) + ", a newer leader's");
}

void Election::resign(Lease& leadership) {
  if (leadership.name() != lock_name_) {
    throw_error(make_error_code(errc::invalid_argument),
                "resign from election \"" + printable(name_) + "\" with a lease that is not its leadership");
  }
  leadership.release();
}

void Election::ring() noexcept {
  // Acquired and released at once: its release notification wakes observers that
  // found the election vacant or the value not yet written. Best effort: an
  // observer that misses it re-checks within its cap.
  try {
    LockOptions o = opts_;
    o.wait = Millis(200);
    std::error_code ec;
    Lease bell = client_.acquire(bell_name_, o, ec);
    if (!ec) bell.release(ec);
  } catch (...) {
  }
}

std::optional<Leader> Election::read(detail::Error& ec) {
  ec.clear();
  const auto& engine = detail::engine_of(client_);
  LockInfo info = engine->status(lock_name_, ec);
  if (ec) return std::nullopt;
  if (!info.held) return std::nullopt;
  // Held by the server at this read, with time left: a lease already ended is never
  // reported.
  if (info.ttl_remaining && info.ttl_remaining->count() <= 0) return std::nullopt;
  Leader l;
  l.holder = info.holder.value_or(std::string());
  l.ttl_remaining = info.ttl_remaining;
  if (!engine->capabilities().fencing || !info.token) return l;  // no term: value cannot be matched
  l.term = *info.token;
  std::optional<std::string> rec = engine->backend().get_record(lock_name_, ec);
  if (ec) return std::nullopt;
  if (rec) {
    if (auto d = decode_record(*rec); d && d->first == l.term) {
      l.value = std::move(d->second);
      l.value_known = true;
    }
  }
  return l;
}

std::optional<Leader> Election::leader() {
  detail::Error ec;
  auto l = read(ec);
  if (ec) fail(ec, "election \"" + printable(name_) + "\": reading the leader");
  return l;
}

std::optional<Leader> Election::observe(std::optional<std::uint64_t> after_term, std::optional<Millis> wait) {
  const auto& engine = detail::engine_of(client_);
  if (engine->forked()) throw_error(make_error_code(errc::forked), "election used in a forked child");
  if (!engine->capabilities().fencing) {
    throw_error(make_error_code(errc::not_supported),
                "election \"" + printable(name_) + "\": observe needs fencing tokens (terms); backend " +
                    engine->backend().url() + " issues none");
  }
  const auto& clock = engine->clock();
  using TP = Clock::time_point;
  if (wait && wait->count() < 0) wait = Millis(0);
  if (wait && *wait >= LockOptions::max_wait) wait.reset();
  const TP deadline = wait ? clock->now() + *wait : TP::max();
  const Millis grace = 2 * engine->options().command_timeout;

  // LockOptions::cancel ends this wait as it ends an acquire's: a token already stopped
  // fails before any request; a stop later wakes the wait below (a change notification
  // of both names: any other waiter of them only looks again).
  const auto fail_if_cancelled = [&] {
    if (opts_.cancel.stop_requested()) {
      throw_error(make_error_code(errc::cancelled),
                  "election \"" + printable(name_) + "\": observe cancelled");
    }
  };
  fail_if_cancelled();
  Engine::NameWatch lock_w(engine, lock_name_);
  Engine::NameWatch bell_w(engine, bell_name_);
  std::stop_callback on_cancel(opts_.cancel, [&] {
    engine->on_change(lock_name_);
    engine->on_change(bell_name_);
  });

  std::optional<std::uint64_t> pending_term;  // a new leader whose value is not written yet
  TP pending_since{};
  for (;;) {
    // Subscribed first, then the state read: a change after the read is notified.
    const bool lock_live = lock_w.arm(deadline);
    const bool bell_live = bell_w.arm(deadline);
    const std::uint64_t lock_gen = lock_w.generation();
    const std::uint64_t bell_gen = bell_w.generation();
    fail_if_cancelled();  // after the generations: a stop from now on is seen by the wait
    detail::Error ec;
    std::optional<Leader> l = read(ec);
    if (ec) fail(ec, "election \"" + printable(name_) + "\": observe");
    const TP now = clock->now();
    bool on_bell = true;
    Millis cap = clamp_cap(opts_.ttl);  // vacant: a new leader rings the bell
    if (l && (!after_term || l->term > *after_term)) {
      if (l->value_known) return l;
      if (pending_term != l->term) {
        pending_term = l->term;
        pending_since = now;
      } else if (now - pending_since >= grace) {
        return l;  // its value never came: report it as is (value_known false)
      }
      cap = clamp_cap(std::chrono::duration_cast<Millis>(pending_since + grace - now));
    } else if (l) {
      // A leader already reported: wait for its release, capped by its remaining TTL
      // (a lease that expires without a notification).
      on_bell = false;
      cap = clamp_cap(l->ttl_remaining.value_or(opts_.ttl));
    }
    if (now >= deadline) return std::nullopt;
    if (!(on_bell ? bell_live : lock_live)) cap = std::min(cap, Engine::kDegradedRecheck);
    (on_bell ? bell_w : lock_w).wait(on_bell ? bell_gen : lock_gen, std::min(deadline, now + cap));
  }
}

}  // namespace distlock
