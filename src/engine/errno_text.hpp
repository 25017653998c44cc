// errno_text: the message of an errno value, safe to call from any thread.
//
// std::strerror may return a buffer shared between threads (POSIX marks it MT-Unsafe);
// std::system_category().message() is built on strerror_r in libstdc++, so every library
// thread (renewers, keepers, notifiers) can name an errno in its messages.
//
// Example:
//   why = "socket: " + errno_text(errno);
#pragma once

#include <string>
#include <system_error>

namespace distlock::detail {

inline std::string errno_text(int err) {
  return std::system_category().message(err);
}

}  // namespace distlock::detail
