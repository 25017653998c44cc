#include "fake/memory_scheme.hpp"

#include "fake/memory_backend.hpp"

namespace distlock::detail {

namespace {

constexpr QueryKey kMemoryKeys[] = {kTimeoutKey};

constexpr Scheme kSchemes[] = {
    {"memory", "memory://store", "an in-process store, for tests", false, "", kMemoryKeys,
     &make_memory_backend},
};
}  // namespace

std::span<const Scheme> memory_schemes() noexcept {
  return kSchemes;
}

}  // namespace distlock::detail
