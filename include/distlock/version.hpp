// distlock/version.hpp — library version.
#pragma once

namespace distlock {
inline constexpr const char* kVersion = "0.1.0";
}  // namespace distlock
