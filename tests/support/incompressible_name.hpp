// Test support: a lock name that does not compress (xorshift64 bytes in '!'..'z'), for tests
// of long names against a server's row and index limits. The same seed gives the same name.
//
// Thread-safety: a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace distlock::testing {

/// `length` printable bytes of xorshift64 from `seed` (not 0).
inline std::string incompressible_name(std::size_t length, std::uint64_t seed) {
  std::string name;
  name.reserve(length);
  std::uint64_t x = seed;
  for (std::size_t i = 0; i < length; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    name.push_back(static_cast<char>('!' + x % 90));
  }
  return name;
}

}  // namespace distlock::testing
