#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace distlock::detail {

/// 128 bits from the OS CSPRNG (getrandom), as 32 lower-case hex digits.
std::string random_client_id();
/// Fills `buf` with `n` bytes from the OS CSPRNG. Throws std::system_error on failure.
void random_bytes(void* buf, std::size_t n);

/// How many times this process image has been forked into (0 in the original
/// process, +1 in each child at fork()). A client remembers the value it was made
/// under; a different value means it is being used in a child, whose connections,
/// owner identity and leases belong to the parent. A relaxed atomic load: no
/// syscall on the hot path. The pthread_atfork handler is installed on first call.
std::uint64_t fork_generation() noexcept;

}  // namespace distlock::detail
