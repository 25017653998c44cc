// distlock/error.hpp — the error codes of distlock and their std::error_category.
//
// Every failure distlock reports is a `std::error_code` in `distlock::category()`,
// thrown as `std::system_error` where the standard Lockable contract throws, or
// returned through an `std::error_code&` overload. "Busy" is a normal outcome of
// `try_lock`, not an error; it only becomes `errc::timeout` when a wait runs out.
//
// Thread-safety: everything here is immutable and safe to use from any thread.
//
// Example:
//   std::error_code ec;
//   auto guard = client.acquire("orders/42", {}, ec);
//   if (ec == distlock::errc::timeout) { /* somebody else holds it */ }
#pragma once

#include <string>
#include <system_error>

#include "distlock/export.hpp"

namespace distlock {

/// distlock's error codes. Values are stable (they appear in logs and JSON).
enum class errc : int {
  busy = 1,                    ///< held by another owner and the caller asked for one attempt only
  timeout = 2,                 ///< the wait deadline passed before the lock was acquired
  lost = 3,                    ///< the lock was held but its lease ran out or the server dropped it
  not_owner = 4,               ///< unlock/renew by someone who does not hold the lock
  backend_unavailable = 5,     ///< the server cannot be reached (retrying later may work)
  auth_failed = 6,             ///< the server rejected the credentials (retrying will not help)
  invalid_argument = 7,        ///< a name, duration or option is malformed or out of range
  invalid_url = 8,             ///< the backend URL is malformed or names an unknown scheme
  quorum_unavailable = 9,      ///< fewer than a quorum of independent servers answered (Redlock)
  protocol_error = 10,         ///< the server answered something distlock did not expect
  not_supported = 11,          ///< the backend cannot do this (e.g. a fencing token on Redlock)
  exhausted = 12,              ///< a finite resource ran out (worker ids, a day's id counter)
  clock_moved_backwards = 13,  ///< the wall clock went back further than tolerated (id generators)
  forked = 14,                 ///< a client (or id generator) used in a child process after fork()
  cancelled = 15,  ///< the caller cancelled the wait (LockOptions::cancel); nothing is left queued
};

/// The category every distlock error code belongs to. Its name() is "distlock".
DISTLOCK_EXPORT const std::error_category& category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), category()};
}

/// Throws `std::system_error(ec, what)`. Out of line so call sites stay small.
[[noreturn]] DISTLOCK_EXPORT void throw_error(std::error_code ec, const std::string& what);

}  // namespace distlock

template <>
struct std::is_error_code_enum<distlock::errc> : std::true_type {};
