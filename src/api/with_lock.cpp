// distlock::with_lock's out-of-line part (include/distlock/with_lock.hpp).
#include "distlock/with_lock.hpp"

#include <string>

namespace distlock {

void finish_with_lock(Lease& lease) {
  const bool lost = !lease.owns();
  const std::string name = lease.name();
  std::error_code ec;
  lease.release(ec);
  // Any other release failure: the lease expires by its TTL (logged and counted by
  // the engine); fn ran under the lock, so its result stands.
  if (lost || ec == errc::lost) {
    throw_error(make_error_code(errc::lost),
                "lock \"" + name.substr(0, 200) + "\" was lost while the function ran under it");
  }
}

}  // namespace distlock
