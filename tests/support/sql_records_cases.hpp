// The records case the mysql:// and postgres:// records tests (tests/mysql/mysql_records_test.cpp,
// tests/postgres/postgres_records_test.cpp) share beyond support/backend_records.hpp, through
// the internal Backend made by the backend's own factory (detail::make_mysql_backend,
// detail::make_postgres_backend):
//
//   backend_of(url, factory), expect_record_survives_its_writer_killed(url, factory, tmp_name,
//       settled)             from support/record_writer_killed.hpp (the file:// test runs it too)
//   expect_list_held_prefix_limit_truncated_and_status(a, b, ttl_read_apart, ghost_past_lease,
//                                                      ghost_within_lease, ghost_gone)
//   expect_listing_drops_a_killed_holder_when_status_does(url, b, holder_ttl_ms, tmp_name,
//                                                         session_gone, left_ms_now)
//   expect_record_calls_unavailable_naming_the_server(server, b)
//   expect_locks_but_record_calls_name_the_missing_table(b, records_table_absent)
//   expect_older_lock_table_locks_without_lock_delay_until_altered(owner, limited, account,
//                                                                  without_column, stored_delay_ms)
//
// Thread-safety: each call uses only its arguments.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/url.hpp"
#include "support/backend_records.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/record_writer_killed.hpp"

