// Shard groups through the C API (include/distlock/distlock.h, distlock_shard_group_*), against
// real servers: file:// in a temporary directory and redis:// started by with_servers
// (bindings/tests/with_servers.cpp, DISTLOCK_TEST_REDIS_URL / _PORT). A backend of the build
// without its URL fails, never skips.
//
// Bounds are measured on this process's steady clock; with TTL 2 s and a rebalance period of
// 100 ms, a leave is balanced within `period + 1.5 s` (docs/sharding.md's bound: one period plus
// the round trips of a list, a release and an acquisition on a loaded 2-core machine).
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.h"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;
using distlock::testing::Process;
using distlock::testing::TempDir;
using Clock = std::chrono::steady_clock;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

struct ClientDeleter {
  void operator()(distlock_client* c) const noexcept { distlock_client_close(c); }
};
struct GroupDeleter {
  void operator()(distlock_shard_group* g) const noexcept { distlock_shard_group_free(g); }
};
struct AssignmentDeleter {
  void operator()(distlock_shard_assignment* a) const noexcept { distlock_shard_assignment_free(a); }
};
using ClientPtr = std::unique_ptr<distlock_client, ClientDeleter>;
using GroupPtr = std::unique_ptr<distlock_shard_group, GroupDeleter>;
using AssignmentPtr = std::unique_ptr<distlock_shard_assignment, AssignmentDeleter>;

ClientPtr connect_ok(const std::string& url) {
  distlock_client* c = nullptr;
  distlock_error err{};
  EXPECT_EQ(distlock_connect(url.c_str(), nullptr, &c, &err), DISTLOCK_OK) << err.message;
  return ClientPtr(c);
}

distlock_shard_group_options group_opts(const char* member_id) {
  distlock_shard_group_options o;
  distlock_shard_group_options_init(&o);
  o.ttl_ms = 2000;
  o.rebalance_period_ms = 100;
  o.member_id = member_id;
  return o;
}

GroupPtr join_ok(distlock_client* c, const char* job, std::uint32_t shards, const char* member_id) {
  distlock_shard_group* g = nullptr;
  distlock_error err{};
  const auto o = group_opts(member_id);
  EXPECT_EQ(distlock_shard_group_join(c, job, shards, &o, &g, &err), DISTLOCK_OK) << err.message;
  return GroupPtr(g);
}

AssignmentPtr assigned(distlock_shard_group* g) {
  distlock_shard_assignment* a = nullptr;
  distlock_error err{};
  EXPECT_EQ(distlock_shard_group_assigned(g, &a, &err), DISTLOCK_OK) << err.message;
  return AssignmentPtr(a);
}

// index -> token of an assignment.
std::map<std::uint32_t, std::uint64_t> shards_of(const distlock_shard_assignment* a) {
  std::map<std::uint32_t, std::uint64_t> out;
  for (std::size_t i = 0; i < distlock_shard_assignment_count(a); ++i) {
    distlock_owned_shard s{};
    distlock_error err{};
    EXPECT_EQ(distlock_shard_assignment_shard(a, i, &s, &err), DISTLOCK_OK) << err.message;
    EXPECT_EQ(s.has_token, 1) << "shard " << s.index;
    out[s.index] = s.token;
  }
  return out;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

// Waits (bounded by `deadline`) on the group's changed descriptor until `done(assignment)`;
// returns the last assignment read.
template <class Pred>
AssignmentPtr wait_until(distlock_shard_group* g, Clock::time_point deadline, Pred done) {
  AssignmentPtr a = assigned(g);
  while (a && !done(a.get()) && Clock::now() < deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{distlock_shard_group_changed_fd(g), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(1, left.count())));
    if ((p.revents & POLLIN) != 0) {
      std::uint64_t n = 0;
      [[maybe_unused]] const ssize_t r = ::read(p.fd, &n, sizeof n);  // clears it
    }
    a = assigned(g);
  }
  return a;
}

// ---- bad input and a closed group --------------------------------------------------------------

