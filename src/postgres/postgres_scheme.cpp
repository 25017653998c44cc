#include "postgres/postgres_scheme.hpp"

#include "postgres/postgres_backend.hpp"

namespace distlock::detail {

namespace {
using T = QueryType;

constexpr QueryKey kPostgresKeys[] = {
    kTimeoutKey,
    {"sslmode", T::choice, "libpq's sslmode", "libpq's (prefer)",
     "disable|allow|prefer|require|verify-ca|verify-full"},
};

constexpr Scheme kSchemes[] = {
    {"postgres", "postgres://[user:password@]host[:port]/database", "one PostgreSQL primary", false, "",
     kPostgresKeys, &make_postgres_backend},
    {"postgresql", "postgresql://[user:password@]host[:port]/database", "the same as postgres://", false, "",
     kPostgresKeys, &make_postgres_backend},
};
}  // namespace

std::span<const Scheme> postgres_schemes() noexcept {
  return kSchemes;
}

}  // namespace distlock::detail
