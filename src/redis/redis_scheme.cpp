#include "redis/redis_scheme.hpp"

#include <chrono>

#include "redis/redis_backend.hpp"
#include "redis/sentinel_backend.hpp"

namespace distlock::detail {

namespace {
using namespace std::chrono_literals;
using T = QueryType;

constexpr QueryKey kRedisKeys[] = {
    {"prefix", T::text, "start of every key and channel; 1-256 bytes without '{' or '}'", "distlock"},
    kTimeoutKey,
    {"cacert", T::file, "PEM file of the CA that signed the server's certificate", "", "", true},
    {"cert", T::file, "PEM client certificate (needs key=)", "", "", true},
    {"key", T::file, "PEM private key of cert=", "", "", true},
};
constexpr QueryKey kSentinelKeys[] = {
    {"prefix", T::text, "start of every key and channel; 1-256 bytes without '{' or '}'", "distlock"},
    kTimeoutKey,
    {"wait", T::count, "after acquiring, WAIT until this many replicas have the lock", "0", "", false, 1h,
     100},
    {"wait_timeout", T::duration, "how long the WAIT of wait= may take; below the command timeout",
     "min(1s, timeout/2)"},
};

constexpr Scheme kSchemes[] = {
    {"redis", "redis://[user:password@]host[:port][/db]", "one Redis server", false, "rediss", kRedisKeys,
     &make_redis_backend},
    {"rediss", "rediss://[user:password@]host[:port][/db]", "one Redis server over TLS", true, "", kRedisKeys,
     &make_redis_backend},
    {"redis+sentinel", "redis+sentinel://[user:password@]host[:port][,host[:port]...]/master-name",
     "the master a group of Redis Sentinels names, followed across failovers", false, "", kSentinelKeys,
     &make_sentinel_backend},
};
}  // namespace

std::span<const Scheme> redis_schemes() noexcept {
  return kSchemes;
}

}  // namespace distlock::detail