TEST(CShardGroupErrors, ZeroShardsBadJobBadMemberIdAndALeftGroupGetClearErrors) {
  TempDir dir("distlock-cshard");
  ClientPtr client = connect_ok("file://" + dir.path().string());
  ASSERT_TRUE(client);
  distlock_shard_group* g = nullptr;
  distlock_error err{};
  const auto o = group_opts("m1");
  EXPECT_EQ(distlock_shard_group_join(client.get(), "jobs", 0, &o, &g, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("shards 0"), std::string::npos) << err.message;
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(distlock_shard_group_join(client.get(), "", 4, &o, &g, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("job name is empty"), std::string::npos) << err.message;
  EXPECT_EQ(distlock_shard_group_join(client.get(), nullptr, 4, &o, &g, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("job name is NULL"), std::string::npos) << err.message;
  const auto bad_id = group_opts("no spaces");
  EXPECT_EQ(distlock_shard_group_join(client.get(), "jobs", 4, &bad_id, &g, &err),
            DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("member_id"), std::string::npos) << err.message;
  auto bad_period = group_opts("m1");
  bad_period.rebalance_period_ms = 5;
  EXPECT_EQ(distlock_shard_group_join(client.get(), "jobs", 4, &bad_period, &g, &err),
            DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("rebalance_period"), std::string::npos) << err.message;
  EXPECT_EQ(g, nullptr);

  GroupPtr member = join_ok(client.get(), "jobs", 4, "m1");
  ASSERT_TRUE(member);
  EXPECT_STREQ(distlock_shard_group_member_id(member.get()), "m1");
  // The same member id twice: busy.
  EXPECT_EQ(distlock_shard_group_join(client.get(), "jobs", 4, &o, &g, &err), DISTLOCK_E_BUSY) << err.message;

  // All four shards come to the only member; then nothing changes: a timed-out wait.
  AssignmentPtr all = wait_until(member.get(), Clock::now() + 10s, [](const distlock_shard_assignment* a) {
    return distlock_shard_assignment_count(a) == 4;
  });
  ASSERT_EQ(distlock_shard_assignment_count(all.get()), 4u);
  const std::uint64_t v = distlock_shard_assignment_version(all.get());
  distlock_shard_assignment* raw = nullptr;
  const auto t0 = Clock::now();
  EXPECT_EQ(distlock_shard_group_wait_change(member.get(), v, 150, nullptr, &raw, &err), DISTLOCK_E_TIMEOUT);
  EXPECT_GE(Clock::now() - t0, 150ms);
  EXPECT_NE(std::string(err.message).find("no change within 150 ms"), std::string::npos) << err.message;
  EXPECT_EQ(raw, nullptr);
  EXPECT_EQ(distlock_shard_group_wait_change(member.get(), v, -7, nullptr, &raw, &err),
            DISTLOCK_E_INVALID_ARGUMENT);

  // A wait cancelled from another thread ends promptly (bound: 2 s for a 100 ms cancel).
  distlock_cancel* cancel = nullptr;
  ASSERT_EQ(distlock_cancel_new(&cancel, &err), DISTLOCK_OK);
  std::thread canceller([&] {
    std::this_thread::sleep_for(100ms);  // lets the wait start; the result is the same if it has not
    distlock_cancel_request(cancel);
  });
  const auto t1 = Clock::now();
  EXPECT_EQ(distlock_shard_group_wait_change(member.get(), v, DISTLOCK_WAIT_FOREVER, cancel, &raw, &err),
            DISTLOCK_E_CANCELLED)
      << err.message;
  EXPECT_LT(Clock::now() - t1, 2s);
  canceller.join();
  distlock_cancel_free(cancel);

  // A timeout too large for the clock (INT64_MAX ms) is no limit, not an instant timeout
  // (wait_for overflowed the clock's nanoseconds): only the cancel ends this wait.
  ASSERT_EQ(distlock_cancel_new(&cancel, &err), DISTLOCK_OK);
  std::thread canceller2([&] {
    std::this_thread::sleep_for(100ms);
    distlock_cancel_request(cancel);
  });
  const auto t2 = Clock::now();
  EXPECT_EQ(distlock_shard_group_wait_change(member.get(), v, INT64_MAX, cancel, &raw, &err),
            DISTLOCK_E_CANCELLED)
      << err.message;
  EXPECT_GE(Clock::now() - t2, 100ms);
  canceller2.join();
  distlock_cancel_free(cancel);

  // A wait in progress ends when another thread leaves; later calls name the closed group.
  std::thread leaver([&] {
    std::this_thread::sleep_for(100ms);
    distlock_shard_group_leave(member.get());
  });
  EXPECT_EQ(distlock_shard_group_wait_change(member.get(), v, 10000, nullptr, &raw, &err),
            DISTLOCK_E_NOT_OWNER)
      << err.message;
  leaver.join();
  EXPECT_NE(std::string(err.message).find("has left the group"), std::string::npos) << err.message;
  EXPECT_EQ(distlock_shard_group_assigned(member.get(), &raw, &err), DISTLOCK_E_NOT_OWNER);
  EXPECT_NE(std::string(err.message).find("jobs"), std::string::npos) << err.message;
  EXPECT_EQ(raw, nullptr);
  // The earlier snapshot stays valid; its shards were stopped by the leave.
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(distlock_shard_assignment_owns(all.get(), i), 0) << i;
    distlock_owned_shard s{};
    ASSERT_EQ(distlock_shard_assignment_shard(all.get(), i, &s, &err), DISTLOCK_OK);
    EXPECT_TRUE(readable(s.stopped_fd)) << i;
  }
  distlock_owned_shard s{};
  EXPECT_EQ(distlock_shard_assignment_shard(all.get(), 4, &s, &err), DISTLOCK_E_INVALID_ARGUMENT);
  distlock_shard_group_leave(member.get());  // idempotent
}

// ---- reading the assignment again --------------------------------------------------------------

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A caller that only reads owns() opens no descriptor: a shard's stopped_fd is opened by the
// first distlock_shard_assignment_shard for it (before, every assignment opened one per shard).
// distlock_shard_assignment_ownership names the same ownership in two live assignments with
// the same non-zero id, a different one per shard, and a new one once the shard was lost and
// taken again.
TEST(CShardGroupAssignment, OwnsOpensNoDescriptorAndOwnershipIdsMatchAcrossReads) {
  TempDir dir("distlock-cshard");
  ClientPtr client = connect_ok("file://" + dir.path().string());
  ASSERT_TRUE(client);
  // One rebalance, at the join (a lone member takes every shard in it): no listing of the
  // group's directory opens a descriptor while this test counts them.
  auto join_once = [&](const char* id) {
    distlock_shard_group* g = nullptr;
    distlock_error e{};
    auto o = group_opts(id);
    o.rebalance_period_ms = 3600 * 1000;
    EXPECT_EQ(distlock_shard_group_join(client.get(), "ids", 4, &o, &g, &e), DISTLOCK_OK) << e.message;
    return GroupPtr(g);
  };
  GroupPtr member = join_once("solo");
  ASSERT_TRUE(member);
  AssignmentPtr first = wait_until(member.get(), Clock::now() + 10s, [](const distlock_shard_assignment* a) {
    return distlock_shard_assignment_count(a) == 4;
  });
  ASSERT_EQ(distlock_shard_assignment_count(first.get()), 4u);
  const std::size_t fds = open_fds();
  std::vector<AssignmentPtr> reads;
  for (int r = 0; r < 50; ++r) {
    reads.push_back(assigned(member.get()));
    for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(distlock_shard_assignment_owns(reads.back().get(), i), 1);
  }
  EXPECT_EQ(open_fds(), fds) << "50 assignments read only through owns() opened descriptors";
  std::set<std::uint64_t> ids;
  for (std::size_t i = 0; i < 4; ++i) {
    const std::uint64_t id = distlock_shard_assignment_ownership(first.get(), i);
    EXPECT_NE(id, 0u) << i;
    ids.insert(id);
    for (const auto& a : reads) EXPECT_EQ(distlock_shard_assignment_ownership(a.get(), i), id) << i;
  }
  EXPECT_EQ(ids.size(), 4u) << "two shards share an ownership id";
  EXPECT_EQ(distlock_shard_assignment_ownership(first.get(), 4), 0u);
  EXPECT_EQ(distlock_shard_assignment_ownership(nullptr, 0), 0u);
  // The first read of a shard opens its descriptor; a second read gives the same one.
  distlock_owned_shard s{}, again{};
  distlock_error err{};
  ASSERT_EQ(distlock_shard_assignment_shard(first.get(), 0, &s, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_shard_assignment_shard(first.get(), 0, &again, &err), DISTLOCK_OK) << err.message;
  EXPECT_GE(s.stopped_fd, 0);
  EXPECT_EQ(again.stopped_fd, s.stopped_fd);
  EXPECT_FALSE(readable(s.stopped_fd));
  EXPECT_EQ(open_fds(), fds + 1);
  reads.clear();
  distlock_shard_group_leave(member.get());
  EXPECT_TRUE(readable(s.stopped_fd)) << "the leave did not fire the shard's descriptor";
  // A new member takes the shards again: new ownerships, new ids (the old ones are alive in
  // `first`, so no address can repeat).
  GroupPtr next = join_once("next");
  ASSERT_TRUE(next);
  AssignmentPtr taken = wait_until(next.get(), Clock::now() + 10s, [](const distlock_shard_assignment* a) {
    return distlock_shard_assignment_count(a) == 4;
  });
  ASSERT_EQ(distlock_shard_assignment_count(taken.get()), 4u);
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_EQ(ids.count(distlock_shard_assignment_ownership(taken.get(), i)), 0u) << i;
}

// ---- per backend -------------------------------------------------------------------------------

class CShardGroup : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    kind_ = GetParam();
    prefix_ = "cshard" + std::to_string(::getpid()) + "t" + std::to_string(counter_++);
    if (kind_ == "file") {
      url_ = "file://" + dir_.path().string();
    } else {
      const char* u = env("DISTLOCK_TEST_REDIS_URL");
      ASSERT_NE(u, nullptr) << "DISTLOCK_TEST_REDIS_URL is not set (run through with_servers --redis)";
      url_ = std::string(u) + "?prefix=" + prefix_;
    }
  }
  static inline int counter_ = 0;
  std::string kind_, url_, prefix_;
  TempDir dir_{"distlock-cshard"};
};

// Two members split 8 shards 4/4, disjoint and covering all, each with the shard lock's token;
// one leaves: its shards' stop descriptors fire before leave returns, and the other owns all 8
// within period + 1.5 s, with larger tokens for the shards that moved.
TEST_P(CShardGroup, TwoMembersSplitEvenlyAndOneLeavingHandsItsShardsOver) {
  constexpr std::uint32_t M = 8;
  ClientPtr ca = connect_ok(url_), cb = connect_ok(url_);
  ASSERT_TRUE(ca && cb);
  GroupPtr a = join_ok(ca.get(), "reindex", M, "a");
  GroupPtr b = join_ok(cb.get(), "reindex", M, "b");
  ASSERT_TRUE(a && b);

  auto half = [](const distlock_shard_assignment* x) {
    return distlock_shard_assignment_count(x) == M / 2 && distlock_shard_assignment_members(x) == 2;
  };
  const auto deadline = Clock::now() + 15s;
  AssignmentPtr sa = wait_until(a.get(), deadline, half);
  AssignmentPtr sb = wait_until(b.get(), deadline, half);
  // Read both again until neither changed in between (a settles while b is read).
  for (int i = 0; i < 50 && Clock::now() < deadline; ++i) {
    sa = wait_until(a.get(), deadline, half);
    sb = wait_until(b.get(), deadline, half);
    if (half(sa.get()) && half(sb.get())) break;
  }
  ASSERT_TRUE(half(sa.get())) << distlock_shard_assignment_count(sa.get());
  ASSERT_TRUE(half(sb.get())) << distlock_shard_assignment_count(sb.get());
  const auto owned_a = shards_of(sa.get());
  const auto owned_b = shards_of(sb.get());
  std::set<std::uint32_t> all;
  for (const auto& [i, t] : owned_a) all.insert(i);
  for (const auto& [i, t] : owned_b) {
    EXPECT_FALSE(owned_a.contains(i)) << "shard " << i << " owned by both members";
    all.insert(i);
  }
  EXPECT_EQ(all.size(), M);
  EXPECT_EQ(*all.rbegin(), M - 1);
  // Each token is the one the shard lock's status shows.
  for (const auto& owned : {owned_a, owned_b}) {
    for (const auto& [i, token] : owned) {
      char* json = nullptr;
      distlock_error err{};
      const std::string name = "reindex/shard/" + std::to_string(i);
      ASSERT_EQ(distlock_status_json(ca.get(), name.c_str(), &json, &err), DISTLOCK_OK) << err.message;
      const std::string status = json;
      distlock_string_free(json);
      const std::string field = "\"token\":" + std::to_string(token);
      const auto at = status.find(field);
      const bool found = at != std::string::npos && at + field.size() < status.size() &&
                         (status[at + field.size()] == ',' || status[at + field.size()] == '}');
      EXPECT_TRUE(found) << name << " " << status;
    }
  }
  for (std::size_t i = 0; i < M / 2; ++i) EXPECT_EQ(distlock_shard_assignment_owns(sb.get(), i), 1) << i;

  // b leaves: every shard it owned is stopped by the time leave returns.
  const auto left_at = Clock::now();
  distlock_shard_group_leave(b.get());
  for (std::size_t i = 0; i < M / 2; ++i) {
    distlock_owned_shard s{};
    distlock_error err{};
    ASSERT_EQ(distlock_shard_assignment_shard(sb.get(), i, &s, &err), DISTLOCK_OK);
    EXPECT_TRUE(readable(s.stopped_fd)) << "shard " << s.index;
    EXPECT_EQ(distlock_shard_assignment_owns(sb.get(), i), 0) << "shard " << s.index;
  }
  const auto bound = 100ms + 1500ms;
  AssignmentPtr whole = wait_until(a.get(), left_at + 10s, [](const distlock_shard_assignment* x) {
    return distlock_shard_assignment_count(x) == M;
  });
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - left_at);
  ASSERT_EQ(distlock_shard_assignment_count(whole.get()), M);
  std::printf("[%s] a leave was balanced in %lld ms (bound %lld ms)\n", kind_.c_str(),
              static_cast<long long>(took.count()), static_cast<long long>(bound.count()));
  EXPECT_LE(took, bound);
  const auto after = shards_of(whole.get());
  for (const auto& [i, token] : owned_b) {
    ASSERT_TRUE(after.contains(i));
    EXPECT_GT(after.at(i), token) << "shard " << i << ": the new owner's token is not larger";
  }
  for (const auto& [i, token] : owned_a)
    EXPECT_EQ(after.at(i), token) << "shard " << i << " moved (not sticky)";
}

