// distlock/hold.hpp — what every held lease answers, whatever kind of lock it holds.
//
// `Hold` is the interface `Lease` (a lock, a semaphore permit, an election's leadership)
// and `ReadWriteLease` (a read-write lock's shared or exclusive hold) both implement: code
// that watches a hold (its deadline, its loss, its fencing token) and releases it, without
// caring which primitive granted it, takes a `Hold&` or keeps a `std::unique_ptr<Hold>`.
// Each member means what the implementing class documents (client.hpp for Lease,
// shared_mutex.hpp for ReadWriteLease); for a read-write hold "the lease" is all of its
// parts, lost when any part is lost.
//
// Thread-safety: as Lease: the const members may be called from any thread at the same
// time; on_lost(), release() and moving belong to one thread at a time.
//
// Example:
//   std::unique_ptr<distlock::Hold> hold;
//   if (name.starts_with("config/")) {  // a reader of a read-write lock
//     hold = std::make_unique<distlock::ReadWriteLease>(client.shared_mutex(name).acquire_shared());
//   } else {
//     hold = std::make_unique<distlock::Lease>(client.acquire(name));
//   }
//   write_order(hold->has_token() ? hold->token() : 0, hold->stop_token());  // stops on loss
//   hold->release();
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>

#include "distlock/export.hpp"
#include "distlock/options.hpp"

namespace distlock {

/// Why a lease was lost (`Hold::loss_reason()`); `none` while it is held (or after
/// an orderly release).
enum class LossReason {
  none,
  local_deadline,   ///< the local deadline passed without a successful renewal
  renewal_late,     ///< a renewal succeeded, but its reply came after the local deadline
  renewal_refused,  ///< the server said another owner (or nobody) holds it
  session_lost,     ///< the backend reported the client's whole session gone at once (no built-in
                    ///< backend does today: etcd and ZooKeeper report each lease, as lease_ended)
  lease_ended,      ///< the server ended this one lease (deleted from outside, its node gone, its
                    ///< ZooKeeper session expired, its etcd session lease lost)
  gone_at_release,  ///< the server no longer had it when the holder released it
  max_hold,         ///< LockOptions::max_hold passed since the grant
  forked,           ///< used in a forked child: the lease is the parent's
  revoked,          ///< Client::revoke (`distlock revoke`) ended it; Lease::revoke_reason() says why
};

/// The reason's name: "local_deadline", "max_hold", ... ("none" for none).
DISTLOCK_EXPORT const char* to_string(LossReason reason) noexcept;

/// A held lease of any kind (see the file comment). Destroying a Hold releases it.
class DISTLOCK_EXPORT Hold {
 public:
  virtual ~Hold();

  /// Held, and no part of it lost or past its local deadline.
  virtual bool owns() const noexcept = 0;
  explicit operator bool() const noexcept { return owns(); }
  /// The name it was taken on (the lock's, the semaphore permit's, the read-write lock's).
  virtual const std::string& name() const noexcept = 0;
  /// The fencing token; throws errc::not_supported where there is none (check has_token()).
  virtual std::uint64_t token() const = 0;
  virtual bool has_token() const noexcept = 0;
  /// Fires when the hold is lost; not by an orderly release.
  virtual std::stop_token stop_token() const noexcept = 0;
  /// Runs `fn` once when the hold is lost, on the client's event thread (Lease::on_lost).
  virtual void on_lost(std::function<void()> fn) = 0;
  /// Time left until the local deadline (zero when lost or released).
  virtual Millis remaining() const noexcept = 0;
  /// Time left until LockOptions::max_hold ends it; nullopt without a max_hold.
  virtual std::optional<Millis> max_hold_remaining() const noexcept = 0;
  /// Why it was lost (none while held), and one sentence on it for people.
  virtual LossReason loss_reason() const noexcept = 0;
  virtual std::string loss_detail() const = 0;
  /// Releases now: throws errc::lost if it had been lost, or the backend's error.
  virtual void release() = 0;
  virtual void release(std::error_code& ec) noexcept = 0;

 protected:
  Hold() noexcept = default;
  Hold(const Hold&) noexcept = default;
  Hold& operator=(const Hold&) noexcept = default;
};

}  // namespace distlock
