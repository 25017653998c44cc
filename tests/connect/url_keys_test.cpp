// The URL query-key tables (src/engine/scheme.*; each backend's entries in
// src/<backend>/<backend>_scheme.cpp, listed by src/connect/registry.cpp): every scheme's
// keys are checked in one place, with one meaning for each type of value, and
// `distlock urls` prints the same table connect() enforces.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "connect/registry.hpp"
#include "distlock/client.hpp"
#include "distlock/config.hpp"
#include "distlock/error.hpp"
#include "engine/url.hpp"

namespace {

using distlock::errc;
using distlock::detail::QueryType;

std::string parse_and_check(const std::string& text, std::error_code& ec) {
  distlock::detail::Url url;
  distlock::detail::Error err;
  if ((ec = err = distlock::detail::parse_url(text, url))) return err.detail();
  const distlock::detail::Scheme* scheme = distlock::detail::find_scheme(url.scheme);
  if (scheme == nullptr) {
    ec = make_error_code(errc::invalid_url);
    return "no scheme";
  }
  err = distlock::detail::check_query(*scheme, url);
  ec = err;
  return err.detail();
}

// What connect() says about a URL it refuses (and the error it gives).
std::string connect_error(const std::string& url, std::error_code& ec) {
  try {
    distlock::connect(url);
    ec.clear();
    return {};
  } catch (const std::system_error& e) {
    ec = e.code();
    return e.what();
  }
}

TEST(UrlKeys, EverySchemeRowIsWellFormed) {
  ASSERT_FALSE(distlock::detail::all_schemes().empty());
  for (const auto& s : distlock::detail::all_schemes()) {
    SCOPED_TRACE(std::string(s.name));
    EXPECT_NE(s.factory, nullptr);
    EXPECT_TRUE(s.form.starts_with(std::string(s.name) + "://")) << s.form;
    EXPECT_FALSE(s.summary.empty());
    std::set<std::string_view> seen;
    bool has_timeout = false;
    for (const auto& k : s.keys) {
      SCOPED_TRACE(std::string(k.name));
      EXPECT_TRUE(seen.insert(k.name).second) << "key listed twice";
      EXPECT_FALSE(k.meaning.empty());
      if (k.type == QueryType::choice) {
        EXPECT_FALSE(k.choices.empty());
      }
      if (k.type == QueryType::count) {
        EXPECT_GT(k.max_count, 0u);
      }
      if (k.type == QueryType::duration) {
        EXPECT_GT(k.max.count(), 0);
      }
      // A TLS-only key must be reachable: on the TLS scheme itself, or named by its plain one.
      if (k.tls_only) {
        EXPECT_TRUE(s.tls || !s.tls_scheme.empty());
      }
      has_timeout = has_timeout || (k.name == "timeout" && k.type == QueryType::duration);
    }
    // The core applies timeout= to every client (apply_common_query): every row must know it.
    EXPECT_TRUE(has_timeout);
    if (!s.tls_scheme.empty()) {
      const auto* tls = distlock::detail::find_scheme(s.tls_scheme);
      ASSERT_NE(tls, nullptr);
      EXPECT_TRUE(tls->tls);
    }
  }
}

TEST(UrlKeys, AnUnknownKeyIsRefusedOnEverySchemeAndTheKnownOnesAreListed) {
  // memory:// read no query key but timeout=, and ignored the rest: a typo went unseen.
  std::error_code ec;
  const std::string msg = connect_error("memory://keys-test?timeuot=1s", ec);
  EXPECT_EQ(ec, errc::invalid_url) << msg;
  EXPECT_NE(msg.find("unknown query parameter \"timeuot\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("memory:// knows timeout"), std::string::npos) << msg;
  for (const auto& s : distlock::detail::all_schemes()) {
    const std::string why = parse_and_check(std::string(s.name) + "://h/db?no_such_key=1", ec);
    EXPECT_EQ(ec, errc::invalid_url) << s.name;
    EXPECT_NE(why.find(std::string(s.name) + ":// knows "), std::string::npos) << why;
  }
}

TEST(UrlKeys, ValuesOfOneTypeMeanTheSameOnEveryScheme) {
  std::error_code ec;
  for (const auto& s : distlock::detail::all_schemes()) {
    for (const auto& k : s.keys) {
      if (k.tls_only && !s.tls) continue;
      const std::string base = std::string(s.name) + "://h/db?" + std::string(k.name) + "=";
      SCOPED_TRACE(base);
      switch (k.type) {
        case QueryType::duration:
          parse_and_check(base + "250ms", ec);
          EXPECT_FALSE(ec);
          EXPECT_NE(parse_and_check(base + "0", ec).find("positive duration"), std::string::npos);
          EXPECT_NE(parse_and_check(base + "soon", ec).find("positive duration"), std::string::npos);
          EXPECT_NE(parse_and_check(base + "9999h", ec).find("above the maximum"), std::string::npos);
          break;
        case QueryType::flag:
          for (const char* v : {"1", "0", "true", "false", "yes", "no"}) {
            parse_and_check(base + v, ec);
            EXPECT_FALSE(ec) << v;
          }
          EXPECT_NE(parse_and_check(base + "maybe", ec).find("not one of true, false"), std::string::npos);
          break;
        case QueryType::count:
          parse_and_check(base + std::to_string(k.max_count), ec);
          EXPECT_FALSE(ec);
          EXPECT_NE(parse_and_check(base + std::to_string(k.max_count + 1), ec).find("whole number"),
                    std::string::npos);
          EXPECT_NE(parse_and_check(base + "-1", ec).find("whole number"), std::string::npos);
          break;
        case QueryType::choice:
          EXPECT_NE(parse_and_check(base + "bogus", ec).find("is not one of"), std::string::npos);
          break;
        case QueryType::file:
          EXPECT_NE(parse_and_check(base, ec).find("names a file"), std::string::npos);
          break;
        case QueryType::text: break;
      }
    }
  }
}

#if DISTLOCK_HAS_FILE
TEST(UrlKeys, AFileUrlTakesEveryFlagSpelling) {
  // file:// accepted only true/false/1/0 for sync= while etcd:// took yes/no for tls=.
  const auto dir =
      std::filesystem::temp_directory_path() / ("distlock-url-keys-" + std::to_string(::getpid()));
  std::error_code ec;
  connect_error("file://" + dir.string() + "?sync=yes&recheck=250ms", ec);
  EXPECT_FALSE(ec) << ec.message();
  std::filesystem::remove_all(dir, ec);
}
#endif

#if DISTLOCK_HAS_REDIS
TEST(UrlKeys, ATlsKeyOnAPlainSchemeNamesTheTlsScheme) {
  std::error_code ec;
  std::string why = parse_and_check("redis://h?cacert=/ca.pem", ec);
  EXPECT_EQ(ec, errc::invalid_url);
  EXPECT_NE(why.find("is a TLS setting: write rediss://"), std::string::npos) << why;
  parse_and_check("rediss://h?cacert=/ca.pem", ec);
  EXPECT_FALSE(ec);
}
#endif

#if DISTLOCK_HAS_REDLOCK
TEST(UrlKeys, RedlockSaysTheSameAsRedisAboutTls) {
  std::error_code ec;
  const std::string why = parse_and_check("redlock://a:1,b:2,c:3?key=/k.pem", ec);
  EXPECT_EQ(ec, errc::invalid_url);
  EXPECT_NE(why.find("is a TLS setting: write redlocks://"), std::string::npos) << why;
}
#endif

TEST(UrlKeys, ATimeoutAboveTheClientLimitIsAUrlErrorNamingTheKey) {
  // Before the table, timeout=2h passed the URL check and failed later as
  // "connect_timeout 7200000ms is out of range": right refusal, wrong place named.
  std::error_code ec;
  const std::string msg = connect_error("memory://keys-test?timeout=2h", ec);
  EXPECT_EQ(ec, errc::invalid_url) << msg;
  EXPECT_NE(msg.find("timeout \"2h\""), std::string::npos) << msg;
}

TEST(UrlKeys, ThePasswordIsNeverQuoted) {
  std::error_code ec;
  for (const std::string url : {"memory://u:hunter2@x?bogus=1", "memory://u:hunter2@x?timeout=hunter2x"}) {
    const std::string msg = connect_error(url, ec);
    EXPECT_EQ(ec, errc::invalid_url);
    EXPECT_EQ(msg.find("hunter2@"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(":hunter2"), std::string::npos) << msg;
  }
}

TEST(UrlKeys, TheHelpTextListsEverySchemeAndKey) {
  const std::string help = distlock::describe_url_schemes();
  for (const auto& s : distlock::detail::all_schemes()) {
    if (s.name == "memory") continue;
    EXPECT_NE(help.find(std::string(s.form)), std::string::npos) << s.form;
    for (const auto& k : s.keys) {
      EXPECT_NE(help.find("?" + std::string(k.name) + "="), std::string::npos) << s.name << " " << k.name;
    }
  }
  const std::string brief = distlock::describe_url_schemes(false);
  EXPECT_EQ(brief.find("?timeout="), std::string::npos);
}

TEST(OptionsValidation, TheMessageAndTheVerdictComeFromOneRule) {
  using std::chrono::milliseconds;
  struct Case {
    distlock::LockOptions opts;
    const char* names;
  };
  std::vector<Case> cases;
  cases.push_back({{.ttl = milliseconds(50)}, "ttl"});
  cases.push_back({{.ttl = milliseconds(3000), .safety_margin = milliseconds(1000)}, "safety_margin"});
  cases.push_back({{.ttl = milliseconds(3000), .renew_interval = milliseconds(1600)}, "renew_interval"});
  cases.push_back({{.ttl = milliseconds(3000), .safety_margin = milliseconds(-1)}, "safety_margin"});
  cases.push_back({{.max_hold = milliseconds(0)}, "max_hold"});
  cases.push_back({{.holder_info = "a|b"}, "holder_info"});
  for (auto& c : cases) {
    distlock::LockOptions a = c.opts, b = c.opts;
    std::string why;
    EXPECT_EQ(a.validate_and_fill(), errc::invalid_argument) << c.names;
    EXPECT_EQ(b.validate_and_fill(why), errc::invalid_argument) << c.names;
    EXPECT_NE(why.find(c.names), std::string::npos) << why;
  }
  distlock::LockOptions good{.ttl = milliseconds(3000)};
  std::string why;
  EXPECT_FALSE(good.validate_and_fill(why)) << why;
  EXPECT_EQ(good.safety_margin, milliseconds(300));
  EXPECT_EQ(good.renew_interval, milliseconds(1000));

  distlock::ClientOptions client;
  client.command_timeout = milliseconds(0);
  EXPECT_EQ(client.validate(why), errc::invalid_argument);
  EXPECT_NE(why.find("command_timeout"), std::string::npos) << why;
  client.command_timeout = milliseconds(100);
  client.lock_defaults.ttl = milliseconds(10);
  EXPECT_EQ(client.validate(why), errc::invalid_argument);
  EXPECT_NE(why.find("lock_defaults: lock ttl"), std::string::npos) << why;
}

}  // namespace
