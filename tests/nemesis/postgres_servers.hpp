// The nemesis run's postgres:// servers: one PostgreSQL (tests/support/postgres_server.hpp)
// whose faults are SIGSTOP/SIGCONT of the whole server and SIGKILL + restart on the same
// data directory. A template over the run's Servers base class.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/postgres_server.hpp"

namespace distlock::testing {

template <class Base>
struct PostgresServers final : Base {
  std::vector<std::uint16_t> ports() override { return {server.port()}; }
  std::string url_via(const std::string& hosts) override {
    return std::string("postgres://") + PostgresServer::kUser + ":" + PostgresServer::kPassword + "@" +
           hosts + "/postgres";
  }
  void pause(int) override { server.pause(); }
  void resume(int) override { server.resume(); }
  void kill_and_restart(int) override {
    server.kill();
    server.restart();
  }
  PostgresServer server;
};

}  // namespace distlock::testing
