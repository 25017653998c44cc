// One registration line per backend. distlock/config.hpp says which component folders
// were built (DISTLOCK_HAS_<NAME>, from the DISTLOCK_WITH_<NAME> options); a backend
// declares its factory in its own header.
#include <array>
#include <chrono>

#include "core/backend.hpp"
#include "core/url_keys.hpp"
#include "distlock/config.hpp"
#include "distlock/error.hpp"

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
#if DISTLOCK_HAS_MYSQL
#include "mysql/mysql_backend.hpp"
#endif
#include "fake/memory_backend.hpp"
#if DISTLOCK_HAS_IDS
#include "ids/segment_source.hpp"
#if DISTLOCK_HAS_POSTGRES
#include "postgres/pg_segment.hpp"
#endif
#if DISTLOCK_HAS_MYSQL
#include "mysql/my_segment.hpp"
#endif
#endif

namespace distlock::detail {

// One row per scheme: how it is written, what it is, the query keys it accepts (with
// their meaning for this scheme) and its factory. connect() checks a URL's query
// against its row (core/url_keys.cpp) before the factory sees it.
namespace {

using namespace std::chrono_literals;
using T = QueryType;

// timeout= is read by the core for every scheme (connect and command timeout); a scheme
// that gives it another meaning as well says so in its own row.
constexpr QueryKey kTimeout{"timeout", T::duration,
                            "time to connect and for each request, before a server counts as "
                            "unavailable (ClientOptions::connect_timeout and command_timeout)",
                            "2s"};

#if DISTLOCK_HAS_FILE
constexpr QueryKey kFileKeys[] = {
    {"recheck", T::duration,
     "how often a waiter re-checks a lock besides the inotify notification (a missed event costs at "
     "most this)",
     "1s"},
    {"sync", T::flag, "fsync token files, so tokens stay increasing across a power loss", "false"},
    {"timeout", T::duration, "accepted for uniformity; the file backend does no network I/O", "2s"},
};
#endif
#if DISTLOCK_HAS_REDIS
constexpr QueryKey kRedisKeys[] = {
    {"prefix", T::text, "start of every key and channel; 1-256 bytes without '{' or '}'", "distlock"},
    kTimeout,
    {"cacert", T::file, "PEM file of the CA that signed the server's certificate", "", "", true},
    {"cert", T::file, "PEM client certificate (needs key=)", "", "", true},
    {"key", T::file, "PEM private key of cert=", "", "", true},
};
constexpr QueryKey kSentinelKeys[] = {
    {"prefix", T::text, "start of every key and channel; 1-256 bytes without '{' or '}'", "distlock"},
    kTimeout,
    {"wait", T::count, "after acquiring, WAIT until this many replicas have the lock", "0", "", false, 1h,
     100},
    {"wait_timeout", T::duration, "how long the WAIT of wait= may take; below the command timeout",
     "min(1s, timeout/2)"},
};
#endif
#if DISTLOCK_HAS_REDISCLUSTER
constexpr QueryKey kClusterKeys[] = {
    {"prefix", T::text, "start of every key and channel; 1-256 bytes without '{' or '}'", "distlock"},
    kTimeout,
    {"nat", T::text,
     "ANNOUNCED_HOST:PORT=REACHABLE_HOST:PORT[,...]: nodes that announce addresses this client cannot "
     "reach directly"},
};
#endif
#if DISTLOCK_HAS_REDLOCK
constexpr QueryKey kRedlockKeys[] = {
    {"prefix", T::text, "start of every key and channel on every master", "distlock:redlock:"},
    {"timeout", T::duration,
     "per-master time for each request (a master slower than this does not count towards the "
     "quorum); also the connect and command timeout",
     "min(50ms, ttl/10)"},
    {"cacert", T::file, "PEM file of the CA that signed the masters' certificates", "", "", true},
    {"cert", T::file, "PEM client certificate (needs key=)", "", "", true},
    {"key", T::file, "PEM private key of cert=", "", "", true},
};
#endif
#if DISTLOCK_HAS_ETCD
constexpr QueryKey kEtcdKeys[] = {
    {"prefix", T::text, "key prefix of every lock and record (a trailing '/' is dropped)", "distlock"},
    kTimeout,
    {"tls", T::flag, "TLS to the endpoints (implied by cacert, cert or key)", "false"},
    {"cacert", T::file, "PEM file of the CA that signed the endpoints' certificates"},
    {"cert", T::file, "PEM client certificate (needs key=)"},
    {"key", T::file, "PEM private key of cert="},
};
#endif
#if DISTLOCK_HAS_ZK
constexpr QueryKey kZkKeys[] = {
    kTimeout,
    {"session_timeout", T::duration,
     "the ZooKeeper session timeout; every lock of the client is lost when the session expires",
     "the lock ttl", "", false, 24h},
};
#endif
#if DISTLOCK_HAS_POSTGRES
constexpr QueryKey kPostgresKeys[] = {
    kTimeout,
    {"sslmode", T::choice, "libpq's sslmode", "libpq's (prefer)",
     "disable|allow|prefer|require|verify-ca|verify-full"},
};
#endif
#if DISTLOCK_HAS_MYSQL
constexpr QueryKey kMysqlKeys[] = {kTimeout};
#endif
constexpr QueryKey kMemoryKeys[] = {kTimeout};

constexpr Scheme kSchemes[] = {
#if DISTLOCK_HAS_FILE
    {"file", "file:///absolute/dir", "this host only (kernel locks on files in the directory)", false, "",
     kFileKeys, &make_file_backend},
#endif
#if DISTLOCK_HAS_REDIS
    {"redis", "redis://[user:password@]host[:port][/db]", "one Redis server", false, "rediss", kRedisKeys,
     &make_redis_backend},
    {"rediss", "rediss://[user:password@]host[:port][/db]", "one Redis server over TLS", true, "", kRedisKeys,
     &make_redis_backend},
    {"redis+sentinel", "redis+sentinel://[user:password@]host[:port][,host[:port]...]/master-name",
     "the master a group of Redis Sentinels names, followed across failovers", false, "", kSentinelKeys,
     &make_sentinel_backend},
#endif
#if DISTLOCK_HAS_REDISCLUSTER
    {"redis+cluster", "redis+cluster://[user:password@]host[:port][,host[:port]...]",
     "a Redis Cluster (each lock on the node serving its slot)", false, "", kClusterKeys,
     &make_redis_cluster_backend},
#endif
#if DISTLOCK_HAS_REDLOCK
    {"redlock", "redlock://[user:password@]host:port,host:port,host:port[,...]",
     "Redlock: a quorum of independent Redis masters", false, "redlocks", kRedlockKeys,
     &make_redlock_backend},
    {"redlocks", "redlocks://[user:password@]host:port,host:port,host:port[,...]",
     "Redlock over TLS to every master", true, "", kRedlockKeys, &make_redlock_backend},
#endif
#if DISTLOCK_HAS_ETCD
    {"etcd", "etcd://[user:password@]host[:port][,host[:port]...]", "an etcd v3 cluster (over gRPC)", false,
     "", kEtcdKeys, &make_etcd_backend},
#endif
#if DISTLOCK_HAS_ZK
    {"zk", "zk://[user:password@]host[:port][,host[:port]...][/chroot]", "a ZooKeeper ensemble", false, "",
     kZkKeys, &make_zk_backend},
#endif
#if DISTLOCK_HAS_POSTGRES
    {"postgres", "postgres://[user:password@]host[:port]/database", "one PostgreSQL primary", false, "",
     kPostgresKeys, &make_postgres_backend},
    {"postgresql", "postgresql://[user:password@]host[:port]/database", "the same as postgres://", false, "",
     kPostgresKeys, &make_postgres_backend},
#endif
#if DISTLOCK_HAS_MYSQL
    {"mysql", "mysql://[user:password@]host[:port]/database", "one MySQL or MariaDB primary", false, "",
     kMysqlKeys, &make_mysql_backend},
#endif
    {"memory", "memory://store", "an in-process store, for tests", false, "", kMemoryKeys,
     &make_memory_backend},
};
}  // namespace

std::span<const Scheme> all_schemes() noexcept {
  return kSchemes;
}

bool record_value_fits(std::string_view key, std::string_view value, Error& ec) {
  if (value.size() <= kMaxRecordValue) return true;
  std::string shown;
  for (char c : key.substr(0, 200)) shown += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  ec.fail(errc::invalid_argument, "record \"" + shown + "\": a value of " + std::to_string(value.size()) +
                                      " bytes is larger than the limit of " +
                                      std::to_string(kMaxRecordValue) + " bytes (64 KiB)");
  return false;
}

BackendFactory find_backend(std::string_view scheme) {
  const Scheme* s = find_scheme(scheme);
  return s ? s->factory : nullptr;
}

std::string known_schemes() {
  std::string out;
  for (const auto& s : kSchemes) {
    if (!out.empty()) out += ", ";
    out += s.name;
  }
  return out;
}

#if DISTLOCK_HAS_IDS
// Segment ids (ids/segment_source.hpp): one row per database scheme that has a source.
namespace {
struct SegmentScheme {
  std::string_view name;
  ids::detail::SegmentSourceFactory factory;
};
constexpr SegmentScheme kSegmentSchemes[] = {
#if DISTLOCK_HAS_POSTGRES
    {"postgres", &pg::make_segment_source},
    {"postgresql", &pg::make_segment_source},
#endif
#if DISTLOCK_HAS_MYSQL
    {"mysql", &my::make_segment_source},
#endif
    {"", nullptr},
};
}  // namespace

ids::detail::SegmentSourceFactory find_segment_source(std::string_view scheme) noexcept {
  for (const auto& s : kSegmentSchemes) {
    if (s.factory && s.name == scheme) return s.factory;
  }
  return nullptr;
}

std::string segment_schemes() {
  std::string out;
  for (const auto& s : kSegmentSchemes) {
    if (!s.factory) continue;
    if (!out.empty()) out += ", ";
    out += std::string(s.name) + "://";
  }
  return out;
}
#endif

}  // namespace distlock::detail
