// Clang thread-safety annotations (-Wthread-safety) and a mutex that carries them.
// libstdc++'s std::mutex and std::lock_guard have no capability attributes, so the
// analysis cannot see them; AnnotatedMutex, LockGuard and UniqueLock below are thin wrappers
// that it can. Other compilers see plain wrappers (the macros expand to nothing).
//
// Build with -DDISTLOCK_THREAD_SAFETY_ANALYSIS=ON and clang to check them
// (scripts/test.sh does, for the core and the file and redis backends).
#pragma once

#include <mutex>

#if defined(__clang__)
#define DISTLOCK_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DISTLOCK_THREAD_ANNOTATION(x)
#endif

#define DISTLOCK_CAPABILITY(x) DISTLOCK_THREAD_ANNOTATION(capability(x))
#define DISTLOCK_SCOPED_CAPABILITY DISTLOCK_THREAD_ANNOTATION(scoped_lockable)
#define DISTLOCK_GUARDED_BY(x) DISTLOCK_THREAD_ANNOTATION(guarded_by(x))
#define DISTLOCK_PT_GUARDED_BY(x) DISTLOCK_THREAD_ANNOTATION(pt_guarded_by(x))
#define DISTLOCK_ACQUIRED_BEFORE(...) DISTLOCK_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define DISTLOCK_ACQUIRED_AFTER(...) DISTLOCK_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define DISTLOCK_REQUIRES(...) DISTLOCK_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define DISTLOCK_ACQUIRE(...) DISTLOCK_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define DISTLOCK_RELEASE(...) DISTLOCK_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define DISTLOCK_TRY_ACQUIRE(...) DISTLOCK_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define DISTLOCK_EXCLUDES(...) DISTLOCK_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define DISTLOCK_RETURN_CAPABILITY(x) DISTLOCK_THREAD_ANNOTATION(lock_returned(x))
#define DISTLOCK_NO_THREAD_SAFETY_ANALYSIS DISTLOCK_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace distlock::detail {

/// std::mutex as a capability the analysis tracks.
class DISTLOCK_CAPABILITY("mutex") AnnotatedMutex {
 public:
  void lock() DISTLOCK_ACQUIRE() { mu_.lock(); }
  void unlock() DISTLOCK_RELEASE() { mu_.unlock(); }
  bool try_lock() DISTLOCK_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  /// The std::mutex itself, for UniqueLock (condition variables, Clock::wait_until).
  std::mutex& native() noexcept { return mu_; }

 private:
  std::mutex mu_;
};

/// std::lock_guard over an AnnotatedMutex.
class DISTLOCK_SCOPED_CAPABILITY LockGuard {
 public:
  explicit LockGuard(AnnotatedMutex& mu) DISTLOCK_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~LockGuard() DISTLOCK_RELEASE() { mu_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  AnnotatedMutex& mu_;
};

/// std::unique_lock over an AnnotatedMutex: held from construction to destruction (the
/// analysis assumes so across waits, which re-take the lock before returning).
/// native() is what std::condition_variable and Clock::wait_until take.
class DISTLOCK_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(AnnotatedMutex& mu) DISTLOCK_ACQUIRE(mu) : lk_(mu.native()) {}
  ~UniqueLock() DISTLOCK_RELEASE() {}
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;
  void lock() DISTLOCK_ACQUIRE() { lk_.lock(); }
  void unlock() DISTLOCK_RELEASE() { lk_.unlock(); }
  std::unique_lock<std::mutex>& native() noexcept { return lk_; }

 private:
  std::unique_lock<std::mutex> lk_;
};

}  // namespace distlock::detail
