// URL and duration parsing, and connect()'s errors for malformed URLs.
#include "core/url.hpp"

#include <gtest/gtest.h>

#include "distlock/distlock.hpp"

using distlock::errc;
using distlock::detail::parse_url;
using distlock::detail::Url;

namespace {

TEST(Url, ParsesAllParts) {
  Url u;
  std::string why;
  ASSERT_FALSE(parse_url("redis://bob:p%40ss@127.0.0.1:6380/2?prefix=app&timeout=500ms", u, why)) << why;
  EXPECT_EQ(u.scheme, "redis");
  EXPECT_EQ(u.user, "bob");
  EXPECT_EQ(u.password, "p@ss");
  ASSERT_EQ(u.hosts.size(), 1u);
  EXPECT_EQ(u.hosts[0].host, "127.0.0.1");
  EXPECT_EQ(u.hosts[0].port, 6380);
  EXPECT_EQ(u.path, "/2");
  EXPECT_EQ(u.query_or("prefix", ""), "app");
  EXPECT_EQ(u.redacted(), "redis://bob:***@127.0.0.1:6380/2?prefix=app&timeout=500ms");
}

TEST(Url, ParsesHostListsIpv6AndFilePaths) {
  Url u;
  std::string why;
  ASSERT_FALSE(parse_url("redlock://a:1,b:2,[::1]:3", u, why)) << why;
  ASSERT_EQ(u.hosts.size(), 3u);
  EXPECT_EQ(u.hosts[2].host, "::1");
  EXPECT_EQ(u.hosts[2].port, 3);
  ASSERT_FALSE(parse_url("file:///var/lib/locks", u, why)) << why;
  EXPECT_TRUE(u.hosts.empty());
  EXPECT_EQ(u.path, "/var/lib/locks");
  ASSERT_FALSE(parse_url("zk://h:2181/chroot/x", u, why)) << why;
  EXPECT_EQ(u.path, "/chroot/x");
}

TEST(Url, MalformedUrlsNameTheOffendingPart) {
  struct Case {
    const char* url;
    const char* needle;
  } cases[] = {
      {"127.0.0.1:6379", "no scheme"},    {"://x", "no scheme"},
      {"re dis://h", "scheme"},           {"redis://h:99999", "out of range"},
      {"redis://h:0", "out of range"},    {"redis://h:abc", "not a number"},
      {"redis://h:", "not a number"},     {"redlock://a:1,,b:2", "empty host"},
      {"redis://[::1:6379", "lacks ']'"}, {"redis://h:1:2", "several ':'"},
      {"redis://h%zz/0", "contains"},     {"redis://h/%zz", "bad %-escape"},
      {"redis://h?=x", "no name"},
  };
  for (const auto& c : cases) {
    Url u;
    std::string why;
    EXPECT_EQ(parse_url(c.url, u, why), errc::invalid_url) << c.url;
    EXPECT_NE(why.find(c.needle), std::string::npos) << c.url << " -> " << why;
  }
}

TEST(Url, Durations) {
  distlock::Millis d{};
  EXPECT_TRUE(distlock::detail::parse_duration("250ms", d));
  EXPECT_EQ(d.count(), 250);
  EXPECT_TRUE(distlock::detail::parse_duration("10s", d));
  EXPECT_EQ(d.count(), 10000);
  EXPECT_TRUE(distlock::detail::parse_duration("2m", d));
  EXPECT_EQ(d.count(), 120000);
  EXPECT_TRUE(distlock::detail::parse_duration("1500", d));
  EXPECT_EQ(d.count(), 1500);
  for (const char* bad : {"", "s", "10x", "-1s", "1.5s", "10 s", "99999999999999h"}) {
    EXPECT_FALSE(distlock::detail::parse_duration(bad, d)) << bad;
  }
}

TEST(Connect, UnknownSchemeAndBadTimeoutAreInvalidUrl) {
  try {
    distlock::connect("mongo://h:1");
    ADD_FAILURE();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_url);
    EXPECT_NE(std::string(e.what()).find("unknown scheme \"mongo\""), std::string::npos) << e.what();
  }
  std::error_code ec;
  distlock::connect("memory://x?timeout=soon", {}, ec);
  EXPECT_EQ(ec, errc::invalid_url);
}

TEST(Connect, PasswordIsMaskedInUrl) {
  auto c = distlock::connect("memory://masked");
  EXPECT_EQ(c.scheme(), "memory");
  EXPECT_EQ(c.id().size(), 32u);
  auto other = distlock::connect("memory://masked");
  EXPECT_NE(c.id(), other.id()) << "each client has its own random id";
}

TEST(ErrorCategory, NamesAndConditions) {
  std::error_code ec = errc::timeout;
  EXPECT_STREQ(ec.category().name(), "distlock");
  EXPECT_EQ(ec, std::errc::timed_out);
  EXPECT_NE(std::error_code(errc::lost).message(), std::error_code(errc::not_owner).message());
}

}  // namespace
