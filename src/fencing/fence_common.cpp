// Pieces shared by every fence: the fence key name, the stale-token error and the
// in-process atomic maximum.
#include <string>

#include "distlock/fencing.hpp"

namespace distlock {

std::string fence_key_for(std::string_view key) {
  std::string out(key);
  out += ":distlock-fence";
  return out;
}

void FenceResult::check(std::uint64_t my_token) const {
  if (applied()) return;
  throw_error(make_error_code(errc::lost), "fenced write with token " + std::to_string(my_token) +
                                               " rejected: the resource has already seen token " +
                                               std::to_string(highest_token) + " from a newer lock holder");
}

bool FenceGuard::admit(std::uint64_t token) noexcept {
  std::uint64_t seen = highest_.load(std::memory_order_acquire);
  while (token >= seen) {
    if (token == seen) return true;
    if (highest_.compare_exchange_weak(seen, token, std::memory_order_acq_rel)) return true;
  }
  return false;
}

}  // namespace distlock
