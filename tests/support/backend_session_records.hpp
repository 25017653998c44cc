// The records and listing cases the etcd:// and zk:// records tests (tests/etcd/etcd_records_test.cpp,
// tests/zk/zk_records_test.cpp) share: backends whose locks are held by a session (an etcd
// lease, a ZooKeeper session) and whose records are plain keys or nodes that outlive it. Each
// runs on clients of one server made by the test, through the internal Backend
// (backend_of(client)); what only one backend can check is passed in or stays in its test:
//
//   expect_put_if_absent_race_same_answer(one, two)
//   expect_always_overwrites_get_and_erase(b, stored_plainly)
//   expect_binary_values_up_to_the_bound(b, key)
//   expect_record_and_lock_of_one_name_coexist(c, name, ttl)
//   expect_records_outlive_their_writers(reader, connect_writer, tool_url, tool_ttl_ms, ...)
//   expect_list_held_prefix_limit_truncation_and_waiters(holder, waiters_client, ttl, ...)
//   expect_expired_locks_not_listed(c, tool_url, tool_ttl_ms, tmp_name)
//   expect_records_calls_unavailable_naming(b, kill_server, where)
//
// The cases that kill a writer spawn the backend's record tool, whose path the including test
// target defines as DISTLOCK_RECORD_TOOL (tests/etcd/CMakeLists.txt, tests/zk/CMakeLists.txt):
// it writes a record, holds a lock and prints "ready".
//
// Thread-safety: each call uses only its arguments; a Client's and a Backend's own rules apply.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "support/backend_records.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

