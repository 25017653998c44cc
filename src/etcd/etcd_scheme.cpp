#include "etcd/etcd_scheme.hpp"

#include "etcd/etcd_backend.hpp"

namespace distlock::detail {

namespace {
using T = QueryType;

constexpr QueryKey kEtcdKeys[] = {
    {"prefix", T::text, "key prefix of every lock and record (a trailing '/' is dropped)", "distlock"},
    kTimeoutKey,
    {"tls", T::flag, "TLS to the endpoints (implied by cacert, cert or key)", "false"},
    {"cacert", T::file, "PEM file of the CA that signed the endpoints' certificates"},
    {"cert", T::file, "PEM client certificate (needs key=)"},
    {"key", T::file, "PEM private key of cert="},
};

constexpr Scheme kSchemes[] = {
    {"etcd", "etcd://[user:password@]host[:port][,host[:port]...]", "an etcd v3 cluster (over gRPC)", false,
     "", kEtcdKeys, &make_etcd_backend},
};
}  // namespace

std::span<const Scheme> etcd_schemes() noexcept {
  return kSchemes;
}

}  // namespace distlock::detail
