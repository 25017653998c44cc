#include "engine/owner_id.hpp"

#include <pthread.h>
#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <system_error>

namespace distlock::detail {

void random_bytes(void* buf, std::size_t n) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "getrandom");
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

std::string random_client_id() {
  unsigned char bytes[16];
  random_bytes(bytes, sizeof bytes);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(32);
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

namespace {
std::atomic<std::uint64_t> g_fork_generation{0};
void on_fork_child() noexcept {
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
}
// Installed at load time, so a fork() before the first client exists is counted too.
const bool g_fork_handler_installed = [] { return ::pthread_atfork(nullptr, nullptr, on_fork_child) == 0; }();
}  // namespace

std::uint64_t fork_generation() noexcept {
  (void)g_fork_handler_installed;
  return g_fork_generation.load(std::memory_order_relaxed);
}

}  // namespace distlock::detail
