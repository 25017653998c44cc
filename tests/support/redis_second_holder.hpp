// For the tests that try to break exclusion across a Redis failover (a stale sentinel, a
// resumed old master, a sentinel that names an older epoch): one client keeps trying for a name
// another client holds, and the test reports how a grant came about.
//
//   const std::string both = granted_while_held(c1, "job", held, 5s, [&](const Lease& l) {
//     return "client 1 acquired job (token " + std::to_string(l.token()) + ") while ...";
//   });
//   EXPECT_TRUE(both.empty()) << both;
//
// Thread-safety: call it from the test's thread; `c` and `held` are not used by others meanwhile.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <system_error>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"

namespace distlock::testing {

/// Tries `c.try_acquire(name)` (a 30 s lease, released at once) every 5 ms for `limit` on the
/// steady clock, an error counting as not granted, and stops at the first grant. If that grant
/// came while `held` still owns its lease, returns `describe(granted lease)`; else "".
template <class Describe>
std::string granted_while_held(Client& c, const std::string& name, const Lease& held, Millis limit,
                               Describe describe) {
  std::string both;
  eventually(
      [&] {
        std::optional<Lease> l;
        try {
          l = c.try_acquire(name, ttl_of(std::chrono::seconds(30)));
        } catch (const std::system_error&) {
          return false;
        }
        if (!l || !l->owns()) return false;
        if (held.owns()) both = describe(*l);
        std::error_code ec;
        l->release(ec);
        return true;
      },
      limit);
  return both;
}

}  // namespace distlock::testing
