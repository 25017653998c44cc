// The in-process test store's URL scheme: this folder's entry in the scheme registry
// (src/connect/registry.cpp): how its URLs are written, the query keys they accept and the factory. The one
// header of this folder that src/connect/ includes.
#pragma once

#include <span>

#include "engine/scheme.hpp"

namespace distlock::detail {

/// This folder's schemes: memory://.
std::span<const Scheme> memory_schemes() noexcept;

}  // namespace distlock::detail
