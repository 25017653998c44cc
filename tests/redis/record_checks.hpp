// Checks of the record and listing primitives (Backend::put_record, get_record,
// erase_record, list_held) shared by the Redis-family backends' tests (redis://,
// redis+sentinel://, redis+cluster://, redlock://). Each check drives a Backend
// made by the test against its own servers and asserts with gtest.
//
// Thread-safety: one check at a time per backend (the race check makes its own).
//
// Example:
//   auto b = distlock::testing::open_backend(server.url());
//   distlock::testing::check_put_get_erase(*b);
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "connect/registry.hpp"
#include "distlock/error.hpp"
#include "engine/backend.hpp"
#include "engine/url.hpp"

namespace distlock::testing {

namespace rec = distlock::detail;

inline std::unique_ptr<rec::Backend> open_backend(const std::string& url, ClientOptions opts = {}) {
  rec::Url u;
  if (const rec::Error err = rec::parse_url(url, u)) {
    ADD_FAILURE() << err.detail();
    return nullptr;
  }
  distlock::detail::Error ec;
  auto factory = rec::find_backend(u.scheme);
  if (factory == nullptr) {
    ADD_FAILURE() << "no backend for " << u.scheme;
    return nullptr;
  }
  auto b = factory(u, opts, ec);
  if (!b) ADD_FAILURE() << url << ": " << ec.message() << ": " << ec.detail();
  return b;
}

inline std::string test_owner(int i) {
  return "0123456789abcdef0123456789abcdef:" + std::to_string(i);
}

/// always overwrites and answers the value; get; erase says whether there was one.
inline void check_put_get_erase(rec::Backend& b, const std::string& key = "rec/basic") {
  distlock::detail::Error ec;
  EXPECT_EQ(b.get_record(key, ec), std::nullopt);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(b.put_record(key, "one", rec::PutMode::always, ec), "one");
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(b.get_record(key, ec), "one");
  EXPECT_EQ(b.put_record(key, "two", rec::PutMode::always, ec), "two");
  EXPECT_EQ(b.get_record(key, ec), "two");
  // if_absent keeps the existing value and answers it.
  EXPECT_EQ(b.put_record(key, "three", rec::PutMode::if_absent, ec), "two");
  EXPECT_EQ(b.get_record(key, ec), "two");
  EXPECT_TRUE(b.erase_record(key, ec));
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_FALSE(b.erase_record(key, ec));
  EXPECT_EQ(b.get_record(key, ec), std::nullopt);
  EXPECT_EQ(b.put_record(key, "four", rec::PutMode::if_absent, ec), "four");
  EXPECT_EQ(b.get_record(key, ec), "four");
  EXPECT_FALSE(ec) << ec.message();
}

/// Two clients putting if_absent at the same moment, `rounds` times on fresh keys:
/// both get the same answer, one of the two values, and the record holds it.
inline void check_if_absent_race(rec::Backend& one, rec::Backend& two, int rounds = 100) {
  // Both threads spin until the other arrived, so their requests leave within
  // microseconds of each other (a blocking barrier wakes one of them a scheduler
  // latency later, and the calls then never overlap). Each spin is bounded in time.
  std::atomic<int> arrived{0};
  std::atomic<bool> gave_up{false};
  std::vector<std::string> a(rounds), b(rounds);
  std::vector<rec::Error> ea(rounds), eb(rounds);
  auto run = [&](rec::Backend& be, std::vector<std::string>& out, std::vector<rec::Error>& errs,
                 const std::string& mine) {
    for (int i = 0; i < rounds; ++i) {
      arrived.fetch_add(1);
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (arrived.load() < 2 * (i + 1) && !gave_up.load()) {
        if (std::chrono::steady_clock::now() > end) gave_up = true;
      }
      out[i] = be.put_record("race/" + std::to_string(i), mine, rec::PutMode::if_absent, errs[i]);
    }
  };
  std::thread t([&] { run(two, b, eb, "from two"); });
  run(one, a, ea, "from one");
  t.join();
  ASSERT_FALSE(gave_up.load()) << "a racing thread did not arrive within 10 s";
  int first_won = 0;
  for (int i = 0; i < rounds; ++i) {
    SCOPED_TRACE(i);
    ASSERT_FALSE(ea[i]) << ea[i].message();
    ASSERT_FALSE(eb[i]) << eb[i].message();
    EXPECT_EQ(a[i], b[i]);
    EXPECT_TRUE(a[i] == "from one" || a[i] == "from two") << a[i];
    distlock::detail::Error ec;
    EXPECT_EQ(one.get_record("race/" + std::to_string(i), ec), a[i]);
    first_won += a[i] == "from one";
  }
  std::cout << "[ measured ] if_absent race: client one's value won " << first_won << " of " << rounds
            << " rounds\n";
}

/// Any bytes (NUL, CR-LF, 0x80-0xff) up to 64 KiB; one byte more is invalid_argument naming the size.
inline void check_values(rec::Backend& b) {
  std::string binary;
  for (int i = 0; i < 512; ++i) binary.push_back(static_cast<char>(i % 256));
  binary += "\r\n\0end";
  distlock::detail::Error ec;
  EXPECT_EQ(b.put_record("rec/binary", binary, rec::PutMode::always, ec), binary);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(b.get_record("rec/binary", ec), binary);
  EXPECT_EQ(b.put_record("rec/binary-absent", binary, rec::PutMode::if_absent, ec), binary);
  EXPECT_EQ(b.get_record("rec/binary-absent", ec), binary);
  EXPECT_EQ(b.put_record("rec/empty", "", rec::PutMode::always, ec), "");
  EXPECT_EQ(b.get_record("rec/empty", ec), "");  // an empty value is a record, not its absence

  const std::string largest(rec::kMaxRecordValue, '\xab');
  EXPECT_EQ(b.put_record("rec/largest", largest, rec::PutMode::always, ec), largest);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(b.get_record("rec/largest", ec), largest);
  for (auto mode : {rec::PutMode::always, rec::PutMode::if_absent}) {
    ec.clear();
    b.put_record("rec/too-large", largest + "x", mode, ec);
    EXPECT_EQ(ec, errc::invalid_argument);
    EXPECT_NE(ec.take_detail().find("65537 bytes"), std::string::npos);
  }
  EXPECT_EQ(b.get_record("rec/too-large", ec), std::nullopt);
}

/// A record and a lock of the same name live side by side; neither touches the other.
inline void check_record_and_lock_coexist(rec::Backend& b) {
  const std::string name = "rec/both";
  distlock::detail::Error ec;
  auto r = b.try_acquire({name, test_owner(1), std::chrono::milliseconds(30000)}, ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(r.acquired);
  EXPECT_EQ(b.put_record(name, "value", rec::PutMode::if_absent, ec), "value");
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_TRUE(b.status(name, ec).held);
  EXPECT_EQ(b.get_record(name, ec), "value");
  EXPECT_EQ(b.release(name, test_owner(1), r.token, ec), rec::ReleaseStatus::released);
  EXPECT_EQ(b.get_record(name, ec), "value");
  EXPECT_TRUE(b.erase_record(name, ec));
  r = b.try_acquire({name, test_owner(2), std::chrono::milliseconds(30000)}, ec);
  EXPECT_TRUE(r.acquired);
  EXPECT_FALSE(b.erase_record(name, ec));
  EXPECT_TRUE(b.status(name, ec).held);
  bool truncated = true;
  auto listed = b.list_held(name, 10, truncated, ec);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].name, name);
  b.release(name, test_owner(2), r.token, ec);
  EXPECT_FALSE(ec) << ec.message();
}

