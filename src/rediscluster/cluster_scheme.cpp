#include "rediscluster/cluster_scheme.hpp"

#include "rediscluster/cluster_backend.hpp"

namespace distlock::detail {

namespace {
using T = QueryType;

constexpr QueryKey kClusterKeys[] = {
    {"prefix", T::text, "start of every key and channel; 1-256 bytes without '{' or '}'", "distlock"},
    kTimeoutKey,
    {"nat", T::text,
     "ANNOUNCED_HOST:PORT=REACHABLE_HOST:PORT[,...]: nodes that announce addresses this client cannot "
     "reach directly"},
};

constexpr Scheme kSchemes[] = {
    {"redis+cluster", "redis+cluster://[user:password@]host[:port][,host[:port]...]",
     "a Redis Cluster (each lock on the node serving its slot)", false, "", kClusterKeys,
     &make_redis_cluster_backend},
};
}  // namespace

std::span<const Scheme> redis_cluster_schemes() noexcept {
  return kSchemes;
}

}  // namespace distlock::detail
