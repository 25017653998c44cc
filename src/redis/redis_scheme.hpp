// The single-Redis and Sentinel URL schemes: this folder's entry in the scheme registry
// (src/connect/registry.cpp): how its URLs are written, the query keys they accept and the factory. The one
// header of this folder that src/connect/ includes.
#pragma once

#include <span>

#include "engine/scheme.hpp"

namespace distlock::detail {

/// This folder's schemes: redis://, rediss:// and redis+sentinel://.
std::span<const Scheme> redis_schemes() noexcept;

}  // namespace distlock::detail
