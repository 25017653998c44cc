// What the server harnesses (redis_server, redis_sentinel, database_server and its PostgreSQL
// and MariaDB servers, tests/zk/zk_server) share when they set a server up: failing the test
// with a message that names the problem (a program that is not installed), reading a server's
// log for that message, and installing a fresh data directory as the template later servers
// copy.
// Thread-safety: each call uses only its arguments.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "support/process.hpp"

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

/// fail_setup unless `program` is installed: "<program> is not installed (it is required for the
/// <tests>): run scripts/bootstrap.sh or apt-get install <package>".
inline void require_program(const std::string& program, const std::string& tests,
                            const std::string& package) {
  if (!have_program(program)) {
    fail_setup(program + " is not installed (it is required for the " + tests +
               "): run scripts/bootstrap.sh or apt-get install " + package);
  }
}

/// Moves the freshly initialised data directory `fresh` to `tmpl`/data, replacing what was
/// there: "" or the error, naming `what` and `tmpl`.
inline std::string install_template(const std::string& fresh, const std::string& tmpl,
                                    const std::string& what) {
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  std::filesystem::create_directory(tmpl, ec);
  std::filesystem::rename(fresh, tmpl + "/data", ec);
  return ec ? "cannot move the " + what + " to " + tmpl + ": " + ec.message() : std::string();
}

}  // namespace distlock::testing