namespace distlock::testing {

/// The internal backend of `c`.
inline detail::Backend& backend_of(Client& c) {
  return detail::engine_of(c)->backend();
}

/// Two clients race put(if_absent) on one key per round (40 rounds, started together): both
/// get the same answer, one of the two proposed values, which is what is stored.
inline void expect_put_if_absent_race_same_answer(Client& one, Client& two) {
  constexpr int kRounds = 40;
  std::vector<std::string> got_one(kRounds), got_two(kRounds);
  std::barrier sync(2);
  auto racer = [&](Client& c, const std::string& value, std::vector<std::string>& got) {
    for (int i = 0; i < kRounds; ++i) {
      sync.arrive_and_wait();
      detail::Error ec;
      got[i] = backend_of(c).put_record("race/" + std::to_string(i), value, detail::PutMode::if_absent, ec);
      EXPECT_FALSE(ec) << ec.message();
    }
  };
  std::thread a([&] { racer(one, "from-one", got_one); });
  std::thread b([&] { racer(two, "from-two", got_two); });
  a.join();
  b.join();
  int one_won = 0;
  for (int i = 0; i < kRounds; ++i) {
    EXPECT_EQ(got_one[i], got_two[i]) << "round " << i;
    EXPECT_TRUE(got_one[i] == "from-one" || got_one[i] == "from-two") << got_one[i];
    bool found = false;
    EXPECT_EQ(get_ok(backend_of(one), "race/" + std::to_string(i), found), got_one[i]);
    EXPECT_TRUE(found);
    one_won += got_one[i] == "from-one" ? 1 : 0;
  }
  std::printf("put-if-absent races: client one won %d of %d\n", one_won, kRounds);
}

/// put(always) creates and overwrites, put(if_absent) keeps and returns what is stored, get
/// reads it, erase removes it (true once, then false), and if_absent creates it again.
/// `stored_plainly()` runs while "cfg" holds "3": the backend's own look at how it is stored.
inline void expect_always_overwrites_get_and_erase(detail::Backend& b,
                                                   const std::function<void()>& stored_plainly) {
  using detail::PutMode;
  detail::Error ec;
  bool found = true;
  get_ok(b, "cfg", found);
  EXPECT_FALSE(found);
  EXPECT_EQ(b.put_record("cfg", "1", PutMode::always, ec), "1");     // created
  EXPECT_EQ(b.put_record("cfg", "2", PutMode::if_absent, ec), "1");  // kept
  EXPECT_EQ(get_ok(b, "cfg", found), "1");
  EXPECT_EQ(b.put_record("cfg", "3", PutMode::always, ec), "3");  // overwritten
  EXPECT_EQ(get_ok(b, "cfg", found), "3");
  ASSERT_FALSE(ec);
  ASSERT_NO_FATAL_FAILURE(stored_plainly());
  EXPECT_TRUE(b.erase_record("cfg", ec));
  EXPECT_FALSE(ec);
  get_ok(b, "cfg", found);
  EXPECT_FALSE(found);
  EXPECT_FALSE(b.erase_record("cfg", ec));
  EXPECT_FALSE(ec);
  EXPECT_EQ(b.put_record("cfg", "4", PutMode::if_absent, ec), "4");  // absent again
}

/// A binary value of exactly kMaxRecordValue bytes under the binary `key` is stored whole (and
/// an if_absent put returns it); an empty value is a record; one byte more is refused, in both
/// modes, with invalid_argument naming the size, and nothing is stored.
inline void expect_binary_values_up_to_the_bound(detail::Backend& b, const std::string& key) {
  using detail::PutMode;
  std::string big(detail::kMaxRecordValue, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 % 256);
  detail::Error ec;
  EXPECT_EQ(b.put_record(key, big, PutMode::always, ec), big);
  ASSERT_FALSE(ec) << ec.message() << " " << ec.take_detail();
  bool found = false;
  EXPECT_EQ(get_ok(b, key, found), big);
  EXPECT_EQ(b.put_record(key, "short", PutMode::if_absent, ec), big);
  EXPECT_EQ(b.put_record("empty", "", PutMode::if_absent, ec), "");
  EXPECT_EQ(get_ok(b, "empty", found), "");
  EXPECT_TRUE(found) << "an empty value is a record, not its absence";

  ec.clear();
  const std::string too_big(detail::kMaxRecordValue + 1, 'x');
  for (const auto mode : {PutMode::always, PutMode::if_absent}) {
    b.put_record("big", too_big, mode, ec);
    EXPECT_EQ(ec, errc::invalid_argument);
    const std::string why = ec.take_detail();
    EXPECT_NE(why.find("65537"), std::string::npos) << why;
  }
  get_ok(b, "big", found);
  EXPECT_FALSE(found);
}

/// A record and a lock named `name` on client `c` coexist: the record is not a waiter, the
/// listing shows only the lock, releasing the lock keeps the record and erasing the record
/// keeps a lock taken again.
inline void expect_record_and_lock_of_one_name_coexist(Client& c, const std::string& name, Millis ttl) {
  auto& b = backend_of(c);
  Lease lease = c.acquire(name, ttl_of(ttl));
  detail::Error ec;
  EXPECT_EQ(b.put_record(name, "record", detail::PutMode::if_absent, ec), "record");
  ASSERT_FALSE(ec) << ec.message() << " " << ec.take_detail();
  const LockInfo info = c.status(name);
  EXPECT_TRUE(info.held);
  EXPECT_EQ(info.waiters, 0u) << "the record counted as a waiter";
  EXPECT_EQ(info.token, lease.token());
  bool truncated = true;
  EXPECT_EQ(names(list_ok(b, "", 100, truncated)), std::vector<std::string>{name});
  EXPECT_FALSE(truncated);
  lease.release();
  EXPECT_FALSE(c.status(name).held);
  bool found = false;
  EXPECT_EQ(get_ok(b, name, found), "record");
  // The lock did not take the record along, nor the record the lock.
  Lease again = c.acquire(name, ttl_of(ttl));
  EXPECT_TRUE(b.erase_record(name, ec));
  EXPECT_TRUE(c.status(name).held);
}

/// A record outlives its writer: a client closed while holding a lock (`connect_writer()`
/// makes it; its lock goes at once), then the record tool run against `tool_url` holding a
/// lock of `tool_ttl_ms` and SIGKILLed (its `holder_end`, "lease" or "session", ends on the
/// server within 30 s). `reader` still reads both records.
inline void expect_records_outlive_their_writers(Client& reader,
                                                 const std::function<Client()>& connect_writer,
                                                 const std::string& tool_url, const std::string& tool_ttl_ms,
                                                 const std::string& tmp_name, const std::string& holder_end) {
  using namespace std::chrono_literals;
  {
    Client writer = connect_writer();
    Lease held = writer.acquire("writer-lock", ttl_of(4s));
    detail::Error ec;
    backend_of(writer).put_record("closed", "v1", detail::PutMode::always, ec);
    ASSERT_FALSE(ec);
  }  // the closed client's session (and its lock) goes
  EXPECT_FALSE(reader.status("writer-lock").held);
  bool found = false;
  EXPECT_EQ(get_ok(backend_of(reader), "closed", found), "v1");
  EXPECT_TRUE(found);

  // A writer SIGKILLed while holding a lock: its lease or session expires on the server.
  TempDir dir(tmp_name);
  const std::string out = (dir.path() / "tool.out").string();
  Process tool =
      Process::spawn({DISTLOCK_RECORD_TOOL, tool_url, "killed", "v2", "tool-lock", tool_ttl_ms}, out);
  ASSERT_TRUE(wait_for_text(out, "ready", 20s)) << read_file(out);
  ASSERT_TRUE(reader.status("tool-lock").held);
  tool.signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually([&] { return !reader.status("tool-lock").held; }, 30s))
      << holder_end << " never expired";
  std::printf("killed writer's %s ended after %lld ms\n", holder_end.c_str(),
              static_cast<long long>(
                  std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - killed).count()));
  EXPECT_EQ(get_ok(backend_of(reader), "killed", found), "v2");
  EXPECT_TRUE(found);
}

