// Helpers for the tests that drive a backend's records and listing through the internal
// Backend interface (src/engine/backend.hpp), written once for every backend:
//
//   put(b, key, value, mode)   Backend::put_record; the stored value (EXPECTs no error)
//   get(b, key)                Backend::get_record (EXPECTs no error)
//   names(b, prefix, limit, truncated)   the names Backend::list_held lists (EXPECTs no error)
//   all_bytes()                every byte value, then NUL, CR, LF, NUL: a binary value
//   expect_value_bound_is_64kib(b)   kMaxRecordValue bytes stored, one more refused in both modes
//   get_ok(b, key, found), list_ok(b, prefix, limit, truncated), names(listed)
//                              the same, in the form the etcd:// and zk:// records tests use
//
// And the bodies of cases every SQL backend's records test runs, on clients `make()` gives
// (each a new client of one server); the backend's own checks follow them in its test:
//   expect_put_get_erase_binary_and_bound(make)   leaves 5 records on the server
//   expect_if_absent_race_agrees(make)
//   expect_record_and_lock_coexist(b)
// and on a client `c` with its backend `b`, the cases the etcd:// and zk:// records tests share:
//   expect_listing_many_locks_pages_and_skips_records(c, b)
//   expect_derived_names_list_by_prefix(c, b)
// and, on any backend whose server is down:
//   expect_record_calls_unavailable(b, where, secret)
//
// Thread-safety: each call uses only its arguments; a Backend's own rules apply.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "support/client_options.hpp"

