// One registration line per backend. distlock/config.hpp says which component folders
// were built (DISTLOCK_HAS_<NAME>, from the DISTLOCK_WITH_<NAME> options); a backend
// declares its factory in its own header.
#include <array>

#include "core/backend.hpp"
#include "distlock/config.hpp"

#if DISTLOCK_HAS_FILE
#include "file/file_backend.hpp"
#endif
#if DISTLOCK_HAS_REDIS
#include "redis/redis_backend.hpp"
#include "redis/sentinel_backend.hpp"
#endif
#if DISTLOCK_HAS_REDISCLUSTER
#include "rediscluster/cluster_backend.hpp"
#endif
#if DISTLOCK_HAS_REDLOCK
#include "redlock/redlock_backend.hpp"
#endif
#if DISTLOCK_HAS_ETCD
#include "etcd/etcd_backend.hpp"
#endif
#if DISTLOCK_HAS_ZK
#include "zk/zk_backend.hpp"
#endif
#if DISTLOCK_HAS_POSTGRES
#include "postgres/postgres_backend.hpp"
#endif
#include "fake/memory_backend.hpp"

namespace distlock::detail {

namespace {
struct Entry {
  std::string_view scheme;
  BackendFactory factory;
};

constexpr Entry kBackends[] = {
#if DISTLOCK_HAS_FILE
    {"file", &make_file_backend},
#endif
#if DISTLOCK_HAS_REDIS
    {"redis", &make_redis_backend},
    {"rediss", &make_redis_backend},  // TLS
    {"redis+sentinel", &make_sentinel_backend},
#endif
#if DISTLOCK_HAS_REDISCLUSTER
    {"redis+cluster", &make_redis_cluster_backend},
#endif
#if DISTLOCK_HAS_REDLOCK
    {"redlock", &make_redlock_backend},
    {"redlocks", &make_redlock_backend},  // TLS
#endif
#if DISTLOCK_HAS_ETCD
    {"etcd", &make_etcd_backend},
#endif
#if DISTLOCK_HAS_ZK
    {"zk", &make_zk_backend},
#endif
#if DISTLOCK_HAS_POSTGRES
    {"postgres", &make_postgres_backend},
    {"postgresql", &make_postgres_backend},
#endif
    {"memory", &make_memory_backend},
};
}  // namespace

namespace {
thread_local std::string t_error_detail;
}  // namespace

void set_error_detail(std::string detail) noexcept {
  t_error_detail = std::move(detail);
}

std::string take_error_detail() noexcept {
  std::string out;
  out.swap(t_error_detail);
  return out;
}

BackendFactory find_backend(std::string_view scheme) {
  for (const auto& e : kBackends) {
    if (e.scheme == scheme) return e.factory;
  }
  return nullptr;
}

std::string known_schemes() {
  std::string out;
  for (const auto& e : kBackends) {
    if (!out.empty()) out += ", ";
    out += e.scheme;
  }
  return out;
}

}  // namespace distlock::detail