std::vector<std::string> backends() {
  std::vector<std::string> out{"file"};
#ifdef DISTLOCK_TEST_REDIS
  out.push_back("redis");
#endif
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, CShardGroup, ::testing::ValuesIn(backends()),
                         [](const auto& p) { return p.param; });

#ifdef DISTLOCK_TEST_REDIS
// A shard whose lock is taken away on the server (its key deleted, as a server-side expiry would)
// is signalled lost: its renewal is refused, its stopped descriptor becomes readable and owns()
// turns 0 within the TTL (2 s; bound asserted: TTL + 1 s), the changed descriptor fires, and the
// member owns it again later with a larger token.
TEST(CShardGroupLoss, AShardWhoseLockIsGoneOnTheServerIsSignalledLost) {
  const char* base = env("DISTLOCK_TEST_REDIS_URL");
  const char* port = env("DISTLOCK_TEST_REDIS_PORT");
  ASSERT_NE(base, nullptr) << "DISTLOCK_TEST_REDIS_URL is not set (run through with_servers --redis)";
  ASSERT_NE(port, nullptr) << "DISTLOCK_TEST_REDIS_PORT is not set";
  const std::string prefix = "cshardloss" + std::to_string(::getpid());
  ClientPtr client = connect_ok(std::string(base) + "?prefix=" + prefix);
  ASSERT_TRUE(client);
  GroupPtr g = join_ok(client.get(), "etl", 2, "solo");
  ASSERT_TRUE(g);
  AssignmentPtr both = wait_until(g.get(), Clock::now() + 10s, [](const distlock_shard_assignment* x) {
    return distlock_shard_assignment_count(x) == 2;
  });
  ASSERT_EQ(distlock_shard_assignment_count(both.get()), 2u);
  distlock_owned_shard s0{};
  distlock_error err{};
  ASSERT_EQ(distlock_shard_assignment_shard(both.get(), 0, &s0, &err), DISTLOCK_OK);
  ASSERT_EQ(s0.index, 0u);
  EXPECT_FALSE(readable(s0.stopped_fd));
  const std::uint64_t version = distlock_shard_assignment_version(both.get());

  redisContext* ctx = redisConnect("127.0.0.1", std::atoi(port));
  ASSERT_TRUE(ctx != nullptr && ctx->err == 0) << "cannot reach redis on port " << port;
  const std::string key = prefix + ":{etl/shard/0}";
  auto* r = static_cast<redisReply*>(redisCommand(ctx, "DEL %s", key.c_str()));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->integer, 1) << "no key " << key;
  freeReplyObject(r);
  redisFree(ctx);
  const auto deleted_at = Clock::now();

  pollfd p{s0.stopped_fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 3000), 1) << "shard 0 was not signalled lost within 3 s";
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - deleted_at);
  std::printf("[redis] a shard whose lock was deleted was signalled lost in %lld ms (bound 3000 ms)\n",
              static_cast<long long>(took.count()));
  EXPECT_EQ(distlock_shard_assignment_owns(both.get(), 0), 0);
  EXPECT_EQ(distlock_shard_assignment_owns(both.get(), 1), 1);  // the other shard is untouched

  // The change is published; a wait for it returns (bound 3 s).
  distlock_shard_assignment* raw = nullptr;
  ASSERT_EQ(distlock_shard_group_wait_change(g.get(), version, 3000, nullptr, &raw, &err), DISTLOCK_OK)
      << err.message;
  AssignmentPtr changed(raw);
  EXPECT_GT(distlock_shard_assignment_version(changed.get()), version);
  // The descriptor is written right after the new version is visible (bound 2 s).
  pollfd changed_fd{distlock_shard_group_changed_fd(g.get()), POLLIN, 0};
  EXPECT_EQ(::poll(&changed_fd, 1, 2000), 1) << "the changed descriptor did not fire";

  // Owned again at a later rebalance, with a larger token.
  AssignmentPtr again = wait_until(g.get(), Clock::now() + 10s, [](const distlock_shard_assignment* x) {
    return distlock_shard_assignment_count(x) == 2;
  });
  const auto now = shards_of(again.get());
  ASSERT_TRUE(now.contains(0));
  EXPECT_GT(now.at(0), s0.token);
}