namespace distlock::testing {

inline std::string put(detail::Backend& b, std::string_view key, std::string_view value,
                       detail::PutMode mode) {
  detail::Error ec;
  std::string stored = b.put_record(key, value, mode, ec);
  EXPECT_FALSE(ec) << ec.message() << ": " << ec.take_detail();
  return stored;
}

inline std::optional<std::string> get(detail::Backend& b, std::string_view key) {
  detail::Error ec;
  auto v = b.get_record(key, ec);
  EXPECT_FALSE(ec) << ec.message() << ": " << ec.take_detail();
  return v;
}

inline std::vector<std::string> names(detail::Backend& b, std::string_view prefix, std::size_t limit,
                                      bool& truncated) {
  detail::Error ec;
  auto listed = b.list_held(prefix, limit, truncated, ec);
  EXPECT_FALSE(ec) << ec.message() << ": " << ec.take_detail();
  std::vector<std::string> out;
  for (const auto& l : listed) out.push_back(l.name);
  return out;
}

inline std::string get_ok(detail::Backend& b, std::string_view key, bool& found) {
  detail::Error ec;
  auto v = b.get_record(key, ec);
  EXPECT_FALSE(ec) << ec.message() << " " << ec.take_detail();
  found = v.has_value();
  return v.value_or("");
}

inline std::vector<detail::ListedLock> list_ok(detail::Backend& b, std::string_view prefix, std::size_t limit,
                                               bool& truncated) {
  detail::Error ec;
  auto l = b.list_held(prefix, limit, truncated, ec);
  EXPECT_FALSE(ec) << ec.message() << " " << ec.take_detail();
  return l;
}

inline std::vector<std::string> names(const std::vector<detail::ListedLock>& l) {
  std::vector<std::string> n;
  for (const auto& x : l) n.push_back(x.name);
  return n;
}

inline std::string all_bytes() {
  std::string v;
  for (int i = 0; i < 256; ++i) v.push_back(static_cast<char>(i));
  v += std::string("\0\r\n\0", 4);
  return v;
}

/// A value of exactly kMaxRecordValue bytes under "big" is stored and read back whole; one byte
/// more is refused in both modes with invalid_argument naming both sizes, and the stored value
/// is left untouched.
inline void expect_value_bound_is_64kib(detail::Backend& b) {
  using detail::PutMode;
  std::string big(detail::kMaxRecordValue, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 + 7);
  EXPECT_EQ(put(b, "big", big, PutMode::always), big);
  EXPECT_EQ(get(b, "big"), big);
  for (PutMode mode : {PutMode::always, PutMode::if_absent}) {
    detail::Error ec;
    b.put_record("big", big + "x", mode, ec);
    EXPECT_EQ(ec, make_error_code(errc::invalid_argument));
    const std::string detail = ec.take_detail();
    EXPECT_NE(detail.find("65537 bytes"), std::string::npos) << detail;
    EXPECT_NE(detail.find("65536"), std::string::npos) << detail;
  }
  EXPECT_EQ(get(b, "big"), big);  // untouched
}

/// A new client of the server under test.
using MakeBackend = std::function<std::unique_ptr<detail::Backend>()>;

/// put (always overwrites, if_absent keeps and returns), get, erase; a binary key and value,
/// an empty value, a value of exactly kMaxRecordValue bytes and one byte more (refused with
/// invalid_argument naming both sizes), a 4,096-byte key; a second client sees the records.
/// Leaves 5 records.
inline void expect_put_get_erase_binary_and_bound(const MakeBackend& make) {
  using namespace std::chrono_literals;
  using detail::kMaxRecordValue;
  using detail::PutMode;
  auto b = make();
  EXPECT_EQ(get(*b, "cfg"), std::nullopt);
  distlock::detail::Error ec;
  EXPECT_FALSE(b->erase_record("cfg", ec));
  EXPECT_FALSE(ec);

  EXPECT_EQ(put(*b, "cfg", "one", PutMode::always), "one");
  EXPECT_EQ(put(*b, "cfg", "two", PutMode::always), "two");  // always overwrites
  EXPECT_EQ(get(*b, "cfg"), "two");
  EXPECT_EQ(put(*b, "cfg", "three", PutMode::if_absent), "two");  // if_absent keeps and returns it
  EXPECT_EQ(get(*b, "cfg"), "two");

  const std::string bin = all_bytes();
  const std::string bin_key = std::string("k\0\x1f\xff", 4);
  EXPECT_EQ(put(*b, bin_key, bin, PutMode::if_absent), bin);
  EXPECT_EQ(get(*b, bin_key), bin);
  EXPECT_EQ(put(*b, "empty", "", PutMode::always), "");
  EXPECT_EQ(get(*b, "empty"), std::string());

  expect_value_bound_is_64kib(*b);

  // A 4096-byte key: the row's key is its digest (too long for an index entry).
  const std::string long_key(4096, 'q');
  EXPECT_EQ(put(*b, long_key, "long", PutMode::if_absent), "long");
  EXPECT_EQ(get(*b, long_key), "long");

  EXPECT_TRUE(b->erase_record("cfg", ec));
  EXPECT_FALSE(ec);
  EXPECT_FALSE(b->erase_record("cfg", ec));
  EXPECT_EQ(get(*b, "cfg"), std::nullopt);
  EXPECT_EQ(put(*b, "cfg", "after", PutMode::if_absent), "after");

  auto other = make();  // another client sees the same records
  EXPECT_EQ(get(*other, "cfg"), "after");
  EXPECT_EQ(get(*other, bin_key), bin);
}

/// Several clients race put(if_absent) on one key per round, released together: all get the
/// same answer, one of the proposed values, which is what is stored.
inline void expect_if_absent_race_agrees(const MakeBackend& make) {
  using namespace std::chrono_literals;
  using detail::Backend;
  using detail::PutMode;
  constexpr int kClients = 4;
  constexpr int kRounds = 60;
  std::vector<std::unique_ptr<Backend>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(make());

  std::mutex mu;
  std::condition_variable cv;
  int round_started = -1;
  std::vector<std::vector<std::string>> answers(kRounds, std::vector<std::string>(kClients));
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      for (int round = 0; round < kRounds; ++round) {
        {
          std::unique_lock lk(mu);
          ++ready;
          cv.notify_all();
          if (!cv.wait_for(lk, 60s, [&] { return round_started >= round; })) {
            ++errors;
            return;
          }
        }
        distlock::detail::Error ec;
        answers[round][c] = clients[c]->put_record("race-" + std::to_string(round),
                                                   "client" + std::to_string(c), PutMode::if_absent, ec);
        if (ec) ++errors;
      }
    });
  }
  for (int round = 0; round < kRounds; ++round) {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 60s, [&] { return ready.load() == kClients * (round + 1); }));
    round_started = round;
    cv.notify_all();
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  for (int round = 0; round < kRounds; ++round) {
    const std::string& first = answers[round][0];
    EXPECT_EQ(first.rfind("client", 0), 0u) << "round " << round << ": \"" << first << "\"";
    for (int c = 1; c < kClients; ++c) EXPECT_EQ(answers[round][c], first) << "round " << round;
    EXPECT_EQ(get(*clients[0], "race-" + std::to_string(round)), first);
  }
}

