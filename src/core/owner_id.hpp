#pragma once

#include <cstddef>
#include <string>

namespace distlock::detail {

/// 128 bits from the OS CSPRNG (getrandom), as 32 lower-case hex digits.
std::string random_client_id();
/// Fills `buf` with `n` bytes from the OS CSPRNG. Throws std::system_error on failure.
void random_bytes(void* buf, std::size_t n);

}  // namespace distlock::detail
