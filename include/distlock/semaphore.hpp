// distlock/semaphore.hpp — a counting semaphore: at most N holders of a name at once.
//
// `Client::semaphore(name, permits)` gives a semaphore of `permits` permits (1..1024).
// Each permit is an ordinary lease on a lock of its own (permit i of "jobs" is the
// lock "jobs\x1fsem\x1f<i>"), so a permit has everything a lease has: renewal, a
// conservative local deadline, a stop token that fires on loss and, where the
// backend issues them, a fencing token (strictly increasing per permit, not across
// permits). A holder that dies gives its permit back when its lease's TTL runs out
// (on file:// at once: the kernel drops its lock).
//
// The permit count is stored with the semaphore, in a record beside its locks,
// written once by the first client that names it: asking for the same name with
// another count throws errc::invalid_argument naming both numbers. (To change the
// count, erase the record with `distlock` tools once nobody holds a permit.)
//
// Waiting is by notification: an acquirer tries the permits once, starting at a
// random one to spread contention, then waits for a release of any of them,
// re-checking at the latest when a holder's lease would run out. Where the backend
// queues waiters (etcd, ZooKeeper) a waiter keeps its place in each permit's queue.
//
// Thread-safety: a Semaphore is a cheap copyable handle; all members may be called
// from any thread at once. Each returned Lease belongs to one thread at a time (it
// can be moved). A thread may hold several permits (each acquire() takes another).
//
// Example:
//   auto client = distlock::connect("redis://127.0.0.1:6379");
//   distlock::Semaphore sem = client.semaphore("crawler/fetch", 4);   // 4 at once
//   distlock::Lease permit = sem.acquire();                            // waits
//   fetch(url, permit.stop_token());                                   // stop on loss
//   // released when `permit` goes out of scope
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/client.hpp"
#include "distlock/export.hpp"
#include "distlock/options.hpp"

namespace distlock {

class DISTLOCK_EXPORT Semaphore {
 public:
  /// Prefer `Client::semaphore`. Stores (or checks) the permit count on the server:
  /// throws errc::invalid_argument for a bad name, permits outside 1..1024 or a
  /// count other than the stored one; errc::not_supported where the backend keeps
  /// no records; errc::backend_unavailable etc. when the server cannot be asked.
  Semaphore(Client client, std::string name, int permits, LockOptions opts);

  /// Takes one permit, waiting up to the options' `wait` (forever if unset).
  /// Throws std::system_error: errc::timeout when the wait ran out, errc::busy with
  /// a wait of 0, errc::backend_unavailable, ...
  Lease acquire();
  /// As acquire(), with the error in `ec` (an empty Lease then).
  Lease acquire(std::error_code& ec) noexcept;
  /// One attempt over every permit; nullopt when all are held.
  std::optional<Lease> try_acquire();
  /// Waits up to `wait` for a permit; nullopt when none came free in time.
  std::optional<Lease> try_acquire_for(Millis wait);

  /// The number of permits (as stored on the server).
  int permits() const noexcept { return permits_; }
  /// Permits free right now (asks the server about each permit: one status call per
  /// permit; a snapshot that may be stale by the time it returns).
  std::size_t available();
  /// The semaphore's name.
  const std::string& name() const noexcept { return name_; }

  /// The lock name of permit `i` (0 <= i < permits()), for status/list tools.
  std::string permit_lock_name(int i) const;
  /// The key of the record that stores the permit count.
  static std::string definition_key(std::string_view name);

  static constexpr int kMaxPermits = 1024;

 private:
  DISTLOCK_NO_EXPORT std::optional<Lease> take(std::optional<Millis> wait, detail::Error& ec);
  Client client_;
  std::string name_;
  int permits_ = 0;
  LockOptions opts_;
  std::vector<std::string> locks_;  // permit lock names, in order
};

}  // namespace distlock
