#include "zk/zk_scheme.hpp"

#include <chrono>

#include "zk/zk_backend.hpp"

namespace distlock::detail {

namespace {
using namespace std::chrono_literals;
using T = QueryType;

constexpr QueryKey kZkKeys[] = {
    kTimeoutKey,
    {"session_timeout", T::duration,
     "the ZooKeeper session timeout; every lock of the client is lost when the session expires",
     "the lock ttl", "", false, 24h},
};

constexpr Scheme kSchemes[] = {
    {"zk", "zk://[user:password@]host[:port][,host[:port]...][/chroot]", "a ZooKeeper ensemble", false, "",
     kZkKeys, &make_zk_backend},
};
}  // namespace

std::span<const Scheme> zk_schemes() noexcept {
  return kSchemes;
}

}  // namespace distlock::detail