inline std::vector<std::string> names_of(const std::vector<rec::ListedLock>& v) {
  std::vector<std::string> out;
  for (const auto& l : v) out.push_back(l.name);
  return out;
}

/// list_held: only held locks under the prefix (records are not locks), sorted,
/// limited with `truncated`, byte-exact prefixes with glob characters, braces and
/// high bytes, and each entry as status() says. `more` adds names (e.g. one per
/// cluster node) to hold under "ls/".
inline void check_listing(rec::Backend& b, std::vector<std::string> more = {}) {
  std::vector<std::string> held{"ls/a1",  "ls/a2",  "ls/b1", "ls/*",    "ls/?1",  "ls/[a]1",
                                "ls/\\x", "ls/{b}", "ls/}{", "ls/\xff", "ls/a\nz"};
  for (auto& m : more) held.push_back(m);
  const std::vector<std::string> elsewhere{"lt/a1", "l", "ls"};
  distlock::detail::Error ec;
  int i = 0;
  for (const auto& n : held) {
    auto r = b.try_acquire({n, test_owner(i++), std::chrono::milliseconds(60000)}, ec);
    ASSERT_FALSE(ec) << n << ": " << ec.message();
    ASSERT_TRUE(r.acquired) << n;
  }
  for (const auto& n : elsewhere) {
    ASSERT_TRUE(b.try_acquire({n, test_owner(i++), std::chrono::milliseconds(60000)}, ec).acquired) << n;
  }
  b.put_record("ls/record-only", "v", rec::PutMode::always, ec);
  b.put_record("ls/a1", "record beside a lock", rec::PutMode::always, ec);
  ASSERT_FALSE(ec) << ec.message();

  std::vector<std::string> sorted = held;
  std::sort(sorted.begin(), sorted.end());
  bool truncated = true;
  auto all = b.list_held("ls/", 1000, truncated, ec);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.take_detail();
  EXPECT_FALSE(truncated);
  EXPECT_EQ(names_of(all), sorted);
  for (const auto& l : all) {
    SCOPED_TRACE(l.name);
    const LockInfo s = b.status(l.name, ec);
    EXPECT_TRUE(l.info.held);
    EXPECT_EQ(l.info.holder, s.holder);
    ASSERT_TRUE(l.info.holder.has_value());
    EXPECT_EQ(l.info.holder->substr(0, 33), test_owner(0).substr(0, 33));
    EXPECT_EQ(l.info.token, s.token);
    EXPECT_EQ(l.info.waiters.has_value(), s.waiters.has_value());
    ASSERT_TRUE(l.info.ttl_remaining.has_value());
    EXPECT_GT(l.info.ttl_remaining->count(), 0);
    EXPECT_LE(l.info.ttl_remaining->count(), 60000);
  }

  for (std::size_t limit : {std::size_t(1), std::size_t(3), sorted.size() - 1}) {
    auto some = b.list_held("ls/", limit, truncated, ec);
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_TRUE(truncated) << limit;
    EXPECT_EQ(names_of(some), std::vector<std::string>(sorted.begin(), sorted.begin() + limit));
  }
  auto exact = b.list_held("ls/", sorted.size(), truncated, ec);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(exact.size(), sorted.size());

  // Byte-exact prefixes: glob characters match only themselves.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"ls/*", {"ls/*"}},    {"ls/?", {"ls/?1"}},   {"ls/[a]", {"ls/[a]1"}},
      {"ls/[", {"ls/[a]1"}}, {"ls/\\", {"ls/\\x"}}, {"ls/a", {"ls/a1", "ls/a2", "ls/a\nz"}},
      {"ls/{", {"ls/{b}"}},  {"ls/}", {"ls/}{"}},   {"ls/\xff", {"ls/\xff"}},
      {"ls/a1", {"ls/a1"}},  {"ls/a10", {}},        {"ls/A", {}}};
  for (const auto& [prefix, want] : cases) {
    SCOPED_TRACE(prefix);
    auto got = b.list_held(prefix, 1000, truncated, ec);
    ASSERT_FALSE(ec) << ec.message();
    std::vector<std::string> w = want;
    std::sort(w.begin(), w.end());
    EXPECT_EQ(names_of(got), w);
  }
  auto everything = b.list_held("", 1000, truncated, ec);
  ASSERT_FALSE(ec) << ec.message();
  std::set<std::string> got;
  for (const auto& l : everything) got.insert(l.name);
  for (const auto& n : held) EXPECT_TRUE(got.count(n)) << n;
  for (const auto& n : elsewhere) EXPECT_TRUE(got.count(n)) << n;
  EXPECT_FALSE(got.count("ls/record-only"));
  EXPECT_TRUE(std::is_sorted(everything.begin(), everything.end(),
                             [](const auto& x, const auto& y) { return x.name < y.name; }));
  auto under_l = b.list_held("l", 1000, truncated, ec);
  EXPECT_EQ(under_l.size(), held.size() + elsewhere.size());
  i = 0;
  for (const auto& n : held) b.release(n, test_owner(i++), 0, ec);
  for (const auto& n : elsewhere) b.release(n, test_owner(i++), 0, ec);
  EXPECT_TRUE(b.list_held("ls/", 1000, truncated, ec).empty());
}

