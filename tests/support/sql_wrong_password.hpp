// Test support: the wrong-password case of the SQL backends (mysql://, postgres://), written once
// for their server harnesses (support/sql_account_server.hpp): a connect with another password
// than the account's is refused as auth_failed, and its message names the user but neither the
// password given nor the right one.
//
// Thread-safety: as the server harness (one thread).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "distlock/distlock.hpp"
#include "support/sql_lock_cases.hpp"

namespace distlock::testing {

/// Connects to `server` with the password `wrong` and checks the refusal; returns its message
/// for the checks a backend adds.
template <class Server>
std::string expect_wrong_password_refused(const Server& server, const std::string& wrong) {
  const auto e = connect_error(server.url_with_password(wrong));
  EXPECT_EQ(e.code(), errc::auth_failed) << e.what();
  const std::string what = e.what();
  EXPECT_NE(what.find(Server::kUser), std::string::npos) << "the message names the user: " << what;
  EXPECT_EQ(what.find(wrong), std::string::npos) << what;
  EXPECT_EQ(what.find(Server::kPassword), std::string::npos) << what;
  return what;
}

}  // namespace distlock::testing
