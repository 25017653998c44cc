// redis/socket_impl.hpp — private to socket.cpp (I/O on a connected Socket) and
// socket_connect.cpp (opening one): the helpers both use. Not for use outside src/redis.
#pragma once

#include <string>

#include "redis/socket.hpp"

namespace distlock::detail::redis {

/// Milliseconds from now to `deadline` for poll(): 0 when past, at most 60 s.
int poll_ms(Socket::Clock::time_point deadline);
/// OpenSSL's queued errors as one line (and the queue emptied).
std::string ssl_errors();

}  // namespace distlock::detail::redis