// distlock_shard_assignment_owns is never late: once the server froze (SIGSTOP: renewals go
// unanswered, the server's lease timers stop too, so nobody else could take the shard — the
// check is about this member's own belief), the last renewal that can have been confirmed was
// sent before the freeze, so the shard's local deadline is at most freeze + TTL (minus the safety
// margin). Every call that starts at or after freeze + TTL must answer 0, whenever the
// watchdog fires the stop descriptor. Read in a tight loop until freeze + TTL + 300 ms, on this
// process's steady clock (the library's CLOCK_BOOTTIME runs at the same rate).
TEST(CShardGroupLoss, OwnsIsZeroFromTheShardsDeadlineOnWhenTheServerFreezes) {
  const char* base = env("DISTLOCK_TEST_REDIS_URL");
  const char* pid = env("DISTLOCK_TEST_REDIS_PID");
  ASSERT_NE(base, nullptr) << "DISTLOCK_TEST_REDIS_URL is not set (run through with_servers --redis)";
  ASSERT_NE(pid, nullptr) << "DISTLOCK_TEST_REDIS_PID is not set";
  const pid_t server = static_cast<pid_t>(std::atol(pid));
  ClientPtr client = connect_ok(std::string(base) + "?prefix=cshardfreeze" + std::to_string(::getpid()));
  ASSERT_TRUE(client);
  GroupPtr g = join_ok(client.get(), "etl", 1, "solo");
  ASSERT_TRUE(g);
  AssignmentPtr one = wait_until(g.get(), Clock::now() + 10s, [](const distlock_shard_assignment* x) {
    return distlock_shard_assignment_count(x) == 1;
  });
  ASSERT_EQ(distlock_shard_assignment_count(one.get()), 1u);
  distlock_owned_shard s0{};
  distlock_error err{};
  ASSERT_EQ(distlock_shard_assignment_shard(one.get(), 0, &s0, &err), DISTLOCK_OK);

  struct Thaw {
    pid_t pid;
    ~Thaw() { ::kill(pid, SIGCONT); }
  } thaw{server};
  ASSERT_EQ(::kill(server, SIGSTOP), 0);
  const auto frozen = Clock::now();
  const auto deadline_bound = frozen + std::chrono::milliseconds(group_opts("x").ttl_ms);
  std::optional<Clock::duration> first_zero;
  long late_ones = 0, reads_after_bound = 0;
  while (true) {
    const auto start = Clock::now();
    if (start >= deadline_bound + 300ms) break;
    const int owns = distlock_shard_assignment_owns(one.get(), 0);
    if (owns == 0 && !first_zero) first_zero = start - frozen;
    if (start >= deadline_bound) {
      ++reads_after_bound;
      if (owns != 0) ++late_ones;
    }
    std::this_thread::sleep_for(1ms);
  }
  ::kill(server, SIGCONT);
  ASSERT_TRUE(first_zero.has_value()) << "owns() never turned 0 after the server froze";
  std::printf(
      "[redis] owns() turned 0 %lld ms after the server froze (bound: TTL %lld ms); %ld reads after the "
      "bound\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(*first_zero).count()),
      static_cast<long long>(group_opts("x").ttl_ms), reads_after_bound);
  EXPECT_GT(reads_after_bound, 0);
  EXPECT_EQ(late_ones, 0) << "owns() answered 1 past the shard's latest possible local deadline";
  EXPECT_EQ(distlock_shard_assignment_owns(one.get(), 0), 0);
}
#endif  // DISTLOCK_TEST_REDIS

