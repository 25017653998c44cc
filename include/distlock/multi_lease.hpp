// distlock/multi_lease.hpp — several locks held as one: all or nothing, without deadlock.
//
// `Client::acquire_all(names, opts)` takes every name or none. The names are taken
// one after another in one canonical order — sorted bytewise, duplicates dropped —
// whatever order the caller wrote them in, so two callers whose sets overlap cannot
// each hold a name the other waits for (no cycle of waits, hence no deadlock). The
// result is one `MultiLease`:
//   - `opts.wait` bounds the whole call, not each name: a call that cannot have every
//     name by then releases the names it already took before it throws errc::timeout
//     (errc::busy for a wait of 0), so another client can take them at once;
//   - each name keeps its own lease and its own fencing token (`token(name)`);
//   - a loss of any one name is a loss of the whole: the multi-lease's stop token
//     fires and `owns()` turns false (the other names stay held on the server until
//     release() or the destructor, which release every name);
//   - release() and the destructor release every name, in the reverse order; the
//     destructor is noexcept (a failed release is logged and counted, never thrown).
// docs/multi_lock.md states the guarantees and their assumptions.
//
// Thread-safety: a MultiLease is move-only and belongs to one thread at a time, like a
// Lease; its stop token may be watched from any thread. acquire_all may be called from
// any thread concurrently, as Client::acquire.
//
// Example:
//   distlock::LockOptions opts;
//   opts.wait = std::chrono::seconds(5);     // covers the whole call
//   distlock::MultiLease both = client.acquire_all({"accounts/7", "accounts/3"}, opts);
//   std::stop_token stop = both.stop_token();  // fires if either name is lost
//   transfer(both.token("accounts/3"), both.token("accounts/7"), stop);
//   both.release();                            // or at the end of the scope
#pragma once

#include <cstdint>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/client.hpp"
#include "distlock/export.hpp"
#include "distlock/options.hpp"

namespace distlock {

/// Leases on several names held as one (see the file comment). Move-only RAII.
class DISTLOCK_EXPORT MultiLease {
 public:
  MultiLease() noexcept;
  MultiLease(MultiLease&&) noexcept;
  MultiLease& operator=(MultiLease&&) noexcept;
  MultiLease(const MultiLease&) = delete;
  MultiLease& operator=(const MultiLease&) = delete;
  ~MultiLease();

  /// True while every name is held (none lost, none released). False for an empty
  /// MultiLease.
  bool owns() const noexcept;
  explicit operator bool() const noexcept { return owns(); }

  /// The names held, in the canonical order they were taken (sorted, no duplicates).
  std::vector<std::string> names() const;
  std::size_t size() const noexcept;

  /// The lease on one of the names, in the canonical order (`leases()[i]` holds
  /// `names()[i]`); its loss_reason() tells which name was lost and why.
  const std::vector<Lease>& leases() const noexcept;
  /// The lease on `name`; throws errc::invalid_argument when `name` is not one of them.
  const Lease& lease(std::string_view name) const;

  /// `name`'s fencing token (Lease::token()): errc::invalid_argument for a name not
  /// held here, errc::not_supported where the backend has none (Redlock).
  std::uint64_t token(std::string_view name) const;
  bool has_token() const noexcept;

  /// Fires when any one of the names is lost (not by an orderly release). A stop
  /// callback on it runs on the thread that detected the loss: keep it short.
  std::stop_token stop_token() const noexcept;

  /// The least time left until a name's local deadline (zero when one is lost).
  Millis remaining() const noexcept;

  /// Releases every name (in the reverse of the canonical order), even when one of
  /// them fails. Throws `errc::lost` if a name had been lost, else
  /// `errc::backend_unavailable` if a server could not be reached for one (that lease
  /// then expires by its TTL). Afterwards owns() is false.
  void release();
  void release(std::error_code& ec) noexcept;

 private:
  friend class Client;
  struct State;
  DISTLOCK_NO_EXPORT explicit MultiLease(std::unique_ptr<State> state) noexcept;
  std::unique_ptr<State> state_;
};

}  // namespace distlock
