// distlock/with_lock.hpp — run a function while holding a lock (node-redlock's
// using(), ShedLock's executeWithLock).
//
// with_lock(client, name, opts, fn) acquires `name` (waiting opts.wait, forever if
// unset; throws like Client::acquire: errc::timeout, errc::busy for a wait of 0, ...),
// calls fn, and releases the lock after fn returns or throws.
//
//   fn(std::uint64_t token, std::stop_token stop)  — the fencing token and the loss
//                                                    signal (backends with tokens;
//                                                    on redlock:// the token cannot
//                                                    be had: errc::not_supported
//                                                    before fn is called)
//   fn(std::stop_token stop)                       — every backend
//
// fn should pass `token` to whatever it writes and stop soon after `stop` fires (the
// lease is lost: another holder may already run).
//
// Outcome:
//   - fn throws: the lock is released and the exception propagates unchanged.
//   - fn returns and the lease was held throughout: the lock is released and fn's
//     result is returned. A release the server could not be reached for is not
//     thrown (the lease expires by its TTL; the engine logs and counts it).
//   - fn returns but the lease was lost while it ran (stop fired, or the local
//     deadline passed): std::system_error with errc::lost is thrown after fn returns,
//     and fn's result is discarded — whatever fn did after the loss may have
//     overlapped another holder.
//
// Thread-safety: as Client::acquire; fn runs on the calling thread.
//
// Example:
//   auto client = distlock::connect("redis://127.0.0.1:6379");
//   distlock::LockOptions opts;
//   opts.wait = std::chrono::seconds(5);
//   int rows = distlock::with_lock(client, "reports/nightly", opts,
//       [&](std::uint64_t token, std::stop_token stop) {
//         return build_report(token, stop);   // stops early when stop fires
//       });
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <stop_token>
#include <string_view>
#include <type_traits>
#include <utility>

#include "distlock/client.hpp"
#include "distlock/export.hpp"
#include "distlock/options.hpp"

namespace distlock {

/// with_lock's last step, out of line (so it is part of the library's ABI, not an
/// internal): after fn returned, throws errc::lost if the lease was lost, else releases it
/// (release failures other than a loss are not thrown: the lease then expires by its TTL).
DISTLOCK_EXPORT void finish_with_lock(Lease& lease);

template <class Fn>
requires std::invocable<Fn, std::uint64_t, std::stop_token> || std::invocable<Fn, std::stop_token>
decltype(auto) with_lock(Client& client, std::string_view name, const LockOptions& opts, Fn&& fn) {
  Lease lease = client.acquire(name, opts);  // released by its destructor if fn throws
  auto call = [&]() -> decltype(auto) {
    if constexpr (std::invocable<Fn, std::uint64_t, std::stop_token>) {
      const std::uint64_t token = lease.token();  // errc::not_supported without tokens
      return std::invoke(std::forward<Fn>(fn), token, lease.stop_token());
    } else {
      return std::invoke(std::forward<Fn>(fn), lease.stop_token());
    }
  };
  using R = decltype(call());
  if constexpr (std::is_void_v<R>) {
    call();
    finish_with_lock(lease);
  } else {
    R result = call();
    finish_with_lock(lease);
    return static_cast<R>(std::forward<R>(result));
  }
}

}  // namespace distlock
