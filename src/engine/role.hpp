// Checked annotations for the fields of objects a part of the engine hands out (a
// lease's schedule, a wait slot) and guards with its own mutex. The analysis cannot tie
// a field to a mutex of another object, so such fields are guarded by the part's Role:
// a capability without state that the part's PartLock acquires together with the
// part's mutex. A field guarded by a Role can then only be touched under some PartLock
// of that part: checked by the compiler. (Every instance of a part shares its Role: the
// analysis checks that the part's lock is held, not which instance's; each object is
// reached only through the part that made it.)
#pragma once

#include <mutex>

#include "engine/thread_annotations.hpp"

namespace distlock::detail {

class DISTLOCK_CAPABILITY("role") Role {};

/// UniqueLock over a part's mutex that also holds the part's Role.
class DISTLOCK_SCOPED_CAPABILITY PartLock {
 public:
  PartLock(AnnotatedMutex& mu, Role& role) DISTLOCK_ACQUIRE(mu, role) : lk_(mu.native()) { (void)role; }
  ~PartLock() DISTLOCK_RELEASE() {}
  PartLock(const PartLock&) = delete;
  PartLock& operator=(const PartLock&) = delete;
  /// What std::condition_variable and Clock::wait_until take (held again on return).
  std::unique_lock<std::mutex>& native() noexcept { return lk_; }

 private:
  std::unique_lock<std::mutex> lk_;
};

}  // namespace distlock::detail
