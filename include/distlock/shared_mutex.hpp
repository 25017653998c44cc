// distlock/shared_mutex.hpp — a read-write lock: many readers or one writer.
//
// `Client::shared_mutex(name)` meets the standard SharedLockable and
// SharedTimedLockable requirements, so std::shared_lock (readers) and
// std::unique_lock (the writer) work, with try_lock_for/try_lock_until.
//
// How it is made (every backend, through the same URL): R reader slots, each an
// ordinary lease (lock "<name>\x1frw\x1f<i>"), and a writer-intent lock
// ("<name>\x1frw\x1fw"). A reader holds one slot; a writer holds the intent lock and
// every slot. Safety rests on the slots alone: a writer holds all R, so no reader
// can hold one. The intent lock gives fairness: a reader takes a slot only while the
// intent lock is free, so a writer that is waiting (it holds the intent lock while
// it collects the slots) blocks new readers and is not starved. R (max readers,
// default 32, 1..1024) is stored with the lock, in a record beside its locks.
// A writer's lock() costs R + 1 acquisitions (R + 1 leases renewed in the same
// batches); a reader's costs one status call and one acquisition.
//
// Fencing: the writer's token() is the intent lock's fencing token (strictly
// increasing per name across writers). Readers get no token.
//
// Loss: a hold is lost when ANY lease it is made of is lost (a writer losing one
// slot is no longer exclusive): its stop token fires and owns() turns false, and it
// stays lost until unlocked.
//
// Holds are per thread, like Mutex, and NOT reentrant: lock()/lock_shared() from a
// thread that already holds the lock (in either mode, through any SharedMutex of the
// same client and name) throws errc::invalid_argument instead of deadlocking. In
// particular read→write upgrade (lock() while holding it shared) is refused:
// two readers upgrading at once would wait for each other forever. downgrade()
// turns the calling thread's exclusive hold into a shared one without letting a
// writer in between.
//
// Thread-safety: a SharedMutex is a cheap copyable handle (copies share the per
// thread holds); all members may be called from any thread.
//
// Example:
//   auto client = distlock::connect("etcd://127.0.0.1:2379");
//   distlock::SharedMutex rw = client.shared_mutex("config/app");
//   { std::shared_lock rd(rw); auto cfg = read_config(); }           // many at once
//   { std::unique_lock wr(rw); write_config(rw.token(), new_cfg);    // alone
//     rw.downgrade(); wr.release(); std::shared_lock rd(rw, std::adopt_lock);
//     verify(read_config()); }
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>

#include "distlock/client.hpp"
#include "distlock/export.hpp"
#include "distlock/options.hpp"

namespace distlock {

namespace detail {
struct SharedMutexState;
struct ReadWriteHold;
class Engine;
}  // namespace detail

/// A hold of a read-write lock that is not tied to a thread (SharedMutex::
/// acquire_shared / acquire_exclusive), for code that passes a hold between threads
/// or watches it from another thread (`distlock run --shared/--exclusive`). Move-only;
/// the destructor releases it. It works like a Lease: a reader's hold is one reader
/// slot, a writer's the intent lock and every slot, and the hold is lost when ANY of
/// them is lost (stop token fired, owns() false, on_lost callbacks run once).
/// A Hold (distlock/hold.hpp), as Lease is.
/// Thread-safety: as Lease (const members from any thread; release() from one).
class DISTLOCK_EXPORT ReadWriteLease : public Hold {
 public:
  ReadWriteLease() noexcept = default;
  ReadWriteLease(ReadWriteLease&&) noexcept;
  ReadWriteLease& operator=(ReadWriteLease&&) noexcept;
  ReadWriteLease(const ReadWriteLease&) = delete;
  ReadWriteLease& operator=(const ReadWriteLease&) = delete;
  ~ReadWriteLease() override;

  /// Held, and no part of it lost or past its local deadline.
  bool owns() const noexcept override;
  bool exclusive() const noexcept;
  /// The read-write lock's name (as given to Client::shared_mutex).
  const std::string& name() const noexcept override;
  /// The writer's fencing token (the intent lock's). errc::not_supported for a
  /// shared hold (readers get no token) and on backends without tokens;
  /// errc::not_owner for an empty one.
  std::uint64_t token() const override;
  bool has_token() const noexcept override;
  /// Fires when any part of the hold is lost. Not fired by release().
  std::stop_token stop_token() const noexcept override;
  /// Runs `fn` once when the hold is lost (queued at once if it already is), on the
  /// client's event thread, like Lease::on_lost (see there: which thread, blocking,
  /// exceptions). The stop token fires first, on the thread that detects the loss.
  void on_lost(std::function<void()> fn) override;
  /// Time left until the earliest local deadline of its parts (zero when lost).
  Millis remaining() const noexcept override;
  /// As Lease::max_hold_remaining, the earliest of its parts.
  std::optional<Millis> max_hold_remaining() const noexcept override;
  /// The first lost part's reason (none while held).
  LossReason loss_reason() const noexcept override;
  std::string loss_detail() const override;
  /// Releases every part. errc::lost if any part had been lost (the others are
  /// released all the same).
  void release() override;
  void release(std::error_code& ec) noexcept override;

