// What the server harnesses (redis_server, redis_sentinel, database_server and its PostgreSQL
// and MariaDB servers, tests/zk/zk_server) share when they set a server up: failing the test
// with a message that names the problem, and reading a server's log for that message.
// Thread-safety: each call uses only its arguments.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace distlock::testing {

/// Fails the running test with `msg` and throws std::runtime_error(msg): a harness whose server
/// cannot be set up (in CI a missing server is a failure, never a skip).
[[noreturn]] inline void fail_setup(const std::string& msg) {
  ADD_FAILURE() << msg;
  throw std::runtime_error(msg);
}

/// The whole text of the file at `path` ("" when it cannot be read): a server's log.
inline std::string file_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace distlock::testing