/// A lock and a record of one name on `b`: both live, the record outlives the lock, and
/// erasing the record leaves the lock's token sequence alone.
inline void expect_record_and_lock_coexist(detail::Backend& b) {
  using detail::AcquireRequest;
  using detail::PutMode;
  using detail::ReleaseStatus;
  distlock::detail::Error ec;
  const AcquireRequest req{"shared-name", "owner-1", Millis(5000)};
  auto got = b.try_acquire(req, ec);
  ASSERT_FALSE(ec);
  ASSERT_TRUE(got.acquired);
  EXPECT_EQ(put(b, "shared-name", "value", PutMode::if_absent), "value");
  auto st = b.status("shared-name", ec);
  EXPECT_TRUE(st.held);
  EXPECT_EQ(st.token, got.token);
  EXPECT_EQ(st.holder, "owner-1");
  EXPECT_EQ(b.release("shared-name", "owner-1", got.token, ec), ReleaseStatus::released);
  EXPECT_EQ(get(b, "shared-name"), "value");  // a record outlives any lock
  EXPECT_TRUE(b.erase_record("shared-name", ec));
  auto again = b.try_acquire(req, ec);  // the lock's token row is untouched by the record
  ASSERT_TRUE(again.acquired);
  EXPECT_EQ(again.token, got.token + 1);
  b.release("shared-name", "owner-1", again.token, ec);
}

/// More locks than one page (etcd: 512) or one batch (zk: 64) holds, names on both sides of the
/// records namespace, records in between: list_held lists every lock in byte order with its
/// token and no record, truncates at a limit, and filters by prefix. Prints its timings.
inline void expect_listing_many_locks_pages_and_skips_records(Client& c, detail::Backend& b) {
  using namespace std::chrono_literals;
  using detail::PutMode;
  using Steady = std::chrono::steady_clock;
  // More keys than one page (etcd: 512) or one batch (zk: 64) hold, names on both sides
  // of the records namespace ('!' and '#' sort before '%', '~' after everything), and
  // records in between.
  constexpr int kLocks = 600;
  constexpr int kRecords = 600;
  distlock::detail::Error ec;
  for (int i = 0; i < kRecords; ++i) {
    b.put_record("rec/" + std::to_string(i), "x", PutMode::always, ec);
    ASSERT_FALSE(ec) << ec.message();
  }
  std::vector<std::string> expected = {"!a", "#b"};
  for (int i = 0; i < kLocks; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "n/%03d", i);
    expected.emplace_back(name);
  }
  expected.emplace_back("~z");
  std::vector<Lease> leases;
  const auto start = Steady::now();
  for (const auto& n : expected) leases.push_back(c.acquire(n, ttl_of(4s)));
  std::printf("%zu acquisitions took %lld ms\n", expected.size(),
              static_cast<long long>(std::chrono::duration_cast<Millis>(Steady::now() - start).count()));

  bool truncated = true;
  const auto t0 = Steady::now();
  const auto all = list_ok(b, "", 10'000, truncated);
  std::printf("listing %zu held locks took %lld ms\n", all.size(),
              static_cast<long long>(std::chrono::duration_cast<Millis>(Steady::now() - t0).count()));
  EXPECT_FALSE(truncated);
  EXPECT_EQ(names(all), expected);
  for (std::size_t i = 0; i < all.size() && i < leases.size(); ++i) {
    EXPECT_EQ(all[i].info.token, leases[i].token()) << all[i].name;
    EXPECT_EQ(all[i].info.waiters, 0u) << all[i].name;
  }
  const auto first = list_ok(b, "", 5, truncated);
  EXPECT_TRUE(truncated);
  EXPECT_EQ(names(first), std::vector<std::string>(expected.begin(), expected.begin() + 5));
  const auto exact = list_ok(b, "", expected.size(), truncated);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(exact.size(), expected.size());
  const auto tail = list_ok(b, "n/59", 100, truncated);
  EXPECT_EQ(names(tail), std::vector<std::string>(expected.end() - 11, expected.end() - 1));
}