// The example of docs/c.md (bindings/c/tests/shard_example.c), compiled as C99 and run on
// file:// and, when built, redis://.
TEST(CShardGroupExample, TheDocsExampleRuns) {
  TempDir work("distlock-cshard-example");
  std::vector<std::string> urls{"file://" + work.path().string()};
#ifdef DISTLOCK_TEST_REDIS
  const char* redis = env("DISTLOCK_TEST_REDIS_URL");
  ASSERT_NE(redis, nullptr);
  urls.push_back(std::string(redis) + "?prefix=cshardexample" + std::to_string(::getpid()));
#endif
  int n = 0;
  for (const auto& url : urls) {
    const auto out = work.path() / ("out" + std::to_string(n++));
    Process p = Process::spawn({C_SHARD_EXAMPLE_PATH, url}, out.string());
    const int status = p.wait_for(60s);
    std::ifstream in(out);
    std::stringstream s;
    s << in.rdbuf();
    ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << url << ": " << s.str();
    for (int i = 0; i < 4; ++i)
      EXPECT_NE(s.str().find("shard " + std::to_string(i) + " reindexed with token "), std::string::npos)
          << s.str();
    EXPECT_NE(s.str().find("shard 0 stopped: 1"), std::string::npos) << s.str();
  }
}

}  // namespace
