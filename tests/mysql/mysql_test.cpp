#include <gtest/gtest.h>

#include "distlock/distlock.hpp"
#include "support/mariadb_server.hpp"

TEST(Mysql, Smoke) {
  distlock::testing::MariadbServer server;
  auto c = distlock::connect(server.url());
  auto l = c.acquire("x");
  EXPECT_GT(l.token(), 0u);
}
