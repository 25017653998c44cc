#include "redlock/redlock_scheme.hpp"

#include "redlock/redlock_backend.hpp"

namespace distlock::detail {

namespace {
using T = QueryType;

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

constexpr Scheme kSchemes[] = {
    {"redlock", "redlock://[user:password@]host:port,host:port,host:port[,...]",
     "Redlock: a quorum of independent Redis masters", false, "redlocks", kRedlockKeys,
     &make_redlock_backend},
    {"redlocks", "redlocks://[user:password@]host:port,host:port,host:port[,...]",
     "Redlock over TLS to every master", true, "", kRedlockKeys, &make_redlock_backend},
};
}  // namespace

std::span<const Scheme> redlock_schemes() noexcept {
  return kSchemes;
}

}  // namespace distlock::detail