namespace distlock::testing {

/// Locks held by two clients `a` and `b` of one server (a binary name among them), one
/// released and a record: list_held with a prefix, a limit and truncation lists exactly the
/// held ones in name order, each as status() says (the time left equal, or with
/// `ttl_read_apart` as read a moment apart: never more, at most 500 ms less). Then the
/// released lock's row is made a ghost's: an owner whose session is alive but does not hold
/// the name, its lease over (`ghost_past_lease()`: status says free, not listed), then with
/// time left (`ghost_within_lease()`: held and listed), then `ghost_gone()`. Last, every
/// lock released: nothing listed.
inline void expect_list_held_prefix_limit_truncated_and_status(
    detail::Backend& a, detail::Backend& b, bool ttl_read_apart,
    const std::function<void()>& ghost_past_lease, const std::function<void()>& ghost_within_lease,
    const std::function<void()>& ghost_gone) {
  detail::Error ec;
  struct H {
    detail::Backend* b;
    std::string name, owner;
    Millis ttl;
    std::uint64_t token = 0;
  };
  std::vector<H> held = {
      {&a, "job/c", "oa", Millis(5000)}, {&b, "job/a", "ob", Millis(7000)},
      {&a, "other", "oa", Millis(5000)}, {&a, "job/b", "oa2", Millis(9000)},
      {&b, "jobs", "ob", Millis(5000)},  {&a, std::string("job/\x01"), "oa", Millis(5000)}};
  for (auto& h : held) {
    auto r = h.b->try_acquire(detail::AcquireRequest{h.name, h.owner, h.ttl}, ec);
    ASSERT_TRUE(r.acquired) << h.name << " " << ec.message();
    h.token = r.token;
  }
  // Released locks and records are never listed.
  auto gone = a.try_acquire(detail::AcquireRequest{"job/released", "o", Millis(5000)}, ec);
  ASSERT_TRUE(gone.acquired);
  ASSERT_EQ(a.release("job/released", "o", gone.token, ec), detail::ReleaseStatus::released);
  put(a, "job/record-only", "v", detail::PutMode::always);

  bool truncated = true;
  EXPECT_EQ(names(a, "job/", 100, truncated),
            (std::vector<std::string>{std::string("job/\x01"), "job/a", "job/b", "job/c"}));
  EXPECT_FALSE(truncated);
  EXPECT_EQ(names(a, "job/", 2, truncated), (std::vector<std::string>{std::string("job/\x01"), "job/a"}));
  EXPECT_TRUE(truncated);
  EXPECT_EQ(names(a, "job/", 4, truncated).size(), 4u);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(names(b, "", 100, truncated),
            (std::vector<std::string>{std::string("job/\x01"), "job/a", "job/b", "job/c", "jobs", "other"}));
  EXPECT_EQ(names(a, "zzz", 100, truncated), std::vector<std::string>{});
  EXPECT_EQ(names(a, "", 0, truncated), std::vector<std::string>{});
  EXPECT_TRUE(truncated);

  auto listed = b.list_held("", 100, truncated, ec);
  ASSERT_FALSE(ec);
  ASSERT_EQ(listed.size(), held.size());
  for (const auto& l : listed) {
    const auto st = a.status(l.name, ec);
    EXPECT_TRUE(l.info.held) << l.name;
    EXPECT_EQ(st.held, l.info.held) << l.name;
    EXPECT_EQ(st.token, l.info.token) << l.name;
    EXPECT_EQ(st.holder, l.info.holder) << l.name;
    if (ttl_read_apart) {
      // Both count the time left from the row's seen_at, read a moment apart (status
      // after the listing): never more, and not much less.
      ASSERT_TRUE(st.ttl_remaining && l.info.ttl_remaining) << l.name;
      EXPECT_LE(*st.ttl_remaining, *l.info.ttl_remaining) << l.name;
      EXPECT_GT(*st.ttl_remaining, *l.info.ttl_remaining - Millis(500)) << l.name;
    } else {
      EXPECT_EQ(st.ttl_remaining, l.info.ttl_remaining) << l.name;
    }
  }

  ghost_past_lease();
  EXPECT_FALSE(a.status("job/released", ec).held);
  EXPECT_EQ(names(a, "job/r", 100, truncated), std::vector<std::string>{});
  ghost_within_lease();
  EXPECT_TRUE(a.status("job/released", ec).held);
  EXPECT_EQ(names(a, "job/r", 100, truncated), std::vector<std::string>{"job/released"});
  ghost_gone();

  for (auto& h : held)
    EXPECT_EQ(h.b->release(h.name, h.owner, h.token, ec), detail::ReleaseStatus::released) << h.name;
  EXPECT_EQ(names(a, "", 100, truncated), std::vector<std::string>{});
  EXPECT_FALSE(truncated);
}

/// A lock_tool holder (TTL `holder_ttl_ms`) of "svc/worker" is listed with its token; once
/// SIGKILLed and `session_gone()` (bounded, 20 s), while `left_ms()` (the server's count of its
/// lease's time left) says more than 300 ms are left, status() and the listing say held; within
/// 20 s after, it is neither listed nor held.
inline void expect_listing_drops_a_killed_holder_when_status_does(
    const std::string& url, detail::Backend& b, long holder_ttl_ms, const std::string& tmp_name,
    const std::function<bool()>& session_gone, const std::function<long long()>& left_ms_now) {
  using namespace std::chrono_literals;
  TempDir tmp(tmp_name);
  const std::string out = (tmp.path() / "holder.out").string();
  Process p = spawn_holder(url, "svc/worker", out, holder_ttl_ms);
  ASSERT_TRUE(wait_for_text(out, "acquired", 60s)) << read_file(out);
  bool truncated = false;
  detail::Error ec;
  auto listed = b.list_held("svc/", 10, truncated, ec);
  ASSERT_FALSE(ec);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].name, "svc/worker");
  EXPECT_EQ(static_cast<long long>(listed[0].info.token.value_or(0)), acquired_token(out));
  p.signal(SIGKILL);
  ASSERT_NE(p.wait_for(30s), -1);
  // Its session is gone (the server noticed the closed socket), its lease not yet:
  // while the server says > 300 ms are left, status() and the listing say held.
  ASSERT_TRUE(eventually(session_gone, 20s));
  const long long left_ms = left_ms_now();
  const auto measured = std::chrono::steady_clock::now();
  if (left_ms > 300) {
    const bool held = b.status("svc/worker", ec).held;
    const auto now_listed = names(b, "svc/", 10, truncated);
    if (std::chrono::steady_clock::now() - measured < Millis(left_ms - 100)) {
      EXPECT_TRUE(held);
      EXPECT_EQ(now_listed, std::vector<std::string>{"svc/worker"});
    }
  }
  EXPECT_TRUE(eventually([&] { return names(b, "svc/", 10, truncated).empty(); }, 20s))
      << "still listed after its TTL";
  EXPECT_FALSE(b.status("svc/worker", ec).held);
}