 private:
  friend class SharedMutex;
  DISTLOCK_NO_EXPORT ReadWriteLease(std::shared_ptr<detail::Engine> engine,
                                    std::shared_ptr<detail::ReadWriteHold> hold) noexcept;
  std::shared_ptr<detail::Engine> engine_;
  std::shared_ptr<detail::ReadWriteHold> hold_;
};

class DISTLOCK_EXPORT SharedMutex {
 public:
  /// Prefer `Client::shared_mutex`. `max_readers` (R): 0 = the stored value, or
  /// kDefaultMaxReaders for a new lock; otherwise 1..1024, and a value other than
  /// the stored one throws errc::invalid_argument naming both. Also throws for a bad
  /// name, errc::not_supported where the backend keeps no records, and
  /// errc::backend_unavailable etc. when the server cannot be asked.
  SharedMutex(Client client, std::string name, LockOptions opts, int max_readers = 0);

  // Exclusive (writer). lock() waits up to the options' `wait` (forever if unset)
  // and throws errc::timeout when it runs out.
  void lock();
  bool try_lock();
  template <class Rep, class Period>
  bool try_lock_for(const std::chrono::duration<Rep, Period>& d) {
    return timed(true, to_wait(d));
  }
  template <class ClockT, class Duration>
  bool try_lock_until(const std::chrono::time_point<ClockT, Duration>& tp) {
    return timed(true, until(tp));
  }
  /// Throws errc::not_owner when the calling thread holds no exclusive hold. A lost
  /// hold is unlocked without an error (its loss was signalled already).
  void unlock();

  // Shared (reader).
  void lock_shared();
  bool try_lock_shared();
  template <class Rep, class Period>
  bool try_lock_shared_for(const std::chrono::duration<Rep, Period>& d) {
    return timed(false, to_wait(d));
  }
  template <class ClockT, class Duration>
  bool try_lock_shared_until(const std::chrono::time_point<ClockT, Duration>& tp) {
    return timed(false, until(tp));
  }
  void unlock_shared();

  /// Turns the calling thread's exclusive hold into a shared one (it keeps one
  /// reader slot, gives up the others and the intent lock). Release with
  /// unlock_shared(). Throws errc::not_owner without an exclusive hold.
  void downgrade();

  /// The writer's fencing token (the intent lock's) of the calling thread's
  /// exclusive hold. errc::not_owner without one; errc::not_supported on backends
  /// without fencing tokens.
  std::uint64_t token() const;
  /// Fires when the calling thread's hold (either mode) is lost. errc::not_owner
  /// without a hold.
  std::stop_token stop_token() const;
  /// The calling thread holds it (either mode) and no part of the hold is lost.
  bool owns() const noexcept;
  /// The calling thread's hold, if any.
  bool owns_exclusive() const noexcept;
  bool owns_shared() const noexcept;

  /// Holds not tied to the calling thread (see ReadWriteLease), waiting up to the
  /// options' `wait` (forever if unset); throw as lock()/lock_shared() do (errc::busy
  /// with a zero wait, errc::timeout when the wait runs out). They are not the per
  /// thread holds of lock()/lock_shared(), so relocking is not detected: a thread
  /// that waits for acquire_exclusive() while it keeps a shared ReadWriteLease of
  /// the same lock waits for itself until the wait runs out.
  ReadWriteLease acquire_shared();
  ReadWriteLease acquire_exclusive();

  const std::string& name() const noexcept;
  /// R: the number of reader slots (as stored on the server).
  int max_readers() const noexcept;

  static constexpr int kDefaultMaxReaders = 32;
  static constexpr int kMaxReaders = 1024;
  /// Key of the record that stores R; lock names of the intent lock and of slot i.
  static std::string definition_key(std::string_view name);
  static std::string intent_lock_name(std::string_view name);
  static std::string slot_lock_name(std::string_view name, int i);

 private:
  // nullopt: no limit.
  template <class Rep, class Period>
  static std::optional<Millis> to_wait(const std::chrono::duration<Rep, Period>& d) {
    const double ms = std::chrono::duration<double, std::milli>(d).count();
    if (!(ms > 0)) return Millis(0);
    if (ms >= static_cast<double>(LockOptions::max_wait.count())) return std::nullopt;
    return std::chrono::ceil<Millis>(std::chrono::duration<double, std::milli>(ms));
  }
  template <class ClockT, class Duration>
  static std::optional<Millis> until(const std::chrono::time_point<ClockT, Duration>& tp) {
    const auto now = ClockT::now();
    if (tp <= now) return Millis(0);
    // Taken in floating point: time_point::max() and the like cannot overflow.
    return to_wait(std::chrono::duration<double, std::milli>(tp.time_since_epoch()) -
                   std::chrono::duration<double, std::milli>(now.time_since_epoch()));
  }
  bool timed(bool exclusive, std::optional<Millis> wait);
  ReadWriteLease acquire_lease(bool exclusive);
  std::shared_ptr<detail::SharedMutexState> state_;
};

}  // namespace distlock
