// URL and duration parsing, and connect()'s errors for malformed URLs.
#include "engine/url.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/thrown.hpp"

using distlock::errc;
using distlock::detail::parse_url;
using distlock::detail::Url;
using distlock::testing::code_of;

namespace {

TEST(Url, ParsesAllParts) {
  Url u;
  distlock::detail::Error err;
  ASSERT_FALSE(err = parse_url("redis://bob:p%40ss@127.0.0.1:6380/2?prefix=app&timeout=500ms", u))
      << err.detail();
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
  distlock::detail::Error err;
  ASSERT_FALSE(err = parse_url("redlock://a:1,b:2,[::1]:3", u)) << err.detail();
  ASSERT_EQ(u.hosts.size(), 3u);
  EXPECT_EQ(u.hosts[2].host, "::1");
  EXPECT_EQ(u.hosts[2].port, 3);
  ASSERT_FALSE(err = parse_url("file:///var/lib/locks", u)) << err.detail();
  EXPECT_TRUE(u.hosts.empty());
  EXPECT_EQ(u.path, "/var/lib/locks");
  ASSERT_FALSE(err = parse_url("zk://h:2181/chroot/x", u)) << err.detail();
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
    distlock::detail::Error err;
    EXPECT_EQ(err = parse_url(c.url, u), errc::invalid_url) << c.url;
    EXPECT_NE(err.detail().find(c.needle), std::string::npos) << c.url << " -> " << err.detail();
  }
}

// Every error path of the parser, each URL carrying a recognisable password (plain,
// percent-encoded, or containing the characters the parser splits at): no fragment of
// the password may appear in the message. "hunter2" is the password; "hun" and "er2"
// catch any part of it, encoded ("hun%74er2") or not.
TEST(Url, NoParseErrorMessageContainsThePassword) {
  const char* cases[] = {
      "u:hunter2@h:1",                 // no scheme
      "://u:hunter2@h",                // empty scheme
      "re dis://u:hunter2@h",          // malformed scheme
      "redis://u:hunter2@h?x=%zz",     // bad %-escape in the query
      "redis://u:hunter2@h?=x",        // query parameter without a name
      "redis://u:hun?ter2@h",          // '?' in the password: the rest parses as a query
      "redis://u:hun?ter2%zz@h",       // ... with a bad escape in that "query"
      "redis://u:hunter2@h/%zz",       // bad %-escape in the path
      "redis://u:hun/ter2%zz@h",       // '/' in the password: the rest parses as a path
      "redis://u:hun/ter2@h",          // ... and the user info as the host "u:hun"
      "redis://u:hunter2%zz@h",        // bad %-escape in the password
      "redis://u:hun%74er2%g@h",       // encoded password, bad escape at its end
      "redis://u%zz:hunter2@h",        // bad %-escape in the user
      "redis://:hun%74er2%@h",         // truncated escape
      "redlock://u:hunter2@a:1,,b:2",  // empty host in the list
      "redis://u:hunter2@[::1:6379",   // IPv6 without ']'
      "redis://u:hunter2@[::1]x",      // garbage after the IPv6 host
      "redis://u:hunter2@h:1:2",       // several ':'
      "redis://u:hunter2@:6379",       // empty host name
      "redis://u:hunter2@h%zz/0",      // bad character in the host
      "redis://u:hunter2@h:abc",       // port not a number
      "redis://u:hunter2@h:",          // empty port
      "redis://u:hunter2@h:99999",     // port out of range
      "redis://:hunter2@p@h:99999",    // '@' in the password (the last '@' ends it)
      "redis://:hun@ter2@h:0",         // '@' in the middle of the password
      "redis://:hun:ter2@h:abc",       // ':' in the password
      "redis://u:hun,ter2@h:abc",      // ',' in the password
      "redis://u:hun[ter2@h:abc",      // '[' in the password
  };
  for (const char* text : cases) {
    Url u;
    distlock::detail::Error err;
    EXPECT_EQ(err = parse_url(text, u), errc::invalid_url) << text;
    EXPECT_FALSE(err.detail().empty()) << text;
    EXPECT_EQ(err.detail().find("hun"), std::string::npos) << text << " -> " << err.detail();
    EXPECT_EQ(err.detail().find("er2"), std::string::npos) << text << " -> " << err.detail();
  }
}

