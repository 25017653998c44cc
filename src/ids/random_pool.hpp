// Bytes from the OS CSPRNG (getrandom), fetched a page at a time: one system call per
// 4 KiB instead of one per id. A pool drawn before fork() is discarded in the child, so a
// parent and its child never hand out the same bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace distlock::ids::detail {

/// Counts fork()s in this process's ancestry as seen from it: a child sees a different
/// value than its parent had (the library's one pthread_atfork handler,
/// engine/owner_id.hpp). One relaxed load.
std::uint64_t fork_generation();

class RandomPool {
 public:
  /// Copies `n` (<= 64) fresh random bytes into `out`. Not thread-safe: one pool per owner
  /// (the generators call it under their mutex).
  void fill(std::uint8_t* out, std::size_t n);

 private:
  std::array<std::uint8_t, 4096> buf_{};
  std::size_t used_ = buf_.size();  // empty until first use
  std::uint64_t fork_generation_ = 0;
};

}  // namespace distlock::ids::detail
