// The file backend's URL scheme: this folder's entry in the scheme registry (src/connect/registry.cpp): how
// its URLs are written, the query keys they accept and the factory. The one header of
// this folder that src/connect/ includes.
#pragma once

#include <span>

#include "engine/scheme.hpp"

namespace distlock::detail {

/// This folder's schemes: file://.
std::span<const Scheme> file_schemes() noexcept;

}  // namespace distlock::detail
