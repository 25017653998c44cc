// The C API's contract (include/distlock/distlock.h, issue 29 §1 and §4), against real servers:
// file:// in a temporary directory, and redis:// / etcd:// started by with_servers
// (bindings/tests/with_servers.cpp), whose addresses come in DISTLOCK_TEST_REDIS_URL and
// DISTLOCK_TEST_ETCD_URL. Every backend of the build is tested; one without its URL fails,
// never skips.
//
// The test links only libdistlock_c (the C API) and talks to the servers directly (hiredis,
// etcdctl) to count what is left on them.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
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

std::string tool() {
  return C_API_TOOL_PATH;
}

struct ClientDeleter {
  void operator()(distlock_client* c) const noexcept { distlock_client_close(c); }
};
struct LeaseDeleter {
  void operator()(distlock_lease* l) const noexcept { distlock_lease_free(l); }
};
using ClientPtr = std::unique_ptr<distlock_client, ClientDeleter>;
using LeasePtr = std::unique_ptr<distlock_lease, LeaseDeleter>;

ClientPtr connect_ok(const std::string& url) {
  distlock_client* c = nullptr;
  distlock_error err{};
  const int rc = distlock_connect(url.c_str(), nullptr, &c, &err);
  EXPECT_EQ(rc, DISTLOCK_OK) << err.message;
  return ClientPtr(c);
}

distlock_lock_options opts_with(std::int64_t ttl_ms, std::int64_t wait_ms) {
  distlock_lock_options o;
  distlock_lock_options_init(&o);
  o.ttl_ms = ttl_ms;
  o.wait_ms = wait_ms;
  return o;
}

std::string take_string(char* s) {
  std::string out = s != nullptr ? s : "";
  distlock_string_free(s);
  return out;
}

// Redis keys under a prefix, read with a plain hiredis connection.
std::vector<std::string> redis_keys(const std::string& pattern) {
  const char* port = env("DISTLOCK_TEST_REDIS_PORT");
  if (port == nullptr) {
    ADD_FAILURE() << "DISTLOCK_TEST_REDIS_PORT is not set";
    return {};
  }
  redisContext* ctx = redisConnect("127.0.0.1", std::atoi(port));
  std::vector<std::string> keys;
  if (ctx == nullptr || ctx->err != 0) {
    ADD_FAILURE() << "cannot reach redis on port " << port;
  } else if (auto* r = static_cast<redisReply*>(redisCommand(ctx, "KEYS %s", pattern.c_str()));
             r != nullptr) {
    for (size_t i = 0; i < r->elements; ++i) keys.emplace_back(r->element[i]->str, r->element[i]->len);
    freeReplyObject(r);
  }
  if (ctx != nullptr) redisFree(ctx);
  return keys;
}

// etcd keys under a prefix (etcdctl, the server's own tool).
std::vector<std::string> etcd_keys(const std::string& prefix) {
  const char* ep = env("DISTLOCK_TEST_ETCD_ENDPOINT");
  std::vector<std::string> keys;
  if (ep == nullptr) {
    ADD_FAILURE() << "DISTLOCK_TEST_ETCD_ENDPOINT is not set";
    return keys;
  }
  const std::string cmd = std::string("ETCDCTL_API=3 etcdctl --endpoints=") + ep +
                          " get --prefix --keys-only '" + prefix + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot run etcdctl";
    return keys;
  }
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
    std::string line(buf);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (!line.empty()) keys.push_back(line);
  }
  EXPECT_EQ(::pclose(p), 0) << "etcdctl failed";
  return keys;
}

// ---- bad input: the C++ API's errors, never a password ---------------------------------------

TEST(CApiErrors, BadUrlUnknownSchemeEmptyNameAndBadTtlGetTheLibrarysErrors) {
  distlock_client* c = nullptr;
  distlock_error err{};
  EXPECT_EQ(distlock_connect("nosuch://127.0.0.1:1", nullptr, &c, &err), DISTLOCK_E_INVALID_URL);
  EXPECT_EQ(err.code, DISTLOCK_E_INVALID_URL);
  EXPECT_NE(std::string(err.message).find("nosuch"), std::string::npos) << err.message;
  EXPECT_EQ(c, nullptr);

  EXPECT_EQ(distlock_connect("redis://alice:s3cr3tpw@127.0.0.1:notaport", nullptr, &c, &err),
            DISTLOCK_E_INVALID_URL);
  EXPECT_STRNE(err.message, "");
  EXPECT_EQ(std::string(err.message).find("s3cr3tpw"), std::string::npos) << err.message;

  // A server that is not there: unavailable, and the password is masked.
  distlock_client_options co;
  distlock_client_options_init(&co);
  co.connect_timeout_ms = 300;
  co.command_timeout_ms = 300;
  const int rc = distlock_connect("redis://alice:s3cr3tpw@127.0.0.1:1", &co, &c, &err);
  if (rc == DISTLOCK_OK) {
    // Connecting may be lazy: the first acquire reports it.
    ClientPtr lazy(c);
    distlock_lease* l = nullptr;
    const auto o = opts_with(1000, 0);
    EXPECT_EQ(distlock_acquire(lazy.get(), "x", &o, &l, &err), DISTLOCK_E_BACKEND_UNAVAILABLE) << err.message;
  } else {
    EXPECT_EQ(rc, DISTLOCK_E_BACKEND_UNAVAILABLE) << err.message;
  }
  EXPECT_EQ(std::string(err.message).find("s3cr3tpw"), std::string::npos) << err.message;

  TempDir dir("distlock-capi");
  ClientPtr client = connect_ok("file://" + dir.path().string());
  ASSERT_NE(client, nullptr);
  distlock_lease* l = nullptr;
  EXPECT_EQ(distlock_acquire(client.get(), "", nullptr, &l, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("name"), std::string::npos) << err.message;
  EXPECT_EQ(distlock_acquire(client.get(), nullptr, nullptr, &l, &err), DISTLOCK_E_INVALID_ARGUMENT);
  for (const std::int64_t ttl : {std::int64_t{0}, std::int64_t{-5}}) {
    const auto o = opts_with(ttl, 0);
    EXPECT_EQ(distlock_acquire(client.get(), "x", &o, &l, &err), DISTLOCK_E_INVALID_ARGUMENT) << ttl;
    EXPECT_NE(std::string(err.message).find("ttl"), std::string::npos) << err.message;
    EXPECT_EQ(l, nullptr);
  }
  EXPECT_STREQ(distlock_status_name(DISTLOCK_E_CANCELLED), "cancelled");
  EXPECT_STREQ(distlock_status_name(DISTLOCK_E_BUSY), "busy");
}

// ---- per backend ------------------------------------------------------------------------------

struct Backend {
  std::string kind;  // file, redis, etcd
  std::string url;
};

class CApiBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    kind_ = GetParam();
    // A unique prefix per test: leftovers are counted per test.
    prefix_ = std::string("capi") + std::to_string(::getpid()) + "t" + std::to_string(counter_++);
    if (kind_ == "file") {
      url_ = "file://" + dir_.path().string();
    } else {
      const char* u = env(kind_ == "redis" ? "DISTLOCK_TEST_REDIS_URL" : "DISTLOCK_TEST_ETCD_URL");
      ASSERT_NE(u, nullptr) << kind_ << " is listed in DISTLOCK_TEST_BACKENDS but its URL is not set";
      url_ = std::string(u) + "?prefix=" + prefix_;
    }
  }
  // What is left on the server for this test's prefix once every lease is gone, but for
  // the never-expiring fence counters (redis: docs/redis.md's key layout).
  std::vector<std::string> leftovers() {
    std::vector<std::string> out;
    if (kind_ == "redis") {
      for (auto& k : redis_keys(prefix_ + ":*")) {
        if (!k.ends_with(":fence")) out.push_back(k);  // the counter <prefix>:{<slot tag>}:fence
      }
    } else if (kind_ == "etcd") {
      // Tokens are revisions: no counter keys (docs/etcd.md). A session's release mark
      // (%released/, one per session, on its lease: the prefix watch's) is not lock state.
      for (auto& k : etcd_keys(prefix_)) {
        if (k.find("/%released/") == std::string::npos) out.push_back(k);
      }
    }
    return out;
  }
  static inline int counter_ = 0;
  std::string kind_, url_, prefix_;
  TempDir dir_{"distlock-capi"};
};

