#include "mysql/mysql_scheme.hpp"

#include "mysql/mysql_backend.hpp"

namespace distlock::detail {

namespace {

constexpr QueryKey kMysqlKeys[] = {kTimeoutKey};

constexpr Scheme kSchemes[] = {
    {"mysql", "mysql://[user:password@]host[:port]/database", "one MySQL or MariaDB primary", false, "",
     kMysqlKeys, &make_mysql_backend},
};
}  // namespace

std::span<const Scheme> mysql_schemes() noexcept {
  return kSchemes;
}

}  // namespace distlock::detail