TEST(Url, RedactedMasksWhatTheParserTookAsThePasswordAndAnyTextAnUnencodedAtPushedOn) {
  struct Case {
    const char* url;
    const char* password;
    const char* shown;
  } cases[] = {
      {"redis://:p@ss@h", "p@ss", "redis://:***@h"},
      {"redis://u:a@b@c@h:1/0", "a@b@c", "redis://u:***@h:1/0"},
      {"redis://u:p%40ss@h", "p@ss", "redis://u:***@h"},
      // Masked through the last '@': the same text is a password "pw@h/0?prefix=a" written
      // unencoded, and the query would then hold the rest of it.
      {"redis://u:pw@h/0?prefix=a@b", "pw", "redis://u:***@b"},
      {"redis://u:pa:ss@h", "pa:ss", "redis://u:***@h"},
      // An '@' before the first ':': that ':' may be a port's ("PASSWORD@host:1/x@y"), so
      // everything up to the last '@' is masked.
      {"redis://u@x:pw@h", "pw", "redis://***@h"},
      {"redis://h:1", "", "redis://h:1"},
      {"redis://u:@h", "", "redis://u:@h"},
  };
  for (const auto& c : cases) {
    Url u;
    distlock::detail::Error err;
    ASSERT_FALSE(err = parse_url(c.url, u)) << c.url << ": " << err.detail();
    EXPECT_EQ(u.password, c.password) << c.url;
    EXPECT_EQ(u.redacted(), c.shown) << c.url;
  }
  // User info without ':' is shown masked: some users write redis://PASSWORD@host.
  Url u;
  distlock::detail::Error err;
  ASSERT_FALSE(err = parse_url("redis://s3cret@h", u)) << err.detail();
  EXPECT_EQ(u.redacted(), "redis://***@h");
}

TEST(Url, PasswordCanBeReplacedOrRemoved) {
  using distlock::detail::url_with_password;
  using distlock::detail::url_without_password;
  std::string out;
  distlock::detail::Error err;
  ASSERT_FALSE(err = url_with_password("redis://h:1/0", "p@ss:/?#%w", out)) << err.detail();
  Url u;
  ASSERT_FALSE(err = parse_url(out, u)) << err.detail();
  EXPECT_EQ(u.password, "p@ss:/?#%w");
  EXPECT_EQ(u.user, "");
  EXPECT_EQ(u.path, "/0");
  ASSERT_FALSE(err = url_with_password("redis://bob:old@h:1", "new", out)) << err.detail();
  EXPECT_EQ(out, "redis://bob:new@h:1");
  ASSERT_FALSE(err = url_with_password("redis://bob@h:1", "new", out)) << err.detail();
  EXPECT_EQ(out, "redis://bob:new@h:1");
  // A URL that does not parse is refused without quoting the password.
  EXPECT_EQ(err = url_with_password("redis://u:hunter2@h:x", "new", out), errc::invalid_url);
  EXPECT_EQ(err.detail().find("hunter2"), std::string::npos) << err.detail();

  ASSERT_FALSE(err = url_without_password("redis://bob:p@ss@h:1/0?prefix=a@b", out)) << err.detail();
  EXPECT_EQ(out, "redis://bob@h:1/0?prefix=a@b");
  ASSERT_FALSE(err = url_without_password("redis://:p%40ss@h", out)) << err.detail();
  EXPECT_EQ(out, "redis://h");
  ASSERT_FALSE(err = url_without_password("file:///tmp/x", out)) << err.detail();
  EXPECT_EQ(out, "file:///tmp/x");
}