/// With a record "k" = "v" written by `b`, `server` (a MariadbServer, a PostgresServer) is
/// stopped: every record call fails naming 127.0.0.1:port and never the server's password
/// (expect_record_calls_unavailable, backend_records.hpp). Restarted, `b` reads "v" again (its
/// shared connection reopened).
template <class Server>
void expect_record_calls_unavailable_naming_the_server(Server& server, detail::Backend& b) {
  put(b, "k", "v", detail::PutMode::always);
  server.stop();
  expect_record_calls_unavailable(b, "127.0.0.1:" + std::to_string(server.port()), Server::kPassword);
  server.restart();
  EXPECT_EQ(get(b, "k"), "v");  // the shared connection is reopened
}

/// `b`, a client of an account that may use the lock table but not create the missing records
/// table, takes and releases a lock; its put fails naming distlock_records, and
/// `records_table_absent()` then checks on the server that no records table was made.
inline void expect_locks_but_record_calls_name_the_missing_table(
    detail::Backend& b, const std::function<void()>& records_table_absent) {
  detail::Error ec;
  auto got = b.try_acquire(detail::AcquireRequest{"x", "o", Millis(5000)}, ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_TRUE(got.acquired);
  ec.clear();
  b.put_record("x", "v", detail::PutMode::always, ec);
  EXPECT_TRUE(ec);
  const std::string detail = ec.take_detail();
  EXPECT_NE(detail.find("distlock_records"), std::string::npos) << detail;
  ASSERT_NO_FATAL_FAILURE(records_table_absent());
  b.release("x", "o", got.token, ec);
}

/// An upgrade from before lock-delay: the lock table has no delay_ms column and `limited()`
/// makes a client of `account` ("an account", "a role") that may read and write it but not alter it. That
/// client connects and locks, without lock-delay (Capabilities::lock_delay false); `without_column(b, token)`
/// then ends its lease of "x" (owner "o") the backend's way. Once `owner()`, a client that may alter the
/// table, has connected (the column added), a new limited client has lock-delay, and a lease taken with 1,500
/// ms of it stores that
/// (`stored_delay_ms()`, read on the server).
inline void expect_older_lock_table_locks_without_lock_delay_until_altered(
    const MakeBackend& owner, const MakeBackend& limited, const std::string& account,
    const std::function<void(detail::Backend&, std::uint64_t)>& without_column,
    const std::function<std::string()>& stored_delay_ms) {
  auto b = limited();
  ASSERT_TRUE(b) << account << " that cannot ALTER the older table can no longer connect";
  detail::Error ec;
  auto got = b->try_acquire(detail::AcquireRequest{"x", "o", Millis(5000)}, ec);
  EXPECT_FALSE(ec) << ec.message();
  ASSERT_TRUE(got.acquired);
  EXPECT_FALSE(b->capabilities().lock_delay);
  ASSERT_NO_FATAL_FAILURE(without_column(*b, got.token));

  owner().reset();  // an account that may alter the table: the column is added
  auto after = limited();
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->capabilities().lock_delay);
  detail::AcquireRequest req{"x", "o2", Millis(5000)};
  req.lock_delay = Millis(1500);
  got = after->try_acquire(req, ec);
  EXPECT_FALSE(ec) << ec.message();
  ASSERT_TRUE(got.acquired);
  EXPECT_EQ(stored_delay_ms(), "1500");
  after->release("x", "o2", got.token, ec);
}

}  // namespace distlock::testing