/// The primitives' derived names (`<name>\x1f<kind>\x1f<detail>`) list by their prefix, in
/// byte order (0x1f before '/'), beside their records.
inline void expect_derived_names_list_by_prefix(Client& c, detail::Backend& b) {
  using namespace std::chrono_literals;
  using detail::PutMode;
  // The primitives' derived names (`<name>\x1f<kind>\x1f<detail>`) and their records.
  const std::string sem = "pool\x1fsem\x1f";
  Lease p0 = c.acquire(sem + "0", ttl_of(4s));
  Lease p2 = c.acquire(sem + "2", ttl_of(4s));
  Lease plain = c.acquire("pool", ttl_of(4s));
  Lease other = c.acquire("pool/x", ttl_of(4s));
  distlock::detail::Error ec;
  EXPECT_EQ(b.put_record("pool\x1fsem", "3", PutMode::if_absent, ec), "3");
  EXPECT_EQ(b.put_record("pool\x1fsem", "5", PutMode::if_absent, ec), "3");
  bool truncated = true;
  const auto permits = list_ok(b, sem, 100, truncated);
  EXPECT_EQ(names(permits), (std::vector<std::string>{sem + "0", sem + "2"}));
  EXPECT_FALSE(truncated);
  ASSERT_EQ(permits.size(), 2u);
  EXPECT_EQ(permits[1].info.token, p2.token());
  // Byte order: 0x1f sorts before '/'.
  EXPECT_EQ(names(list_ok(b, "pool", 100, truncated)),
            (std::vector<std::string>{"pool", sem + "0", sem + "2", "pool/x"}));
  bool found = false;
  EXPECT_EQ(get_ok(b, "pool\x1fsem", found), "3");
}

/// Every record call of `b` (put in both modes, get, erase, list_held), its server down, fails
/// with backend_unavailable, the detail naming `where` (host:port) and never `secret` (when
/// given). How long the five calls took is printed.
inline void expect_record_calls_unavailable(detail::Backend& b, const std::string& where,
                                            const std::string& secret = {}) {
  using detail::PutMode;
  detail::Error ec;
  auto check = [&](const char* what) {
    EXPECT_EQ(ec, make_error_code(errc::backend_unavailable)) << what << ": " << ec.message();
    const std::string detail = ec.take_detail();
    EXPECT_NE(detail.find(where), std::string::npos) << what << ": " << detail;
    if (!secret.empty()) {
      EXPECT_EQ(detail.find(secret), std::string::npos) << detail;
    }
  };
  const auto start = std::chrono::steady_clock::now();
  b.put_record("k", "w", PutMode::always, ec);
  check("put always");
  b.put_record("k", "w", PutMode::if_absent, ec);
  check("put if_absent");
  b.get_record("k", ec);
  check("get");
  b.erase_record("k", ec);
  check("erase");
  bool truncated = false;
  b.list_held("", 10, truncated, ec);
  check("list_held");
  const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start);
  std::printf("five record calls against a server that is down took %lld ms\n",
              static_cast<long long>(took.count()));
}

}  // namespace distlock::testing
