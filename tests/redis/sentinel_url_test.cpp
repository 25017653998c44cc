// redis+sentinel:// URL errors: each malformed part has its own message, and no
// message ever contains the password. No server is needed for these.
#include <gtest/gtest.h>

#include <string>

#include "distlock/distlock.hpp"
#include "support/process.hpp"
#include "support/redis_probes.hpp"

namespace {

using distlock::errc;

using distlock::testing::connect_outcome;

void expect_error(const std::string& url, errc code, const std::string& says) {
  SCOPED_TRACE(url);
  auto [ec, what] = connect_outcome(url);
  EXPECT_EQ(ec, code) << what;
  EXPECT_NE(what.find(says), std::string::npos) << what;
  EXPECT_EQ(what.find("s3cr3t"), std::string::npos) << "the password is in the message: " << what;
}

TEST(SentinelUrl, EachMalformedPartHasItsOwnError) {
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1:26379", errc::invalid_url, "names no master");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1:26379/", errc::invalid_url, "names no master");
  expect_error("redis+sentinel://:s3cr3t@/mymaster", errc::invalid_url, "names no sentinel");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1:1,,127.0.0.1:2/mymaster", errc::invalid_url, "empty host");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1:99999/mymaster", errc::invalid_url, "out of range");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1/a/b", errc::invalid_url, "contains '/'");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1/m?wait=x", errc::invalid_url, "wait \"x\"");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1/m?wait=-1", errc::invalid_url,
               "not a whole number in 0-100");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1/m?wait=101", errc::invalid_url,
               "not a whole number in 0-100");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1/m?wait_timeout=1s", errc::invalid_url, "needs wait=N");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1/m?wait=1&wait_timeout=0", errc::invalid_url,
               "not a positive duration");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1/m?wait=1&wait_timeout=5s", errc::invalid_url,
               "shorter than the command timeout");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1/m?db=2", errc::invalid_url,
               "unknown query parameter \"db\"");
  expect_error("redis+sentinel://:s3cr3t@127.0.0.1/m?prefix=a{b", errc::invalid_url, "prefix");
  expect_error("redis+sentinel://alice@127.0.0.1/m", errc::invalid_url, "names a user but no password");
}

TEST(SentinelUrl, NoSentinelAnsweringIsUnavailableAndNamesThemAll) {
  const auto a = distlock::testing::free_port();
  const auto b = distlock::testing::free_port();
  const std::string url = "redis+sentinel://bob:s3cr3t@127.0.0.1:" + std::to_string(a) +
                          ",127.0.0.1:" + std::to_string(b) + "/mymaster?timeout=500ms";
  auto [ec, what] = connect_outcome(url);
  EXPECT_EQ(ec, errc::backend_unavailable) << what;
  EXPECT_NE(what.find("sentinel"), std::string::npos) << what;
  EXPECT_NE(what.find(std::to_string(a)), std::string::npos) << what;
  EXPECT_NE(what.find(std::to_string(b)), std::string::npos) << what;
  EXPECT_EQ(what.find("s3cr3t"), std::string::npos) << what;
}

}  // namespace
