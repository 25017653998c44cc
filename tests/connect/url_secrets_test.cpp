// No message quotes any part of a URL's secret, however the URL was written: a
// password holding '@' followed by '/' or '?', '#', '%', written unencoded (so the
// parser's split differs from the writer's intent), a password written alone as the
// user, or a correctly encoded one. Every scheme of this build is connected to a
// closed loopback port (or refused before that, by the parser or the backend's
// factory) and the error's what() must not contain the secret. Servers that answer
// (wrong password, unknown role, unknown database) are in each backend's own tests
// (tests/postgres/postgres_secrets_test.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/url.hpp"
#include "support/client_options.hpp"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;

// Every secret below contains "SECRET"; hosts, paths and users of the tests do not.
struct Form {
  std::string scheme;
  std::string tail;  // after the authority (path, for the schemes that take one)
};

std::vector<std::string> passwords(std::uint16_t closed) {
  const std::string p = std::to_string(closed);
  return {
      "SECRETa@127.0.0.1:" + p + "/SECRETb",  // '@' then '/': the rest lands in the path
      "SECRETc@127.0.0.1:" + p + "?SECRETd",  // '@' then '?': the rest lands in the query
      "SECRETe?SECRETf",                      // '?' alone
      "SECRETg/SECRETh",                      // '/' alone
      "SECRETi#SECRETj",                      // '#'
      "SECRETk%SECRETl",                      // '%' not followed by two hex digits
      "SECRETm%40%2F%3F%23%25",               // correctly encoded "SECRETm@/?#%"
  };
}

std::vector<Form> forms() {
  return {{"redis", "/0"},       {"rediss", "/0"},       {"redis+sentinel", "/mymaster"},
          {"redis+cluster", ""}, {"redlock", ""},        {"etcd", ""},
          {"zk", "/app"},        {"postgres", "/appdb"}, {"postgresql", "/appdb"}};
}

std::string error_of(const std::string& url) {
  try {
    auto c = distlock::connect(url, distlock::testing::quiet(500ms));
    return "";  // nothing listens: a connect that succeeds is a failure of the test
  } catch (const std::system_error& e) {
    return e.what();
  }
}

TEST(UrlSecrets, NoBackendErrorQuotesAnyPartOfTheSecret) {
  const std::uint16_t closed = distlock::testing::free_port();
  const std::string host = "127.0.0.1:" + std::to_string(closed);
  int checked = 0;
  for (const auto& f : forms()) {
    std::vector<std::string> urls;
    for (const auto& pw : passwords(closed))
      urls.push_back(f.scheme + "://user1:" + pw + "@" + host + f.tail);
    urls.push_back(f.scheme + "://SECRETn@" + host + f.tail);  // a password written as the user
    urls.push_back(f.scheme + "://SECRETo@127.0.0.1:" + std::to_string(closed) + "/SECRETp@" + host + f.tail);
    for (const auto& url : urls) {
      const std::string what = error_of(url);
      EXPECT_FALSE(what.empty()) << url << ": connected to a closed port";
      EXPECT_EQ(what.find("SECRET"), std::string::npos) << url << "\n  said: " << what;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9 * 9);
}

TEST(UrlSecrets, RedactedMasksTextAnUnencodedAtPushedPastTheAuthority) {
  struct Case {
    std::string url, shown;
  };
  const std::vector<Case> cases = {
      {"postgres://u:P@ss/wordSECRET@h/db", "postgres://u:***@h/db"},
      {"redis://u:P@ss?wordSECRET@h/0", "redis://u:***@h/0"},
      {"redis://u:pw@h:1/0", "redis://u:***@h:1/0"},
      {"redis://SECRET@h/0", "redis://***@h/0"},
      {"redis://SECRET@h:1/0?prefix=a@b", "redis://***@b"},  // the ':' is the port's
      {"redis://u:@h/0", "redis://u:@h/0"},
      {"redis://h:6379/0", "redis://h:6379/0"},
  };
  for (const auto& c : cases) {
    distlock::detail::Url u;
    distlock::detail::Error err;
    ASSERT_FALSE(err = distlock::detail::parse_url(c.url, u)) << c.url << ": " << err.detail();
    EXPECT_EQ(u.redacted(), c.shown) << c.url;
  }
}

TEST(UrlSecrets, ScrubSecretsMasksEveryPieceAndTheLoneUser) {
  distlock::detail::Url u;
  distlock::detail::Error err;
  ASSERT_FALSE(err = distlock::detail::parse_url("postgres://u:P@ss/word%41SECRET@h/db", u)) << err.detail();
  // A server quoting the database it was given (the parser's path) and the decoded piece.
  EXPECT_EQ(distlock::detail::scrub_secrets("database \"wordASECRET@h/db\" does not exist", u),
            "database \"***@h/db\" does not exist");
  EXPECT_EQ(distlock::detail::scrub_secrets("path /word%41SECRET", u), "path /***");

  ASSERT_FALSE(err = distlock::detail::parse_url("postgres://MyS3cret%21@h/db", u)) << err.detail();
  EXPECT_EQ(distlock::detail::scrub_secrets("role \"MyS3cret!\" does not exist", u),
            "role \"***\" does not exist");

  // A user written with ':' is a user, not a secret; short pieces are left alone.
  ASSERT_FALSE(err = distlock::detail::parse_url("postgres://alice:pw@h/db", u)) << err.detail();
  EXPECT_EQ(distlock::detail::scrub_secrets("user \"alice\" at h", u), "user \"alice\" at h");
}

}  // namespace
