// The scheme registry: one line per backend folder, each contributing its own entries.
// distlock/config.hpp says which component folders were built (DISTLOCK_HAS_<NAME>, from
// the DISTLOCK_WITH_<NAME> options).
#include "connect/registry.hpp"

#include <vector>

#include "distlock/config.hpp"
#include "fake/memory_scheme.hpp"
#if DISTLOCK_HAS_FILE
#include "file/file_scheme.hpp"
#endif
#if DISTLOCK_HAS_REDIS
#include "redis/redis_scheme.hpp"
#endif
#if DISTLOCK_HAS_REDISCLUSTER
#include "rediscluster/cluster_scheme.hpp"
#endif
#if DISTLOCK_HAS_REDLOCK
#include "redlock/redlock_scheme.hpp"
#endif
#if DISTLOCK_HAS_ETCD
#include "etcd/etcd_scheme.hpp"
#endif
#if DISTLOCK_HAS_ZK
#include "zk/zk_scheme.hpp"
#endif
#if DISTLOCK_HAS_POSTGRES
#include "postgres/postgres_scheme.hpp"
#endif
#if DISTLOCK_HAS_MYSQL
#include "mysql/mysql_scheme.hpp"
#endif

namespace distlock::detail {

namespace {

std::vector<Scheme> build_list() {
  using Entries = std::span<const Scheme> (*)() noexcept;
  const Entries folders[] = {
#if DISTLOCK_HAS_FILE
    &file_schemes,
#endif
#if DISTLOCK_HAS_REDIS
    &redis_schemes,
#endif
#if DISTLOCK_HAS_REDISCLUSTER
    &redis_cluster_schemes,
#endif
#if DISTLOCK_HAS_REDLOCK
    &redlock_schemes,
#endif
#if DISTLOCK_HAS_ETCD
    &etcd_schemes,
#endif
#if DISTLOCK_HAS_ZK
    &zk_schemes,
#endif
#if DISTLOCK_HAS_POSTGRES
    &postgres_schemes,
#endif
#if DISTLOCK_HAS_MYSQL
    &mysql_schemes,
#endif
    &memory_schemes,
  };
  std::vector<Scheme> out;
  for (Entries entries : folders) {
    for (const Scheme& s : entries()) out.push_back(s);
  }
  return out;
}

}  // namespace

std::span<const Scheme> all_schemes() noexcept {
  // Built once; copying a few rows of views and pointers cannot fail but for memory.
  static const std::vector<Scheme> list = build_list();
  return list;
}

const Scheme* find_scheme(std::string_view name) noexcept {
  return scheme_named(all_schemes(), name);
}

BackendFactory find_backend(std::string_view scheme) {
  const Scheme* s = find_scheme(scheme);
  return s ? s->factory : nullptr;
}

std::string known_schemes() {
  std::string out;
  for (const auto& s : all_schemes()) {
    if (!out.empty()) out += ", ";
    out += s.name;
  }
  return out;
}

Error check_url_query(const Url& url) {
  const Scheme* s = find_scheme(url.scheme);
  return s ? check_query(*s, url) : Error{};
}

std::string describe_schemes(bool with_keys) {
  return describe_schemes(all_schemes(), with_keys);
}

}  // namespace distlock::detail
