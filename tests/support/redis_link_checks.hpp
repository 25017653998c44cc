// A check every transport of redis:// (a redis::Link: Connection, SharedConnection) passes the
// same way, for tests/redis/connection_test.cpp and tests/redis/shared_connection_test.cpp:
//
//   expect_error_reply_keeps_link(link, port)   an error reply is protocol_error naming the
//                                               server, and the link stays up for the next call
//
// Thread-safety: one call per link at a time; it uses only its arguments.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "redis/connection.hpp"

namespace distlock::testing {

/// `link` (to the server on 127.0.0.1:`port`) sends an unknown command: the call fails with
/// protocol_error, returns the server's ERR reply and names the server in its detail; the link
/// stays connected and the next call (PING) succeeds.
inline void expect_error_reply_keeps_link(detail::redis::Link& link, int port) {
  detail::Error ec;
  detail::redis::Reply r = link.command({"NOSUCHCOMMAND", "x"}, ec);
  EXPECT_EQ(ec, errc::protocol_error);
  ASSERT_TRUE(r);
  EXPECT_TRUE(detail::redis::is_error(r.get(), "ERR"));
  EXPECT_NE(ec.detail().find("redis 127.0.0.1:" + std::to_string(port)), std::string::npos) << ec.detail();
  r = link.command({"PING"}, ec);
  EXPECT_FALSE(ec) << ec.detail();
  EXPECT_TRUE(link.connected());
}

}  // namespace distlock::testing
