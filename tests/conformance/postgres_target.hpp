// The conformance suite's postgres:// target: a PostgreSQL server started by the
// test (tests/support/postgres_server.hpp). A template over the suite's Target base
// class so that it does not depend on where that class is defined.
//
// Left on the server after every client is gone: advisory locks, lock rows still
// naming an owner, and sessions of distlock clients (lease sessions and LISTEN
// connections). The token rows themselves stay by design: tokens never go back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/postgres_server.hpp"

namespace distlock::testing {

template <class Base>
class PostgresTarget final : public Base {
 public:
  std::string url() override { return server_.url(); }
  std::vector<std::uint16_t> ports() override { return {server_.port()}; }
  std::string url_via(const std::string& hosts) override {
    return std::string("postgres://") + PostgresServer::kUser + ":" + PostgresServer::kPassword + "@" +
           hosts + "/postgres";
  }
  std::vector<std::string> leftovers() override {
    std::vector<std::string> out;
    for (const auto& r :
         server_.query("SELECT pid, classid, objid FROM pg_locks WHERE locktype = 'advisory'")) {
      out.push_back("advisory lock " + r[1] + "/" + r[2] + " of backend " + r[0]);
    }
    if (server_.query("SELECT to_regclass('distlock_locks') IS NOT NULL")[0][0] == "t") {
      for (const auto& r : server_.query("SELECT encode(substr(name, 1, 40), 'escape'), owner FROM "
                                         "distlock_locks WHERE owner IS NOT NULL")) {
        out.push_back("row " + r[0] + " owned by " + r[1]);
      }
    }
    for (const auto& r : server_.query(
             "SELECT application_name, pid FROM pg_stat_activity WHERE application_name LIKE 'distlock%'")) {
      out.push_back("session " + r[0] + " (backend " + r[1] + ")");
    }
    return out;
  }

 private:
  PostgresServer server_;
};

}  // namespace distlock::testing