/// A lock whose lease ran out is not listed (nothing renews it here).
inline void check_expired_not_listed(rec::Backend& b) {
  distlock::detail::Error ec;
  ASSERT_TRUE(b.try_acquire({"exp/short", test_owner(1), std::chrono::milliseconds(150)}, ec).acquired);
  ASSERT_TRUE(b.try_acquire({"exp/long", test_owner(2), std::chrono::milliseconds(60000)}, ec).acquired);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (b.status("exp/short", ec).held && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(b.status("exp/short", ec).held);
  bool truncated = true;
  auto listed = b.list_held("exp/", 10, truncated, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(names_of(listed), std::vector<std::string>{"exp/long"});
  EXPECT_FALSE(truncated);
}

/// More locks than one status pipeline and one SCAN call carry: limit and truncated still hold.
inline void check_many(rec::Backend& b, int n = 1500) {
  distlock::detail::Error ec;
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "many/%05d", i);
    names.emplace_back(buf);
    ASSERT_TRUE(b.try_acquire({names.back(), test_owner(i), std::chrono::milliseconds(120000)}, ec).acquired)
        << ec.message();
  }
  bool truncated = true;
  const auto start = std::chrono::steady_clock::now();
  auto all = b.list_held("many/", 100000, truncated, ec);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(ec) << ec.message();
  std::cout << "[ measured ] list_held of " << n
            << " locks: " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms\n";
  EXPECT_FALSE(truncated);
  EXPECT_EQ(names_of(all), names);
  const int half = n / 2;
  auto some = b.list_held("many/", half, truncated, ec);
  EXPECT_TRUE(truncated);
  ASSERT_EQ(some.size(), static_cast<std::size_t>(half));
  EXPECT_EQ(names_of(some), std::vector<std::string>(names.begin(), names.begin() + half));
}

/// Every call fails with `code` and an error detail naming `server` ("127.0.0.1:port").
inline void check_all_fail(rec::Backend& b, std::error_code code, const std::string& server) {
  distlock::detail::Error ec;
  ec.clear();
  b.put_record("down", "v", rec::PutMode::always, ec);
  EXPECT_EQ(ec, code) << ec.message();
  EXPECT_NE(ec.take_detail().find(server), std::string::npos) << "put always";
  b.put_record("down", "v", rec::PutMode::if_absent, ec);
  EXPECT_EQ(ec, code) << ec.message();
  EXPECT_NE(ec.take_detail().find(server), std::string::npos) << "put if_absent";
  b.get_record("down", ec);
  EXPECT_EQ(ec, code) << ec.message();
  EXPECT_NE(ec.take_detail().find(server), std::string::npos) << "get";
  b.erase_record("down", ec);
  EXPECT_EQ(ec, code) << ec.message();
  EXPECT_NE(ec.take_detail().find(server), std::string::npos) << "erase";
  bool truncated = false;
  b.list_held("", 10, truncated, ec);
  EXPECT_EQ(ec, code) << ec.message();
  EXPECT_NE(ec.take_detail().find(server), std::string::npos) << "list";
}

}  // namespace distlock::testing