/// Seven locks held by `holder` (TTL `ttl`; '/' and '%' in names, which a backend may encode:
/// a prefix matches the user's bytes exactly), a record, a released lock and two waiters of
/// `waiters_client` on job/b: list_held by prefix lists exactly the held names in order, each
/// as status() says (waiters and tokens too), with limits and truncation. A listed lock's time
/// left is above zero and at most `ttl` where the backend `tells_ttl_remaining`, else absent.
/// Once released, nothing is listed.
inline void expect_list_held_prefix_limit_truncation_and_waiters(Client& holder, Client& waiters_client,
                                                                 Millis ttl, bool tells_ttl_remaining) {
  using namespace std::chrono_literals;
  auto& b = backend_of(holder);
  const std::vector<std::string> held_names = {"job/c",   "job/a", "job/%x", "jobs",
                                               "job%2Fq", "other", "job/b"};
  std::vector<Lease> leases;
  for (const auto& n : held_names) leases.push_back(holder.acquire(n, ttl_of(ttl)));
  detail::Error ec;
  b.put_record("job/record", "not a lock", detail::PutMode::always, ec);
  ASSERT_FALSE(ec);
  {
    Lease released = holder.acquire("job/released", ttl_of(ttl));
  }  // what is left of it on the server (a zk:// container is removed later): not held, not listed
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&] { Lease l = waiters_client.acquire("job/b", ttl_of(ttl, 60s)); });
  }
  ASSERT_TRUE(eventually([&] { return holder.status("job/b").waiters == 2u; }, 20s));

  bool truncated = true;
  auto all = list_ok(b, "job/", 100, truncated);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(names(all), (std::vector<std::string>{"job/%x", "job/a", "job/b", "job/c"}));
  for (const auto& l : all) {
    const LockInfo st = holder.status(l.name);
    EXPECT_TRUE(l.info.held);
    EXPECT_EQ(l.info.holder, st.holder) << l.name;
    EXPECT_EQ(l.info.token, st.token) << l.name;
    EXPECT_EQ(l.info.waiters, st.waiters) << l.name;
    if (tells_ttl_remaining) {
      ASSERT_TRUE(l.info.ttl_remaining.has_value()) << l.name;
      EXPECT_GT(l.info.ttl_remaining->count(), 0);
      EXPECT_LE(*l.info.ttl_remaining, ttl);
    } else {
      EXPECT_FALSE(l.info.ttl_remaining.has_value()) << "the backend cannot tell a holder's remaining TTL";
    }
  }
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[2].info.waiters, 2u);
  EXPECT_EQ(all[0].info.waiters, 0u);
  EXPECT_EQ(all[1].info.token, leases[1].token());

  auto two = list_ok(b, "job/", 2, truncated);
  EXPECT_TRUE(truncated);
  EXPECT_EQ(names(two), (std::vector<std::string>{"job/%x", "job/a"}));
  auto four = list_ok(b, "job/", 4, truncated);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(four.size(), 4u);
  EXPECT_TRUE(list_ok(b, "job/", 0, truncated).empty());
  EXPECT_TRUE(truncated);

  EXPECT_EQ(names(list_ok(b, "job", 100, truncated)),
            (std::vector<std::string>{"job%2Fq", "job/%x", "job/a", "job/b", "job/c", "jobs"}));
  EXPECT_EQ(names(list_ok(b, "", 100, truncated)),
            (std::vector<std::string>{"job%2Fq", "job/%x", "job/a", "job/b", "job/c", "jobs", "other"}));
  EXPECT_EQ(names(list_ok(b, "job%", 100, truncated)), std::vector<std::string>{"job%2Fq"});
  EXPECT_TRUE(list_ok(b, "nothing", 100, truncated).empty());
  EXPECT_FALSE(truncated);

  leases.clear();  // released: the waiters take job/b in turn and leave
  for (auto& t : waiters) t.join();
  EXPECT_TRUE(list_ok(b, "", 100, truncated).empty());
}

/// The record tool run against `tool_url` holds "doomed" (TTL `tool_ttl_ms`); `c` lists it;
/// SIGKILLed, it leaves the listing within 30 s (the time is printed).
inline void expect_expired_locks_not_listed(Client& c, const std::string& tool_url,
                                            const std::string& tool_ttl_ms, const std::string& tmp_name) {
  using namespace std::chrono_literals;
  TempDir dir(tmp_name);
  const std::string out = (dir.path() / "tool.out").string();
  Process tool = Process::spawn({DISTLOCK_RECORD_TOOL, tool_url, "r", "v", "doomed", tool_ttl_ms}, out);
  ASSERT_TRUE(wait_for_text(out, "ready", 20s)) << read_file(out);
  bool truncated = false;
  EXPECT_EQ(names(list_ok(backend_of(c), "", 10, truncated)), std::vector<std::string>{"doomed"});
  tool.signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_TRUE(eventually([&] { return list_ok(backend_of(c), "", 10, truncated).empty(); }, 30s));
  std::printf("expired lock left the listing after %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - killed).count()));
}

/// With a record written, `kill_server()` stops the only server: every record call fails
/// naming `where` (host:port), as expect_record_calls_unavailable (backend_records.hpp) checks.
inline void expect_records_calls_unavailable_naming(detail::Backend& b,
                                                    const std::function<void()>& kill_server,
                                                    const std::string& where) {
  detail::Error ec;
  b.put_record("k", "v", detail::PutMode::always, ec);
  ASSERT_FALSE(ec);
  kill_server();
  expect_record_calls_unavailable(b, where);
}

}  // namespace distlock::testing