TEST(Connect, NoErrorOrLogLineContainsThePassword) {
  std::vector<std::string> lines;
  distlock::ClientOptions opts;
  opts.logger = [&lines](distlock::LogLevel, std::string_view m) { lines.emplace_back(m); };
  const char* cases[] = {
      "mongo://u:hunter2@h:1",              // unknown scheme
      "memory://u:hunter2@x?timeout=soon",  // bad common query value
      "memory://u:hun%74er2@x?timeout=0",   // ... with an encoded password
      "file://u:hunter2@/tmp/x",            // user info where none is allowed
      "redis://:hunter2@h:1:2",             // parse error
      "redis://:hun?ter2@h",                // password split by '?'
  };
  for (const char* text : cases) {
    try {
      distlock::connect(text, opts);
      ADD_FAILURE() << text;
    } catch (const std::system_error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find("hun"), std::string::npos) << text << " -> " << what;
      EXPECT_EQ(what.find("er2"), std::string::npos) << text << " -> " << what;
    }
  }
  for (const auto& l : lines) {
    EXPECT_EQ(l.find("hun"), std::string::npos) << l;
    EXPECT_EQ(l.find("er2"), std::string::npos) << l;
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

// The public text helpers (distlock/text.hpp) apply the library's own rules and messages.
TEST(Text, ValidateNameNamesTheProblem) {
  std::string why;
  EXPECT_FALSE(distlock::validate_name("orders/42 é", why)) << why;
  EXPECT_EQ(distlock::validate_name("", why), errc::invalid_argument);
  EXPECT_EQ(why, "lock name is empty");
  EXPECT_EQ(distlock::validate_name(std::string(4097, 'x'), why), errc::invalid_argument);
  EXPECT_NE(why.find("4097 bytes long; the limit is 4096"), std::string::npos) << why;
  EXPECT_EQ(distlock::validate_name(std::string("a\0b", 3), why), errc::invalid_argument);
  EXPECT_NE(why.find("NUL"), std::string::npos) << why;
  std::string what;
  EXPECT_EQ(code_of([] { distlock::validate_name(""); }, &what), errc::invalid_argument);
  EXPECT_NE(what.find("lock name is empty"), std::string::npos) << what;
}

TEST(Text, ParseDurationAndUrls) {
  EXPECT_EQ(distlock::parse_duration("2m"), distlock::Millis(120000));
  EXPECT_EQ(distlock::parse_duration("1500"), distlock::Millis(1500));
  EXPECT_EQ(distlock::parse_duration("1.5s"), std::nullopt);
  EXPECT_EQ(distlock::parse_duration("-1s"), std::nullopt);
  EXPECT_EQ(distlock::url_scheme("redis://h:1"), "redis");
  const std::string with = distlock::url_with_password("redis://bob@h:1/0", "p@ss word");
  EXPECT_EQ(with, "redis://bob:p%40ss%20word@h:1/0");
  EXPECT_EQ(distlock::url_without_password(with), "redis://bob@h:1/0");
  const std::string masked = distlock::redact_url("redis://:hunter2@h:1");
  EXPECT_EQ(masked.find("hunter2"), std::string::npos) << masked;
  std::string what;
  EXPECT_EQ(code_of([] { (void)distlock::url_scheme("redis://:hunter2@h:99999"); }, &what),
            errc::invalid_url);
  EXPECT_EQ(what.find("hunter2"), std::string::npos) << what;
  EXPECT_NE(what.find("99999"), std::string::npos) << what;
}

TEST(Connect, UnknownSchemeAndBadTimeoutAreInvalidUrl) {
  std::string what;
  EXPECT_EQ(code_of([] { (void)distlock::connect("mongo://h:1"); }, &what), errc::invalid_url);
  EXPECT_NE(what.find("unknown scheme \"mongo\""), std::string::npos) << what;
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