TEST_P(CApiBackend, AcquireTryAcquireTokenStatusListAndRelease) {
  ClientPtr a = connect_ok(url_), b = connect_ok(url_);
  ASSERT_TRUE(a && b);
  distlock_error err{};
  distlock_lease* raw = nullptr;
  const auto o = opts_with(5000, 2000);
  ASSERT_EQ(distlock_acquire(a.get(), "orders/42", &o, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr lease(raw);
  std::uint64_t t1 = 0;
  ASSERT_EQ(distlock_lease_token(lease.get(), &t1, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(distlock_lease_owns(lease.get()), 1);
  EXPECT_GT(distlock_lease_remaining_ms(lease.get()), 0);
  if (kind_ != "file") {
    EXPECT_LE(distlock_lease_remaining_ms(lease.get()), 5000);  // file:// locks do not expire
  }
  EXPECT_EQ(distlock_lease_loss(lease.get(), &err), DISTLOCK_OK);
  EXPECT_GE(distlock_lease_lost_fd(lease.get()), 0);

  distlock_lease* other = nullptr;
  EXPECT_EQ(distlock_try_acquire(b.get(), "orders/42", nullptr, &other, &err), DISTLOCK_E_BUSY)
      << err.message;
  EXPECT_EQ(other, nullptr);
  const auto short_wait = opts_with(5000, 150);
  const auto t0 = Clock::now();
  EXPECT_EQ(distlock_acquire(b.get(), "orders/42", &short_wait, &other, &err), DISTLOCK_E_TIMEOUT)
      << err.message;
  EXPECT_GE(Clock::now() - t0, 150ms);

  char* json = nullptr;
  ASSERT_EQ(distlock_status_json(b.get(), "orders/42", &json, &err), DISTLOCK_OK) << err.message;
  const std::string status = take_string(json);
  EXPECT_NE(status.find("\"held\":true"), std::string::npos) << status;
  EXPECT_NE(status.find("\"token\":" + std::to_string(t1)), std::string::npos) << status;

  const int lrc = distlock_list_json(b.get(), "orders/", 100, &json, &err);
  if (lrc == DISTLOCK_OK) {
    const std::string list = take_string(json);
    EXPECT_NE(list.find("\"name\":\"orders/42\""), std::string::npos) << list;
    EXPECT_NE(list.find("\"truncated\":false"), std::string::npos) << list;
  } else {
    EXPECT_EQ(lrc, DISTLOCK_E_NOT_SUPPORTED) << err.message;
  }

  ASSERT_EQ(distlock_lease_release(lease.get(), &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(distlock_lease_owns(lease.get()), 0);
  // No loss signal for an orderly release.
  pollfd pfd{distlock_lease_lost_fd(lease.get()), POLLIN, 0};
  EXPECT_EQ(::poll(&pfd, 1, 0), 0);

  ASSERT_EQ(distlock_try_acquire(b.get(), "orders/42", nullptr, &other, &err), DISTLOCK_OK) << err.message;
  LeasePtr second(other);
  std::uint64_t t2 = 0;
  ASSERT_EQ(distlock_lease_token(second.get(), &t2, &err), DISTLOCK_OK);
  EXPECT_GT(t2, t1);
  lease.reset();
  second.reset();
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
}

// A wait cancelled from another thread ends with DISTLOCK_E_CANCELLED, promptly, and leaves
// nothing queued: once the holder releases, nothing but the fence counters is left.
TEST_P(CApiBackend, CancelledWaitEndsPromptlyAndLeavesNothingOnTheServer) {
  ClientPtr holder = connect_ok(url_), waiter = connect_ok(url_);
  ASSERT_TRUE(holder && waiter);
  distlock_error err{};
  distlock_lease* raw = nullptr;
  ASSERT_EQ(distlock_acquire(holder.get(), "job", nullptr, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr held(raw);

  distlock_cancel* cancel = nullptr;
  ASSERT_EQ(distlock_cancel_new(&cancel, &err), DISTLOCK_OK);
  std::atomic<int> rc{-1};
  std::atomic<bool> started{false};
  distlock_error werr{};
  std::thread t([&] {
    distlock_lock_options o;
    distlock_lock_options_init(&o);
    o.wait_ms = DISTLOCK_WAIT_FOREVER;
    o.cancel = cancel;
    distlock_lease* l = nullptr;
    started = true;
    rc = distlock_acquire(waiter.get(), "job", &o, &l, &werr);
    distlock_lease_free(l);
  });
  // Wait (bounded) until the waiter is queued where the backend tells waiters, else a moment.
  const auto deadline = Clock::now() + 5s;
  while (!started) std::this_thread::yield();
  bool queued = false;
  while (Clock::now() < deadline && !queued) {
    char* json = nullptr;
    ASSERT_EQ(distlock_status_json(holder.get(), "job", &json, &err), DISTLOCK_OK) << err.message;
    const std::string s = take_string(json);
    if (s.find("\"waiters\"") == std::string::npos) {
      std::this_thread::sleep_for(200ms);  // no waiter count on this backend: let it start waiting
      queued = true;
    } else {
      queued = s.find("\"waiters\":0") == std::string::npos;
      if (!queued) std::this_thread::sleep_for(10ms);
    }
  }
  EXPECT_TRUE(queued) << "the waiter never showed up in status";
  {
    // The queue: one waiter at position 1 where the backend lists it (redis, etcd); no
    // "queue" key where it keeps none (file).
    char* json = nullptr;
    ASSERT_EQ(distlock_status_json(holder.get(), "job", &json, &err), DISTLOCK_OK) << err.message;
    const std::string s = take_string(json);
    if (kind_ == "file") {
      EXPECT_EQ(s.find("\"queue\""), std::string::npos) << s;
    } else {
      EXPECT_NE(s.find("\"queue\":[{"), std::string::npos) << s;
      // One waiter: one entry, at position 1 (the object's keys come sorted).
      EXPECT_NE(s.find("\"position\":1}"), std::string::npos) << s;
      EXPECT_EQ(s.find("\"position\":", s.find("\"position\":1}") + 1), std::string::npos) << s;
    }
  }
  EXPECT_EQ(rc.load(), -1) << "the wait ended before it was cancelled: " << werr.message;
  const auto t0 = Clock::now();
  distlock_cancel_request(cancel);
  t.join();
  const auto took = Clock::now() - t0;
  EXPECT_EQ(rc.load(), DISTLOCK_E_CANCELLED) << werr.message;
  EXPECT_STRNE(werr.message, "");
  // Bound: the cancel is a stop callback that wakes the wait; 2 s covers a loaded CI machine.
  EXPECT_LT(took, 2s);
  EXPECT_EQ(distlock_cancel_requested(cancel), 1);
  distlock_cancel_free(cancel);

  ASSERT_EQ(distlock_lease_release(held.get(), &err), DISTLOCK_OK) << err.message;
  held.reset();
  char* json = nullptr;
  ASSERT_EQ(distlock_status_json(holder.get(), "job", &json, &err), DISTLOCK_OK);
  const std::string s = take_string(json);
  EXPECT_NE(s.find("\"held\":false"), std::string::npos) << s;
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
}

// 4 processes x 8 threads, 2,016 critical sections: never two inside at once (the O_APPEND log
// alternates B/E of the same section) and tokens strictly increase in section order.
TEST_P(CApiBackend, HammerOfFourProcessesTimesEightThreadsExcludesAndTokensIncrease) {
  TempDir work("distlock-capi-hammer");
  const std::string log = (work.path() / "sections.log").string();
  std::vector<Process> procs;
  constexpr int kProcs = 4, kThreads = 8, kIters = 63;  // 2016 sections
  for (int p = 0; p < kProcs; ++p) {
    procs.push_back(Process::spawn(
        {tool(), "hammer", url_, "hammer", log, std::to_string(kThreads), std::to_string(kIters)},
        (work.path() / ("proc" + std::to_string(p) + ".out")).string()));
  }
  for (int p = 0; p < kProcs; ++p) {
    const int status = procs[p].wait_for(150s);
    ASSERT_NE(status, -1) << "hammer process " << p << " did not finish in 150 s";
    std::ifstream out(work.path() / ("proc" + std::to_string(p) + ".out"));
    std::stringstream text;
    text << out.rdbuf();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "process " << p << ": " << text.str();
  }
  std::ifstream in(log);
  std::string type, pid, thread, token;
  int sections = 0;
  bool inside = false;
  std::string open_pid, open_thread, open_token;
  std::uint64_t last_token = 0;
  std::set<std::string> pids;
  while (in >> type >> pid >> thread >> token) {
    if (type == "B") {
      ASSERT_FALSE(inside) << "two sections at once: " << open_pid << "/" << open_thread << " and " << pid
                           << "/" << thread << " at section " << sections;
      inside = true;
      open_pid = pid;
      open_thread = thread;
      open_token = token;
      const std::uint64_t t = std::stoull(token);
      ASSERT_GT(t, last_token) << "tokens not increasing at section " << sections;
      last_token = t;
      pids.insert(pid);
    } else {
      ASSERT_TRUE(inside && pid == open_pid && thread == open_thread && token == open_token)
          << "an end that is not the open section's at section " << sections;
      inside = false;
      ++sections;
    }
  }
  EXPECT_FALSE(inside);
  EXPECT_EQ(sections, kProcs * kThreads * kIters);
  EXPECT_EQ(pids.size(), static_cast<std::size_t>(kProcs));
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
}

TEST_P(CApiBackend, SemaphoreRwLockAndElection) {
  ClientPtr a = connect_ok(url_), b = connect_ok(url_);
  ASSERT_TRUE(a && b);
  distlock_error err{};
  const auto one_try = opts_with(5000, 0);
  distlock_lease *p1 = nullptr, *p2 = nullptr, *p3 = nullptr;
  ASSERT_EQ(distlock_semaphore_acquire(a.get(), "pool", 2, &one_try, &p1, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_semaphore_acquire(b.get(), "pool", 2, &one_try, &p2, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(distlock_semaphore_acquire(b.get(), "pool", 2, &one_try, &p3, &err), DISTLOCK_E_BUSY)
      << err.message;
  EXPECT_EQ(distlock_semaphore_acquire(b.get(), "pool", 3, &one_try, &p3, &err), DISTLOCK_E_INVALID_ARGUMENT);
  distlock_lease_free(p1);
  distlock_lease_free(p2);

  distlock_lease *r1 = nullptr, *r2 = nullptr, *w = nullptr;
  ASSERT_EQ(distlock_rwlock_acquire(a.get(), "cfg", 0, 0, &one_try, &r1, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_rwlock_acquire(b.get(), "cfg", 0, 0, &one_try, &r2, &err), DISTLOCK_OK) << err.message;
  std::uint64_t tok = 0;
  EXPECT_EQ(distlock_lease_token(r1, &tok, &err), DISTLOCK_E_NOT_SUPPORTED);
  EXPECT_EQ(distlock_rwlock_acquire(b.get(), "cfg", 1, 0, &one_try, &w, &err), DISTLOCK_E_BUSY)
      << err.message;
  EXPECT_EQ(distlock_lease_release(r1, &err), DISTLOCK_OK);
  distlock_lease_free(r1);
  distlock_lease_free(r2);
  const auto wait2 = opts_with(5000, 2000);
  ASSERT_EQ(distlock_rwlock_acquire(b.get(), "cfg", 1, 0, &wait2, &w, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(distlock_lease_token(w, &tok, &err), DISTLOCK_OK) << err.message;
  distlock_lease_free(w);

  distlock_lease* lead = nullptr;
  ASSERT_EQ(distlock_election_campaign(a.get(), "sched", "host-a:8080", &wait2, &lead, &err), DISTLOCK_OK)
      << err.message;
  std::uint64_t term = 0;
  ASSERT_EQ(distlock_lease_token(lead, &term, &err), DISTLOCK_OK);
  char* json = nullptr;
  ASSERT_EQ(distlock_election_leader(b.get(), "sched", &json, &err), DISTLOCK_OK) << err.message;
  const std::string leader = take_string(json);
  EXPECT_NE(leader.find("\"value\":\"host-a:8080\""), std::string::npos) << leader;
  EXPECT_NE(leader.find("\"term\":" + std::to_string(term)), std::string::npos) << leader;
  distlock_lease* not_lead = nullptr;
  EXPECT_EQ(distlock_election_campaign(b.get(), "sched", "host-b", &one_try, &not_lead, &err),
            DISTLOCK_E_BUSY);
  EXPECT_EQ(distlock_election_resign(a.get(), "other", lead, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_EQ(distlock_election_resign(a.get(), "sched", lead, &err), DISTLOCK_OK) << err.message;
  distlock_lease_free(lead);
  ASSERT_EQ(distlock_election_leader(b.get(), "sched", &json, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(take_string(json), "null");
}

TEST_P(CApiBackend, ElectionProclaimAndObserve) {
  ClientPtr a = connect_ok(url_), b = connect_ok(url_);
  ASSERT_TRUE(a && b);
  distlock_error err{};
  // Nobody leads: an observe with a short wait returns null once the wait passes.
  auto short_wait = opts_with(5000, 200);
  char* json = nullptr;
  ASSERT_EQ(distlock_election_observe(b.get(), "sched", nullptr, &short_wait, &json, &err), DISTLOCK_OK)
      << err.message;
  EXPECT_EQ(take_string(json), "null");

  const auto wait2 = opts_with(5000, 2000);
  distlock_lease* lead = nullptr;
  ASSERT_EQ(distlock_election_campaign(a.get(), "sched", "host-a:8080", &wait2, &lead, &err), DISTLOCK_OK)
      << err.message;
  LeasePtr lead_ptr(lead);
  std::uint64_t term = 0;
  ASSERT_EQ(distlock_lease_token(lead, &term, &err), DISTLOCK_OK) << err.message;

  // Any leader: the one that campaigned, with its value.
  ASSERT_EQ(distlock_election_observe(b.get(), "sched", nullptr, &wait2, &json, &err), DISTLOCK_OK)
      << err.message;
  std::string seen = take_string(json);
  EXPECT_NE(seen.find("\"value\":\"host-a:8080\""), std::string::npos) << seen;
  EXPECT_NE(seen.find("\"term\":" + std::to_string(term) + ","), std::string::npos) << seen;

  // proclaim replaces the value for the same term; leader() reads it.
  ASSERT_EQ(distlock_election_proclaim(a.get(), "sched", lead, "host-a:9090", &err), DISTLOCK_OK)
      << err.message;
  ASSERT_EQ(distlock_election_leader(b.get(), "sched", &json, &err), DISTLOCK_OK) << err.message;
  seen = take_string(json);
  EXPECT_NE(seen.find("\"value\":\"host-a:9090\""), std::string::npos) << seen;
  EXPECT_NE(seen.find("\"term\":" + std::to_string(term) + ","), std::string::npos) << seen;
  EXPECT_EQ(distlock_election_proclaim(a.get(), "other", lead, "x", &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("leadership"), std::string::npos) << err.message;

  // Past the current term: no newer leader within the wait -> null.
  ASSERT_EQ(distlock_election_observe(b.get(), "sched", &term, &short_wait, &json, &err), DISTLOCK_OK)
      << err.message;
  EXPECT_EQ(take_string(json), "null");

  // An observer waiting past `term` on another thread wakes for the next leader: b wins once
  // a resigns, and the observer reports b's larger term and value.
  std::string observed;
  int observe_rc = -1;
  distlock_error observe_err{};
  std::thread observer([&] {
    const auto wait10 = opts_with(5000, 10000);
    char* j = nullptr;
    observe_rc = distlock_election_observe(b.get(), "sched", &term, &wait10, &j, &observe_err);
    observed = take_string(j);
  });
  ASSERT_EQ(distlock_election_resign(a.get(), "sched", lead, &err), DISTLOCK_OK) << err.message;
  // A resigned leadership proclaims nothing.
  EXPECT_EQ(distlock_election_proclaim(a.get(), "sched", lead, "late", &err), DISTLOCK_E_NOT_OWNER);
  distlock_lease* lead_b = nullptr;
  ASSERT_EQ(distlock_election_campaign(b.get(), "sched", "host-b", &wait2, &lead_b, &err), DISTLOCK_OK)
      << err.message;
  LeasePtr lead_b_ptr(lead_b);
  std::uint64_t term_b = 0;
  ASSERT_EQ(distlock_lease_token(lead_b, &term_b, &err), DISTLOCK_OK);
  EXPECT_GT(term_b, term);
  observer.join();
  ASSERT_EQ(observe_rc, DISTLOCK_OK) << observe_err.message;
  EXPECT_NE(observed.find("\"value\":\"host-b\""), std::string::npos) << observed;
  EXPECT_NE(observed.find("\"term\":" + std::to_string(term_b) + ","), std::string::npos) << observed;

  // A cancel ends an observe that would otherwise wait without limit.
  distlock_cancel* cancel = nullptr;
  ASSERT_EQ(distlock_cancel_new(&cancel, &err), DISTLOCK_OK);
  auto forever = opts_with(5000, DISTLOCK_WAIT_FOREVER);
  forever.cancel = cancel;
  std::thread canceller([cancel] {
    // Not a timing assumption: a cancel before the observe starts ends it the same way (checked
    // first); the pause only makes the usual case a cancel of a wait under way.
    std::this_thread::sleep_for(100ms);
    distlock_cancel_request(cancel);
  });
  const auto t0 = Clock::now();
  EXPECT_EQ(distlock_election_observe(a.get(), "sched", &term_b, &forever, &json, &err), DISTLOCK_E_CANCELLED)
      << err.message;
  EXPECT_LT(Clock::now() - t0, 5s);  // bound on this process's steady clock
  EXPECT_EQ(json, nullptr);
  canceller.join();
  distlock_cancel_free(cancel);
  EXPECT_EQ(distlock_lease_release(lead_b, &err), DISTLOCK_OK) << err.message;
}

// The backends of this build (compile definitions from bindings/c/CMakeLists.txt).
std::vector<std::string> backends() {
  std::vector<std::string> out{"file"};
#ifdef DISTLOCK_TEST_REDIS
  out.push_back("redis");
#endif
#ifdef DISTLOCK_TEST_ETCD
  out.push_back("etcd");
#endif
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, CApiBackend, ::testing::ValuesIn(backends()),
                         [](const auto& p) { return p.param; });

#ifdef DISTLOCK_TEST_REDIS
// ---- loss, on redis:// -------------------------------------------------------------------------

// A holder SIGSTOPped past its TTL (it stops itself right after a write, so that no write was
// already decided): the next holder gets a larger token; after SIGCONT the holder sees the loss
// (owns() 0 or the descriptor) before it writes again, and the descriptor and the on_lost
// callback both fire.
TEST(CApiLoss, HolderStoppedPastItsTtlSeesTheLossBeforeWritingAndTheNextTokenIsLarger) {
  const char* base = env("DISTLOCK_TEST_REDIS_URL");
  ASSERT_NE(base, nullptr) << "DISTLOCK_TEST_REDIS_URL is not set (run through with_servers --redis)";
  const std::string url = std::string(base) + "?prefix=capiloss" + std::to_string(::getpid());
  TempDir work("distlock-capi-loss");
  const auto out_path = work.path() / "holder.out";
  const auto writes_path = work.path() / "writes";
  Process holder =
      Process::spawn({tool(), "hold", url, "ledger", "1000", writes_path.string()}, out_path.string());
  auto read_file = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  // Bounded wait for "held <token>".
  std::uint64_t t1 = 0;
  for (const auto end = Clock::now() + 10s; Clock::now() < end && t1 == 0;) {
    const std::string text = read_file(out_path);
    // stderr (the client's warnings) shares the file: find the line.
    if (const auto at = text.find("held ");
        at != std::string::npos && text.find('\n', at) != std::string::npos) {
      t1 = std::stoull(text.substr(at + 5));
    }
    if (t1 == 0) std::this_thread::sleep_for(10ms);
  }
  ASSERT_GT(t1, 0u) << read_file(out_path);
  // It stops itself after its third write (right after a write, before its next check);
  // wait (bounded) until the kernel says it is stopped.
  auto stopped = [&] {
    std::ifstream stat("/proc/" + std::to_string(holder.pid()) + "/stat");
    std::string s;
    std::getline(stat, s);
    const auto close = s.rfind(')');
    return close != std::string::npos && close + 2 < s.size() && s[close + 2] == 'T';
  };
  for (const auto end = Clock::now() + 10s; Clock::now() < end && !stopped();)
    std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(stopped()) << "the holder did not stop itself: " << read_file(out_path);
  const std::string writes_at_stop = read_file(writes_path);
  ASSERT_FALSE(writes_at_stop.empty());

  // The next holder gets it once the TTL (1 s) ran out on the server.
  ClientPtr next = connect_ok(url);
  ASSERT_TRUE(next);
  distlock_error err{};
  distlock_lease* raw = nullptr;
  const auto o = opts_with(5000, 5000);
  ASSERT_EQ(distlock_acquire(next.get(), "ledger", &o, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr second(raw);
  std::uint64_t t2 = 0;
  ASSERT_EQ(distlock_lease_token(second.get(), &t2, &err), DISTLOCK_OK);
  EXPECT_GT(t2, t1);

  holder.signal(SIGCONT);
  const int status = holder.wait_for(15s);
  ASSERT_NE(status, -1) << "the holder did not end after SIGCONT: " << read_file(out_path);
  const std::string out = read_file(out_path);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("lost "), std::string::npos) << out;
  EXPECT_NE(out.find("fd 1 callback 1"), std::string::npos) << out;
  EXPECT_NE(out.find("loss 3 "), std::string::npos) << out;
  EXPECT_NE(out.find("release lost"), std::string::npos) << out;
  // Not one write after the stop: it saw the loss first.
  EXPECT_EQ(read_file(writes_path), writes_at_stop);
}

#endif  // DISTLOCK_TEST_REDIS

// ---- ids ---------------------------------------------------------------------------------------

TEST(CApiIds, SnowflakeRedisDailyAndUuid7) {
  char a[37], b[37];
  distlock_error err{};
  const int rc = distlock_uuid7(a, &err);
  if (rc == DISTLOCK_E_NOT_SUPPORTED) GTEST_SKIP() << "built without the ids component: " << err.message;
  ASSERT_EQ(rc, DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_uuid7(b, &err), DISTLOCK_OK);
  EXPECT_EQ(std::strlen(a), 36u);
  EXPECT_EQ(a[14], '7');
  EXPECT_LT(std::string(a), std::string(b));

#ifdef DISTLOCK_TEST_REDIS
  const char* redis = env("DISTLOCK_TEST_REDIS_URL");
  ASSERT_NE(redis, nullptr);
  ClientPtr client = connect_ok(redis);
  distlock_snowflake* sf = nullptr;
  ASSERT_EQ(distlock_snowflake_new(client.get(), "capi", &sf, &err), DISTLOCK_OK) << err.message;
  std::uint64_t x = 0, y = 0;
  ASSERT_EQ(distlock_snowflake_next(sf, &x, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_snowflake_next(sf, &y, &err), DISTLOCK_OK);
  EXPECT_LT(x, y);
  distlock_snowflake_free(sf);

  distlock_redis_daily* daily = nullptr;
  ASSERT_EQ(distlock_redis_daily_new(redis, "capi", 0, &daily, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_redis_daily_next(daily, &x, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_redis_daily_next(daily, &y, &err), DISTLOCK_OK);
  EXPECT_LT(x, y);
  distlock_redis_daily_free(daily);
#endif
}

// The header's example (bindings/c/tests/example.c) and the README's snippet
// (bindings/c/tests/readme.c), compiled as C99 and run.
TEST(CApiExample, HeaderExampleAndReadmeSnippetRun) {
  TempDir work("distlock-capi-example");
#ifdef DISTLOCK_TEST_REDIS
  const char* redis = env("DISTLOCK_TEST_REDIS_URL");
  ASSERT_NE(redis, nullptr);
#else
  const std::string file_url = "file://" + work.path().string();
  const char* redis = file_url.c_str();
#endif
  int n = 0;
  for (const char* program : {C_API_EXAMPLE_PATH, C_API_README_PATH}) {
    const auto out = work.path() / ("out" + std::to_string(n++));
    Process p = Process::spawn({program, redis}, out.string());
    const int status = p.wait_for(30s);
    std::ifstream in(out);
    std::stringstream s;
    s << in.rdbuf();
    ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << program << ": " << s.str();
    EXPECT_NE(s.str().find("order 42 written with token "), std::string::npos) << s.str();
  }
}

// ---- revoke, on redis:// and file:// ------------------------------------------------------------

// distlock_revoke: the holder's lease is lost with reason "revoked" and the reason text within
// its renewal interval (1 s at TTL 3 s) plus 1 s, measured on this process's steady clock; the
// next acquisition gets a larger token; a free lock is revoked == 0; file:// is not supported.
TEST(CApiRevoke, HolderLosesItWithTheReasonAndAFreeLockIsNoError) {
  const char* base = env("DISTLOCK_TEST_REDIS_URL");
  ASSERT_NE(base, nullptr) << "DISTLOCK_TEST_REDIS_URL is not set (run through with_servers --redis)";
  const std::string url = std::string(base) + "?prefix=capirevoke" + std::to_string(::getpid());
  ClientPtr holder = connect_ok(url), ops = connect_ok(url);
  ASSERT_TRUE(holder && ops);
  distlock_error err{};
  distlock_lease* raw = nullptr;
  auto o = opts_with(3000, 0);
  ASSERT_EQ(distlock_acquire(holder.get(), "job", &o, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr held(raw);
  std::uint64_t t1 = 0;
  ASSERT_EQ(distlock_lease_token(held.get(), &t1, &err), DISTLOCK_OK);
  int revoked = -1;
  ASSERT_EQ(distlock_revoke(ops.get(), "job", "ticket 9", &revoked, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(revoked, 1);
  const auto at = Clock::now();
  while (distlock_lease_owns(held.get()) && Clock::now() < at + 10s) std::this_thread::sleep_for(5ms);
  EXPECT_LE(Clock::now() - at, 2000ms) << "the holder was not told within its renewal interval + 1 s";
  EXPECT_EQ(distlock_lease_loss(held.get(), &err), DISTLOCK_E_LOST);
  EXPECT_NE(std::string(err.message).find("(revoked)"), std::string::npos) << err.message;
  EXPECT_NE(std::string(err.message).find("ticket 9"), std::string::npos) << err.message;
  o = opts_with(3000, 5000);
  raw = nullptr;
  ASSERT_EQ(distlock_acquire(ops.get(), "job", &o, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr next(raw);
  std::uint64_t t2 = 0;
  ASSERT_EQ(distlock_lease_token(next.get(), &t2, &err), DISTLOCK_OK);
  EXPECT_GT(t2, t1);
  ASSERT_EQ(distlock_lease_release(next.get(), &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_revoke(ops.get(), "job", "again", &revoked, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(revoked, 0);

  TempDir dir("distlock-capi-revoke");
  ClientPtr local = connect_ok("file://" + dir.path().string());
  ASSERT_TRUE(local);
  EXPECT_EQ(distlock_revoke(local.get(), "job", "why", &revoked, &err), DISTLOCK_E_NOT_SUPPORTED);
  EXPECT_NE(std::string(err.message).find("cannot end another process's hold"), std::string::npos)
      << err.message;
}

#ifdef DISTLOCK_TEST_REDIS
// ---- lock-delay, queue position, multi-leases (distlock_lock_options_ext, distlock_acquire_all) --

std::string redis_url_with_prefix(const char* what) {
  const char* base = env("DISTLOCK_TEST_REDIS_URL");
  if (base == nullptr) {
    ADD_FAILURE() << "DISTLOCK_TEST_REDIS_URL is not set (run through with_servers --redis)";
    return {};
  }
  return std::string(base) + "?prefix=" + what + std::to_string(::getpid());
}

distlock_lock_options_ext ext_with_delay(std::int64_t delay_ms) {
  distlock_lock_options_ext e;
  distlock_lock_options_ext_init(&e);
  e.lock_delay_ms = delay_ms;
  return e;
}

std::int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// A holder with lock_delay 2500 ms (above its 1-s TTL) is revoked (a loss, not a release): a prober
// trying every 20 ms is granted no earlier than the revoke's start + 2500 ms - 1 ms (the server's
// millisecond expiry) and no later than the revoke's return + TTL + delay + 1 s, all on this
// process's steady clock. A holder with lock_delay 5 s that releases normally hands the name on at
// once: one attempt right after the release gets it.
TEST(CApiLockDelay, ARevokedHolderHoldsTheNameBackAndAReleaseDoesNot) {
  const std::string url = redis_url_with_prefix("capildelay");
  ClientPtr holder = connect_ok(url), other = connect_ok(url);
  ASSERT_TRUE(holder && other);
  distlock_error err{};
  constexpr std::int64_t kTtl = 1000, kDelay = 2500;
  auto o = opts_with(kTtl, 0);
  auto e = ext_with_delay(kDelay);
  distlock_lease* raw = nullptr;
  ASSERT_EQ(distlock_acquire_ext(holder.get(), "ld/revoked", &o, &e, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr held(raw);
  int revoked = 0;
  const auto revoking = Clock::now();
  ASSERT_EQ(distlock_revoke(other.get(), "ld/revoked", "lock-delay test", &revoked, &err), DISTLOCK_OK)
      << err.message;
  const auto revoked_at = Clock::now();
  ASSERT_EQ(revoked, 1);
  std::int64_t granted_after = -1;
  const auto probe = opts_with(kTtl, 0);
  for (int i = 0; i < 500 && granted_after < 0; ++i) {  // 500 x 20 ms = 10 s
    raw = nullptr;
    const int rc = distlock_try_acquire(other.get(), "ld/revoked", &probe, &raw, &err);
    if (rc == DISTLOCK_OK) {
      granted_after = ms_since(revoking);
      distlock_lease_free(raw);
      break;
    }
    ASSERT_EQ(rc, DISTLOCK_E_BUSY) << err.message;
    std::this_thread::sleep_for(20ms);
  }
  std::printf(
      "[ c ] revoked holder with lock_delay %lld ms, ttl %lld ms: next granted %lld ms after the revoke\n",
      static_cast<long long>(kDelay), static_cast<long long>(kTtl), static_cast<long long>(granted_after));
  ASSERT_GE(granted_after, 0) << "never granted within 10 s";
  EXPECT_GE(granted_after, kDelay - 1) << "granted before the revoked holder's lock-delay ended";
  EXPECT_LE(granted_after,
            std::chrono::duration_cast<std::chrono::milliseconds>(revoked_at - revoking).count() + kTtl +
                kDelay + 1000)
      << "granted too late after the lock-delay ended";

  // A normal release hands over at once.
  auto released_opts = opts_with(10000, 0);
  auto long_delay = ext_with_delay(5000);
  raw = nullptr;
  ASSERT_EQ(distlock_acquire_ext(holder.get(), "ld/released", &released_opts, &long_delay, &raw, &err),
            DISTLOCK_OK)
      << err.message;
  ASSERT_EQ(distlock_lease_release(raw, &err), DISTLOCK_OK) << err.message;
  distlock_lease_free(raw);
  raw = nullptr;
  EXPECT_EQ(distlock_try_acquire(other.get(), "ld/released", &probe, &raw, &err), DISTLOCK_OK)
      << "a normal release held the name back: " << err.message;
  distlock_lease_free(raw);
}

// Bad values get the C++ API's errors: a negative delay, one above 60 s, a struct whose size is
// below its first version; a backend that cannot enforce a lock-delay (file://) refuses it.
TEST(CApiLockDelay, BadValuesAndABackendThatCannotEnforceItAreRefused) {
  const std::string url = redis_url_with_prefix("capildbad");
  ClientPtr c = connect_ok(url);
  ASSERT_TRUE(c);
  distlock_error err{};
  distlock_lease* raw = nullptr;
  auto o = opts_with(3000, 0);
  for (const std::int64_t bad : {std::int64_t{-1}, std::int64_t{60001}}) {
    auto e = ext_with_delay(bad);
    EXPECT_EQ(distlock_acquire_ext(c.get(), "ld/bad", &o, &e, &raw, &err), DISTLOCK_E_INVALID_ARGUMENT)
        << bad;
    EXPECT_NE(std::string(err.message).find("lock_delay"), std::string::npos) << err.message;
    EXPECT_EQ(raw, nullptr);
  }
  auto small = ext_with_delay(100);
  small.size = sizeof(std::size_t);
  EXPECT_EQ(distlock_acquire_ext(c.get(), "ld/bad", &o, &small, &raw, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("distlock_lock_options_ext.size"), std::string::npos)
      << err.message;
  auto max = ext_with_delay(60000);
  ASSERT_EQ(distlock_acquire_ext(c.get(), "ld/bad", &o, &max, &raw, &err), DISTLOCK_OK) << err.message;
  distlock_lease_free(raw);

  TempDir dir("distlock-capi-lockdelay");
  ClientPtr local = connect_ok("file://" + dir.path().string());
  ASSERT_TRUE(local);
  auto e = ext_with_delay(1000);
  raw = nullptr;
  EXPECT_EQ(distlock_acquire_ext(local.get(), "ld/file", &o, &e, &raw, &err), DISTLOCK_E_NOT_SUPPORTED);
  EXPECT_NE(std::string(err.message).find("lock_delay"), std::string::npos) << err.message;
}

struct PositionReport {
  std::size_t position;
  std::size_t ahead_position;
  std::string ahead_info;
};
struct Reports {
  std::mutex mu;
  std::vector<PositionReport> list;
};
void record_position(std::size_t position, const distlock_waiter* ahead, void* user) {
  auto* r = static_cast<Reports*>(user);
  std::lock_guard lk(r->mu);
  r->list.push_back(
      {position, ahead->position, ahead->holder_info != nullptr ? ahead->holder_info : "(none)"});
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Four waiters queued one after another behind a holder: each one's callback first reports its
// place (1..4, the one ahead by its holder_info) and later reports only move forward; they acquire
// in that order. Each waiter is listed last in the queue (distlock_status_json) before the next
// starts; every wait is bounded (20 s to be listed, 60 s for the acquisitions).
TEST(CApiQueuePosition, FourWaitersAreToldTheirPlaceAndAcquireInThatOrder) {
  constexpr std::size_t kWaiters = 4;
  const std::string url = redis_url_with_prefix("capiqueue");
  ClientPtr holder = connect_ok(url), observer = connect_ok(url);
  ASSERT_TRUE(holder && observer);
  distlock_error err{};
  auto ho = opts_with(30000, 0);
  ho.holder_info = "holder";
  distlock_lease* raw = nullptr;
  ASSERT_EQ(distlock_acquire(holder.get(), "queue/order", &ho, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr held(raw);
  std::vector<Reports> reports(kWaiters + 1);
  std::mutex order_mu;
  std::vector<std::size_t> order;
  std::vector<ClientPtr> clients;
  for (std::size_t i = 0; i < kWaiters; ++i) clients.push_back(connect_ok(url));
  std::vector<std::thread> waiters;
  std::vector<int> results(kWaiters + 1, -1);
  struct JoinAll {  // on a failed assertion: the holder lets go first, so the waiters end
    LeasePtr& held;
    std::vector<std::thread>& threads;
    ~JoinAll() {
      held.reset();
      for (auto& t : threads) t.join();
    }
  } join_all{held, waiters};
  for (std::size_t i = 1; i <= kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      auto o = opts_with(30000, 60000);
      const std::string info = "waiter=" + std::to_string(i);
      o.holder_info = info.c_str();
      distlock_lock_options_ext e;
      distlock_lock_options_ext_init(&e);
      e.on_queue_position = record_position;
      e.queue_position_user = &reports[i];
      distlock_lease* l = nullptr;
      distlock_error werr{};
      results[i] = distlock_acquire_ext(clients[i - 1].get(), "queue/order", &o, &e, &l, &werr);
      if (results[i] != DISTLOCK_OK) return;
      {
        std::lock_guard lk(order_mu);
        order.push_back(i);
      }
      results[i] = distlock_lease_release(l, &werr);
      distlock_lease_free(l);
    });
    bool listed = false;
    for (const auto end = Clock::now() + 20s; !listed && Clock::now() < end;) {
      char* json = nullptr;
      ASSERT_EQ(distlock_status_json(observer.get(), "queue/order", &json, &err), DISTLOCK_OK) << err.message;
      const std::string s = take_string(json);
      const std::string prefix = "\"holder_info\":\"waiter=";
      const auto last = s.rfind(prefix);
      listed = count_of(s, "\"position\":") == i && last != std::string::npos &&
               last == s.find(prefix + std::to_string(i) + "\"");
      if (!listed) std::this_thread::sleep_for(10ms);
    }
    ASSERT_TRUE(listed) << "waiter " << i << " was not listed last in the queue within 20 s";
  }
  // Every waiter's callback has reported (bounded: 20 s).
  auto all_reported = [&] {
    for (std::size_t i = 1; i <= kWaiters; ++i) {
      std::lock_guard lk(reports[i].mu);
      if (reports[i].list.empty()) return false;
    }
    return true;
  };
  for (const auto end = Clock::now() + 20s; !all_reported() && Clock::now() < end;)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(all_reported()) << "a waiter's queue-position callback did not run within 20 s";
  for (std::size_t i = 1; i <= kWaiters; ++i) {
    std::lock_guard lk(reports[i].mu);
    const PositionReport& first = reports[i].list.front();
    EXPECT_EQ(first.position, i) << "waiter " << i;
    EXPECT_EQ(first.ahead_position, i - 1) << "waiter " << i;
    EXPECT_EQ(first.ahead_info, i == 1 ? std::string("holder") : "waiter=" + std::to_string(i - 1))
        << "waiter " << i;
  }
  ASSERT_EQ(distlock_lease_release(held.get(), &err), DISTLOCK_OK) << err.message;
  held.reset();
  for (auto& t : waiters) t.join();
  waiters.clear();
  for (std::size_t i = 1; i <= kWaiters; ++i) EXPECT_EQ(results[i], DISTLOCK_OK) << "waiter " << i;
  EXPECT_EQ(order, (std::vector<std::size_t>{1, 2, 3, 4}))
      << "the waiters did not acquire in the order reported";
  for (std::size_t i = 1; i <= kWaiters; ++i) {
    std::lock_guard lk(reports[i].mu);
    for (std::size_t r = 1; r < reports[i].list.size(); ++r)
      EXPECT_LT(reports[i].list[r].position, reports[i].list[r - 1].position) << "waiter " << i;
  }
}

// Blocks the client's event thread (an on_lost callback) until opened; bounded at 30 s.
struct EventThreadBlock {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false, after = false;
};
void block_event_thread(void* user) {
  auto* b = static_cast<EventThreadBlock*>(user);
  std::unique_lock lk(b->mu);
  b->entered = true;
  b->cv.notify_all();
  b->cv.wait_for(lk, 30s, [&] { return b->open; });
}
void mark_after(void* user) {
  auto* b = static_cast<EventThreadBlock*>(user);
  std::lock_guard lk(b->mu);
  b->after = true;
  b->cv.notify_all();
}

// A report queued on the event thread while it is busy (a blocking on_lost callback) and still
// queued when the acquire returns never reaches the caller's function, so its user data may be
// freed once distlock_acquire_ext returned: the waiter's place is read (it is listed in the
// queue, so its report is queued behind the blocked callback), the holder releases, the acquire
// returns; then the event thread is let go and runs the queued report and, after it, a marker
// callback: the function was called 0 times. Every wait is bounded (20 s, 30 s).
TEST(CApiQueuePosition, NoReportReachesTheCallerAfterTheAcquireReturned) {
  const std::string url = redis_url_with_prefix("capiqgate");
  ClientPtr c = connect_ok(url), holder = connect_ok(url), ops = connect_ok(url);
  ASSERT_TRUE(c && holder && ops);
  distlock_error err{};
  distlock_lease* raw = nullptr;
  auto short_ttl = opts_with(1000, 0);
  ASSERT_EQ(distlock_acquire(c.get(), "gate/blocker", &short_ttl, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr blocker(raw);
  raw = nullptr;
  ASSERT_EQ(distlock_acquire(c.get(), "gate/marker", &short_ttl, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr marker(raw);
  EventThreadBlock block;
  struct Open {  // lets the event thread go on any exit
    EventThreadBlock& b;
    ~Open() {
      std::lock_guard lk(b.mu);
      b.open = true;
      b.cv.notify_all();
    }
  } open_on_exit{block};
  ASSERT_EQ(distlock_lease_on_lost(blocker.get(), block_event_thread, &block, &err), DISTLOCK_OK);
  ASSERT_EQ(distlock_lease_on_lost(marker.get(), mark_after, &block, &err), DISTLOCK_OK);
  int revoked = 0;
  ASSERT_EQ(distlock_revoke(ops.get(), "gate/blocker", "block the event thread", &revoked, &err),
            DISTLOCK_OK);
  {
    std::unique_lock lk(block.mu);
    ASSERT_TRUE(block.cv.wait_for(lk, 20s, [&] { return block.entered; }))
        << "the on_lost callback never ran";
  }
  auto ho = opts_with(30000, 0);
  raw = nullptr;
  ASSERT_EQ(distlock_acquire(holder.get(), "gate/q", &ho, &raw, &err), DISTLOCK_OK) << err.message;
  LeasePtr held(raw);
  Reports reports;
  std::atomic<int> rc{-1};
  std::thread waiter([&] {
    auto o = opts_with(30000, 30000);
    o.holder_info = "gated";
    distlock_lock_options_ext e;
    distlock_lock_options_ext_init(&e);
    e.on_queue_position = record_position;
    e.queue_position_user = &reports;
    distlock_lease* l = nullptr;
    distlock_error werr{};
    rc = distlock_acquire_ext(c.get(), "gate/q", &o, &e, &l, &werr);
    distlock_lease_free(l);
  });
  bool listed = false;
  for (const auto end = Clock::now() + 20s; !listed && Clock::now() < end;) {
    char* json = nullptr;
    ASSERT_EQ(distlock_status_json(ops.get(), "gate/q", &json, &err), DISTLOCK_OK) << err.message;
    listed = take_string(json).find("\"holder_info\":\"gated\"") != std::string::npos;
    if (!listed) std::this_thread::sleep_for(10ms);
  }
  // The report is queued right after the attempt that listed the waiter (one status round trip
  // on the waiter's thread); a release that came before it would leave nothing queued and this
  // test passing without testing. Run against the C API without its gate it failed (the report
  // reached the function after the acquire returned), see the commit that added it.
  ASSERT_TRUE(listed) << "the waiter was not listed within 20 s";
  ASSERT_EQ(distlock_lease_release(held.get(), &err), DISTLOCK_OK) << err.message;
  waiter.join();
  ASSERT_EQ(rc.load(), DISTLOCK_OK);
  {
    std::lock_guard lk(reports.mu);
    EXPECT_TRUE(reports.list.empty()) << "a report ran while the event thread was blocked";
  }
  {
    std::lock_guard lk(block.mu);
    block.open = true;
    block.cv.notify_all();
  }
  ASSERT_EQ(distlock_revoke(ops.get(), "gate/marker", "after the reports", &revoked, &err), DISTLOCK_OK);
  {
    std::unique_lock lk(block.mu);
    ASSERT_TRUE(block.cv.wait_for(lk, 20s, [&] { return block.after; })) << "the marker callback never ran";
  }
  std::lock_guard lk(reports.mu);
  EXPECT_TRUE(reports.list.empty()) << reports.list.size()
                                    << " report(s) reached the function after the acquire returned";
}

struct MultiDeleter {
  void operator()(distlock_multi_lease* m) const noexcept { distlock_multi_lease_free(m); }
};
using MultiPtr = std::unique_ptr<distlock_multi_lease, MultiDeleter>;

// acquire_all: the names in sorted order with duplicates dropped, one token per name; a revoke of
// one name is a loss of the whole (owns 0, the descriptor readable within 5 s, the loss naming the
// name, release DISTLOCK_E_LOST); bad input gets the C++ API's errors; a busy name fails the whole
// call with nothing left held.
TEST(CApiMultiLease, OneTokenPerNameAndTheLossOfOneIsTheLossOfTheWhole) {
  const std::string url = redis_url_with_prefix("capimulti");
  ClientPtr c = connect_ok(url), other = connect_ok(url);
  ASSERT_TRUE(c && other);
  distlock_error err{};
  distlock_multi_lease* raw = nullptr;
  auto o = opts_with(3000, 0);
  EXPECT_EQ(distlock_acquire_all(c.get(), nullptr, 0, &o, nullptr, &raw, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("the list of names is empty"), std::string::npos) << err.message;
  const char* with_empty[] = {"a", ""};
  EXPECT_EQ(distlock_acquire_all(c.get(), with_empty, 2, &o, nullptr, &raw, &err),
            DISTLOCK_E_INVALID_ARGUMENT);
  auto bad_delay = ext_with_delay(-5);
  const char* two[] = {"b", "a"};
  EXPECT_EQ(distlock_acquire_all(c.get(), two, 2, &o, &bad_delay, &raw, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("lock_delay"), std::string::npos) << err.message;
  EXPECT_EQ(raw, nullptr);

  const char* names[] = {"m/c", "m/a", "m/b", "m/a"};
  ASSERT_EQ(distlock_acquire_all(c.get(), names, 4, &o, nullptr, &raw, &err), DISTLOCK_OK) << err.message;
  MultiPtr m(raw);
  ASSERT_EQ(distlock_multi_lease_count(m.get()), 3u);
  EXPECT_STREQ(distlock_multi_lease_name(m.get(), 0), "m/a");
  EXPECT_STREQ(distlock_multi_lease_name(m.get(), 1), "m/b");
  EXPECT_STREQ(distlock_multi_lease_name(m.get(), 2), "m/c");
  EXPECT_EQ(distlock_multi_lease_name(m.get(), 3), nullptr);
  for (const char* n : {"m/a", "m/b", "m/c"}) {
    std::uint64_t t = 0;
    ASSERT_EQ(distlock_multi_lease_token(m.get(), n, &t, &err), DISTLOCK_OK) << err.message;
    EXPECT_GT(t, 0u) << n;
  }
  std::uint64_t none = 0;
  EXPECT_EQ(distlock_multi_lease_token(m.get(), "m/z", &none, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_EQ(distlock_multi_lease_owns(m.get()), 1);
  EXPECT_GT(distlock_multi_lease_remaining_ms(m.get()), 0);
  EXPECT_EQ(distlock_multi_lease_loss(m.get(), &err), DISTLOCK_OK);

  // A busy name fails the whole call at once (wait 0) and leaves the other names free.
  const char* overlap[] = {"m/b", "m/d"};
  distlock_multi_lease* second = nullptr;
  EXPECT_EQ(distlock_acquire_all(other.get(), overlap, 2, &o, nullptr, &second, &err), DISTLOCK_E_BUSY)
      << err.message;
  distlock_lease* d = nullptr;
  EXPECT_EQ(distlock_try_acquire(other.get(), "m/d", &o, &d, &err), DISTLOCK_OK) << "m/d was left held";
  distlock_lease_free(d);

  int revoked = 0;
  ASSERT_EQ(distlock_revoke(other.get(), "m/b", "multi test", &revoked, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(revoked, 1);
  pollfd p{distlock_multi_lease_lost_fd(m.get()), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1) << "the multi-lease's loss descriptor did not fire within 5 s";
  EXPECT_EQ(distlock_multi_lease_owns(m.get()), 0);
  EXPECT_EQ(distlock_multi_lease_loss(m.get(), &err), DISTLOCK_E_LOST);
  EXPECT_NE(std::string(err.message).find("\"m/b\" lost (revoked)"), std::string::npos) << err.message;
  EXPECT_EQ(distlock_multi_lease_release(m.get(), &err), DISTLOCK_E_LOST);
  EXPECT_NE(std::string(err.message).find("m/b"), std::string::npos) << err.message;
  // Released: the other names are free at once.
  distlock_lease* a = nullptr;
  EXPECT_EQ(distlock_try_acquire(other.get(), "m/a", &o, &a, &err), DISTLOCK_OK) << err.message;
  distlock_lease_free(a);
}

// docs/c.md's multi-lease example (bindings/c/tests/multi_example.c), compiled as C99 and run.
TEST(CApiMultiLease, DocsExampleRuns) {
  const std::string url = redis_url_with_prefix("capimultiex");
  TempDir work("distlock-capi-multi-example");
  const auto out = work.path() / "out";
  Process p = Process::spawn({C_API_MULTI_EXAMPLE_PATH, url}, out.string());
  const int status = p.wait_for(30s);
  std::ifstream in(out);
  std::stringstream s;
  s << in.rdbuf();
  ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << s.str();
  EXPECT_NE(s.str().find("transfer written with tokens "), std::string::npos) << s.str();
}
#endif  // DISTLOCK_TEST_REDIS

}  // namespace
