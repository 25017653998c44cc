// The etcd backend against real etcd processes (one member, and clusters of three)
// that each test starts on free loopback ports.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "etcd_cluster.hpp"
#include "support/client_options.hpp"
#include "support/cs_log.hpp"
#include "support/eventually.hpp"
#include "support/fault_proxy.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

struct KeyInfo {
  std::string key;
  std::int64_t create_rev = 0;
  std::int64_t lease = 0;
  std::string value;
};

// Keys under `prefix`, read with etcdctl (not through the code under test).
std::vector<KeyInfo> keys_under(const EtcdCluster& etcd, const std::string& prefix,
                                const std::string& user = "") {
  const std::string out = etcd.etcdctl_ok({"get", "--prefix", prefix, "-w", "fields"}, user);
  std::vector<KeyInfo> keys;
  std::istringstream in(out);
  std::string line;
  // Lines look like: "Key" : "distlock/job/694d...-1"   or   "CreateRevision" : 5
  while (std::getline(in, line)) {
    const auto sep = line.find("\" : ");
    if (line.empty() || line[0] != '"' || sep == std::string::npos) continue;
    const std::string name = line.substr(1, sep - 1);
    const std::string value = line.substr(sep + 4);
    auto unquote = [](const std::string& v) { return v.size() >= 2 ? v.substr(1, v.size() - 2) : v; };
    if (name == "Key") {
      keys.push_back({unquote(value)});
    } else if (keys.empty()) {
      continue;
    } else if (name == "CreateRevision") {
      keys.back().create_rev = std::stoll(value);
    } else if (name == "Lease") {
      keys.back().lease = std::stoll(value);
    } else if (name == "Value") {
      keys.back().value = unquote(value);
    }
  }
  return keys;
}

std::string hex(std::int64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  return buf;
}

// A write to `resource` that applies only while the lock key created at `token`
// still exists: how a resource kept in etcd fences a stale holder.
bool guarded_write(const EtcdCluster& etcd, const std::string& lock_key, std::uint64_t token,
                   const std::string& resource, const std::string& value) {
  const std::string script = "create(\"" + lock_key + "\") = \"" + std::to_string(token) + "\"\n\nput " +
                             resource + " " + value + "\n\n\n";
  std::string endpoints = etcd.endpoints();
  const auto r = run_command(
      {"sh", "-c", "printf '%s' \"$0\" | etcdctl --endpoints=" + endpoints + " txn", script}, 15s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output.find("SUCCESS") != std::string::npos;
}

using distlock::testing::ttl_of;

TEST(EtcdBackend, TokenIsTheCreateRevisionOfOurKeyAndStatusDescribesIt) {
  EtcdCluster etcd(1);
  Client client = connect(etcd.url());
  std::uint64_t first = 0;
  {
    Lease lease = client.acquire("job", ttl_of(5s));
    ASSERT_TRUE(lease.owns());
    first = lease.token();
    const auto keys = keys_under(etcd, "distlock/job/");
    ASSERT_EQ(keys.size(), 1u);
    EXPECT_EQ(static_cast<std::uint64_t>(keys[0].create_rev), first);
    EXPECT_EQ(keys[0].key.rfind("distlock/job/" + hex(keys[0].lease) + "-", 0), 0u) << keys[0].key;
    EXPECT_EQ(keys[0].value.rfind(client.id() + ":", 0), 0u) << keys[0].value;

    const LockInfo info = client.status("job");
    EXPECT_TRUE(info.held);
    EXPECT_EQ(info.token, first);
    EXPECT_EQ(info.holder, keys[0].value);
    EXPECT_EQ(info.waiters, 0u);
    ASSERT_TRUE(info.ttl_remaining.has_value());
    EXPECT_GT(info.ttl_remaining->count(), 0);
    EXPECT_LE(*info.ttl_remaining, Millis(5s));

    // A Lease is not reentrant: the same thread's try-acquire is busy, and the
    // attempt leaves no second key behind.
    EXPECT_FALSE(client.try_acquire("job", ttl_of(5s)).has_value());
    EXPECT_EQ(keys_under(etcd, "distlock/job/").size(), 1u);
  }
  EXPECT_TRUE(keys_under(etcd, "distlock/job/").empty());
  EXPECT_FALSE(client.status("job").held);
  Lease next = client.acquire("job", ttl_of(5s));
  EXPECT_GT(next.token(), first);
}

TEST(EtcdBackend, UncontendedAcquireAndReleaseCostExactlyTwoWrites) {
  EtcdCluster etcd(1);
  Client client = connect(etcd.url());
  client.acquire("warm", ttl_of(10s)).release();  // the session lease is granted once
  const std::int64_t before = etcd.revision();
  constexpr int kRounds = 20;
  for (int i = 0; i < kRounds; ++i) client.acquire("counted", ttl_of(10s)).release();
  const std::int64_t after = etcd.revision();
  EXPECT_EQ(after - before, 2 * kRounds) << "revision went from " << before << " to " << after;
}

TEST(EtcdBackend, OneSessionLeasePerClientAndTtl) {
  EtcdCluster etcd(1);
  Client client = connect(etcd.url("?prefix=s"));
  Lease a = client.acquire("a", ttl_of(6s));
  Lease b = client.acquire("b", ttl_of(6s));
  Lease c = client.acquire("c", ttl_of(9s));
  const auto ka = keys_under(etcd, "s/a/"), kb = keys_under(etcd, "s/b/"), kc = keys_under(etcd, "s/c/");
  ASSERT_EQ(ka.size(), 1u);
  ASSERT_EQ(kb.size(), 1u);
  ASSERT_EQ(kc.size(), 1u);
  EXPECT_EQ(ka[0].lease, kb[0].lease);
  EXPECT_NE(ka[0].lease, kc[0].lease);
  const std::string ttl = etcd.etcdctl_ok({"lease", "timetolive", hex(kc[0].lease)});
  EXPECT_NE(ttl.find("granted with TTL(9s)"), std::string::npos) << ttl;
  // One keepalive per session renews every lock.
  EXPECT_EQ(client.renew_now(), 3u);
  EXPECT_TRUE(a.owns() && b.owns() && c.owns());
}

TEST(EtcdBackend, NamesAreOpaqueBytesAndDoNotShareQueues) {
  EtcdCluster etcd(1);
  Client one = connect(etcd.url());
  Client two = connect(etcd.url());
  Lease a = one.acquire("a", ttl_of(5s));
  // "a/b" lives under its own encoded prefix, not inside the queue of "a".
  auto ab = two.try_acquire("a/b", ttl_of(5s));
  ASSERT_TRUE(ab.has_value());
  auto pct = two.try_acquire("a%2Fb", ttl_of(5s));
  ASSERT_TRUE(pct.has_value());
  EXPECT_EQ(keys_under(etcd, "distlock/a/").size(), 1u);
  EXPECT_EQ(one.status("a").waiters, 0u);
}

TEST(EtcdBackend, WaitersAcquireInTheOrderTheyQueued) {
  EtcdCluster etcd(1);
  Client holder = connect(etcd.url());
  std::vector<Client> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(connect(etcd.url()));
  Lease held = holder.acquire("fifo", ttl_of(10s));
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::uint64_t> tokens;
  std::vector<std::thread> waiters;
  constexpr int kWaiters = 6;  // two threads per client: in-client and cross-client queueing
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      Lease l = clients[static_cast<std::size_t>(i % 3)].acquire("fifo", ttl_of(10s, 30s));
      std::lock_guard lk(mu);
      order.push_back(i);
      tokens.push_back(l.token());
    });
    // The next waiter starts only once this one's key is queued.
    const auto end = Steady::now() + 10s;
    while (holder.status("fifo").waiters != static_cast<std::uint64_t>(i + 1) && Steady::now() < end) {
      std::this_thread::sleep_for(5ms);
    }
    ASSERT_EQ(holder.status("fifo").waiters, static_cast<std::uint64_t>(i + 1));
  }
  held.release();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_GT(tokens[i], tokens[i - 1]);
}

TEST(EtcdBackend, PausedHolderLosesAndItsGuardedWriteIsRejected) {
  EtcdCluster etcd(1);
  TempDir dir("distlock-etcd-pause");
  const std::string out = (dir.path() / "holder.out").string();
  Process holder = spawn_holder(etcd.url(), "paused", out, 2000);
  ASSERT_TRUE(wait_for_text(out, "acquired", 10s)) << read_file(out);
  const auto stale_token = static_cast<std::uint64_t>(acquired_token(out));
  const auto keys = keys_under(etcd, "distlock/paused/");
  ASSERT_EQ(keys.size(), 1u);
  const std::string stale_key = keys[0].key;
  EXPECT_EQ(static_cast<std::uint64_t>(keys[0].create_rev), stale_token);
  EXPECT_TRUE(guarded_write(etcd, stale_key, stale_token, "resource", "before-pause"));

  holder.signal(SIGSTOP);
  Client client = connect(etcd.url());
  Lease lease = client.acquire("paused", ttl_of(2s, 15s));
  EXPECT_GT(lease.token(), stale_token);
  holder.signal(SIGCONT);
  EXPECT_TRUE(wait_for_line(out, "lost", 5s)) << read_file(out);
  // The stale holder's write is fenced off; the new holder's goes through.
  EXPECT_FALSE(guarded_write(etcd, stale_key, stale_token, "resource", "stale"));
  const auto now_keys = keys_under(etcd, "distlock/paused/");
  ASSERT_EQ(now_keys.size(), 1u);
  EXPECT_TRUE(guarded_write(etcd, now_keys[0].key, lease.token(), "resource", "fresh"));
  EXPECT_NE(etcd.etcdctl_ok({"get", "resource", "--print-value-only"}).find("fresh"), std::string::npos);
  holder.signal(SIGTERM);
  holder.wait_for(5s);
}

TEST(EtcdBackend, LeaseRevokedFromOutsideFiresTheStopSignal) {
  EtcdCluster etcd(1);
  Client client = connect(etcd.url());
  Lease lease = client.acquire("revoked", ttl_of(3s));
  std::atomic<bool> called{false};
  lease.on_lost([&] { called = true; });
  const auto keys = keys_under(etcd, "distlock/revoked/");
  ASSERT_EQ(keys.size(), 1u);
  etcd.etcdctl_ok({"lease", "revoke", hex(keys[0].lease)});
  const auto end = Steady::now() + 4s;
  while (!lease.stop_token().stop_requested() && Steady::now() < end) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(lease.stop_token().stop_requested());
  // The stop token is requested just before the on_lost callbacks run, on the thread that
  // saw the loss: wait (bounded, 5 s) for the callback too.
  for (int i = 0; i < 500 && !called.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(called.load());
  EXPECT_FALSE(lease.owns());
  std::error_code ec;
  lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
  // A new session serves the next acquisition.
  Lease next = client.acquire("revoked", ttl_of(3s));
  const auto now_keys = keys_under(etcd, "distlock/revoked/");
  ASSERT_EQ(now_keys.size(), 1u);
  EXPECT_NE(now_keys[0].lease, keys[0].lease);
}

TEST(EtcdBackend, WaiterWhoseKeyVanishedQueuesAgainInsteadOfBelievingItOwns) {
  EtcdCluster etcd(1);
  Client holder = connect(etcd.url());
  Client waiter = connect(etcd.url());
  Lease held = holder.acquire("jepsen", ttl_of(4s));
  std::atomic<std::uint64_t> got{0};
  Lease waited;
  std::thread t([&] {
    waited = waiter.acquire("jepsen", ttl_of(4s, 20s));
    got = waited.token();
  });
  const auto end = Steady::now() + 10s;
  while (holder.status("jepsen").waiters != 1u && Steady::now() < end) std::this_thread::sleep_for(5ms);
  auto keys = keys_under(etcd, "distlock/jepsen/");
  ASSERT_EQ(keys.size(), 2u);
  const auto waiter_lease = keys[1].lease;
  etcd.etcdctl_ok({"lease", "revoke", hex(waiter_lease)});
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(got.load(), 0u) << "the waiter must not own the lock while the holder holds it";
  const std::uint64_t held_token = held.token();
  held.release();
  t.join();
  EXPECT_GT(got.load(), held_token);
  keys = keys_under(etcd, "distlock/jepsen/");
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_NE(keys[0].lease, waiter_lease);
  EXPECT_EQ(static_cast<std::uint64_t>(keys[0].create_rev), got.load());
}

// A release that times out (etcd stopped) leaves the key behind for the client to
// delete later. A new acquisition by the same thread must queue under a new key
// (never adopt the old one: its token would repeat), and the later clean-up of the
// old key must never free a lock that is held again.
TEST(EtcdBackend, ReacquireAfterATimedOutReleaseNeverAdoptsTheOldKey) {
  EtcdCluster etcd(1);
  ClientOptions quick;
  quick.command_timeout = 700ms;
  Client client = connect(etcd.url(), quick);
  Client other = connect(etcd.url());
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string name = "orphan" + std::to_string(round);
    const std::string prefix = "distlock/" + name + "/";
    Lease first = client.acquire(name, ttl_of(10s));
    const std::uint64_t first_token = first.token();
    const auto first_keys = keys_under(etcd, prefix);
    ASSERT_EQ(first_keys.size(), 1u);
    etcd.pause(0);
    std::error_code ec;
    first.release(ec);
    // Give the client's clean-up a chance to be in flight when etcd comes back.
    std::this_thread::sleep_for(std::chrono::milliseconds(300 * round));
    etcd.resume(0);
    EXPECT_TRUE(ec) << "release answered while etcd was stopped";
    Lease again = client.acquire(name, ttl_of(10s, 20s));
    EXPECT_NE(again.token(), first_token) << "the re-acquire adopted the key of the failed release";
    // The old key goes (it never outlives the client's session); the new one stays.
    ASSERT_TRUE(eventually([&] { return keys_under(etcd, prefix).size() == 1; }, 10s))
        << keys_under(etcd, prefix).size() << " keys";
    std::this_thread::sleep_for(1500ms);  // past the clean-up's retry interval
    const auto keys = keys_under(etcd, prefix);
    ASSERT_EQ(keys.size(), 1u);
    EXPECT_EQ(static_cast<std::uint64_t>(keys[0].create_rev), again.token());
    EXPECT_NE(keys[0].key, first_keys[0].key) << "a queue key was used by two acquisitions";
    EXPECT_TRUE(again.owns());
    EXPECT_FALSE(again.stop_token().stop_requested());
    EXPECT_FALSE(other.try_acquire(name, ttl_of(10s)).has_value())
        << "a second client acquired while the first still owns";
    again.release();
  }
}

// `etcdctl del --prefix` of a held lock: the holder's renewal sees its key gone and
// declares the loss; a client that acquires afterwards never overlaps a holder that
// still believes it owns.
TEST(EtcdBackend, KeyDeletedFromOutsideIsLostWithinOneRenewInterval) {
  EtcdCluster etcd(1);
  Client holder = connect(etcd.url());
  Client other = connect(etcd.url());
  LockOptions o = ttl_of(9s);
  o.renew_interval = 1s;
  Lease a = holder.acquire("deleted", o);
  Lease b = holder.acquire("kept", o);  // renewed in the same batch, must stay held
  std::atomic<bool> called{false};
  a.on_lost([&] { called = true; });
  ASSERT_EQ(keys_under(etcd, "distlock/deleted/").size(), 1u);
  etcd.etcdctl_ok({"del", "--prefix", "distlock/deleted/"});
  const auto deleted = Steady::now();
  const bool fired = eventually([&] { return a.stop_token().stop_requested(); }, 8s);
  const auto took = std::chrono::duration_cast<Millis>(Steady::now() - deleted);
  ASSERT_TRUE(fired) << "no stop signal " << took.count() << " ms after the key was deleted";
  // One renew interval (1 s) plus generous slack for a busy machine; far below the 9 s TTL.
  EXPECT_LT(took, 4s) << took.count() << " ms";
  std::printf("loss signalled %lld ms after the external delete\n", static_cast<long long>(took.count()));
  // The stop token is requested just before the on_lost callbacks run, on the thread that
  // saw the loss: wait (bounded, 5 s) for the callback too.
  for (int i = 0; i < 500 && !called.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(called.load());
  EXPECT_FALSE(a.owns());
  Lease next = other.acquire("deleted", ttl_of(9s, 5s));
  EXPECT_FALSE(a.owns()) << "two owners";
  EXPECT_GT(next.token(), a.token());
  std::error_code ec;
  a.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_TRUE(b.owns());
  EXPECT_FALSE(b.stop_token().stop_requested());
  // renew_now() skips a lease whose background renewal is in flight at that moment:
  // ask until one explicit renewal of `b` alone has gone through.
  EXPECT_TRUE(eventually([&] { return holder.renew_now() == 1u; }, 5s))
      << "the kept lock could not be renewed";
  EXPECT_TRUE(b.owns());
}

// Txn requests etcd has served so far (its Prometheus endpoint on the client port).
long long served_txns(const EtcdCluster& etcd) {
  const auto r = run_command({"curl", "-s", "http://" + etcd.endpoint(0) + "/metrics"}, 10s);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(r.output);
  std::string line;
  long long total = 0;
  while (std::getline(in, line)) {
    if (line.rfind("grpc_server_handled_total{", 0) == 0 &&
        line.find("grpc_method=\"Txn\"") != std::string::npos) {
      total += std::stoll(line.substr(line.rfind(' ') + 1));
    }
  }
  return total;
}

// The key check of a renewal is batched: 200 held locks cost two Txns (128 keys
// each at most, etcd's default --max-txn-ops), not 200.
TEST(EtcdBackend, RenewalChecksEveryHeldKeyInBatchedTxns) {
  EtcdCluster etcd(1);
  Client client = connect(etcd.url());
  std::vector<Lease> leases;
  for (int i = 0; i < 200; ++i) leases.push_back(client.acquire("many" + std::to_string(i), ttl_of(30s)));
  const long long before = served_txns(etcd);
  EXPECT_EQ(client.renew_now(), 200u);
  const long long txns = served_txns(etcd) - before;
  EXPECT_GE(txns, 2);
  EXPECT_LE(txns, 3) << "one Txn per lock?";  // a background renewal may overlap by one
  std::printf("renewal of 200 locks: %lld Txn(s)\n", txns);
  etcd.etcdctl_ok({"del", "distlock/many7/", "--prefix"});
  EXPECT_EQ(client.renew_now(), 199u);
  EXPECT_TRUE(leases[7].stop_token().stop_requested());
  EXPECT_TRUE(leases[8].owns());
}

// etcd's largest lease TTL is 9,000,000,000 s. A longer TTL (up to Millis::max(),
// where `ttl + 999` used to overflow) is refused with invalid_argument naming the
// limit, and nothing is created on the server.
// The library's own TTL limit (366 days) is below etcd's largest lease TTL
// (9,000,000,000 s), so every TTL etcd could not grant is refused before a request is
// sent, naming the limit, and leaves nothing on the server; the largest TTL is granted.
TEST(EtcdBackend, TtlBeyondTheLimitIsRefusedAndLeavesNothing) {
  EtcdCluster etcd(1);
  Client client = connect(etcd.url());
  const std::int64_t before = etcd.revision();
  for (const Millis ttl :
       {Millis::max(), Millis(9'000'000'000'001), Millis(9'000'000'001'000),
        Millis(std::numeric_limits<std::int64_t>::max() - 500), LockOptions::max_ttl + 1ms}) {
    SCOPED_TRACE(std::to_string(ttl.count()) + " ms");
    try {
      client.acquire("huge", ttl_of(ttl));
      ADD_FAILURE() << "acquired with an out-of-range TTL";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
      EXPECT_NE(std::string(e.what()).find("maximum"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(keys_under(etcd, "distlock/").empty());
  EXPECT_EQ(etcd.revision(), before);
  const std::string leases = etcd.etcdctl_ok({"lease", "list"});
  EXPECT_NE(leases.find("found 0 leases"), std::string::npos) << leases;
  // The limit itself is accepted and granted in whole seconds.
  Lease at_limit = client.acquire("huge", ttl_of(LockOptions::max_ttl));
  EXPECT_TRUE(at_limit.owns());
  const auto keys = keys_under(etcd, "distlock/huge/");
  ASSERT_EQ(keys.size(), 1u);
  const std::string ttl = etcd.etcdctl_ok({"lease", "timetolive", hex(keys[0].lease)});
  const std::string granted =
      "granted with TTL(" + std::to_string(LockOptions::max_ttl.count() / 1000) + "s)";
  EXPECT_NE(ttl.find(granted), std::string::npos) << ttl;
  at_limit.release();
  EXPECT_TRUE(keys_under(etcd, "distlock/huge/").empty());
}

TEST(EtcdCluster3, LeaderKilledDuringContentionKeepsMutualExclusion) {
  EtcdCluster etcd(3);
  std::vector<Client> clients;
  ClientOptions copts;
  copts.command_timeout = 3s;
  for (int i = 0; i < 3; ++i) clients.push_back(connect(etcd.url(), copts));
  std::atomic<int> inside{0}, overlaps{0}, acquired_after_kill{0}, errors{0};
  std::atomic<bool> killed{false}, stop{false};
  std::mutex token_mu;
  std::uint64_t last_token = 0;
  int token_regressions = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      for (int n = 0; n < 400 && !stop; ++n) {
        std::error_code ec;
        Lease l = clients[static_cast<std::size_t>(i % 3)].acquire("leader", ttl_of(5s, 20s), ec);
        if (ec) {
          ++errors;
          std::this_thread::sleep_for(50ms);
          continue;
        }
        // A lease whose acquisition outlasted its validity (the answer came back
        // after the election) is not a critical section.
        if (!l.owns()) continue;
        if (inside.fetch_add(1) != 0) ++overlaps;
        {
          std::lock_guard lk(token_mu);
          if (l.token() <= last_token) ++token_regressions;
          last_token = l.token();
        }
        std::this_thread::sleep_for(1ms);
        inside.fetch_sub(1);
        if (killed) ++acquired_after_kill;
        l.release(ec);
      }
    });
  }
  std::this_thread::sleep_for(1500ms);
  const int leader = etcd.leader();
  ASSERT_GE(leader, 0);
  etcd.kill(leader);
  killed = true;
  const auto end = Steady::now() + 20s;
  while (acquired_after_kill < 30 && Steady::now() < end) std::this_thread::sleep_for(50ms);
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(token_regressions, 0);
  EXPECT_GE(acquired_after_kill.load(), 30) << "errors: " << errors.load();
  EXPECT_GE(etcd.leader(), 0);
}

TEST(EtcdBackend, ClientGoesOnAfterTheServerRestarts) {
  EtcdCluster etcd(1);
  Client client = connect(etcd.url("?timeout=1s"));
  const auto first = client.acquire("restart", ttl_of(3s)).token();
  etcd.kill(0);
  std::error_code ec;
  client.acquire("restart", ttl_of(3s, 0ms), ec);
  EXPECT_EQ(ec, errc::backend_unavailable) << ec.message();
  etcd.restart(0);
  const auto restarted = Steady::now();
  Lease l;
  const auto end = Steady::now() + 15s;
  do {
    l = client.acquire("restart", ttl_of(3s, 5s), ec);
  } while (ec && Steady::now() < end);
  ASSERT_FALSE(ec) << ec.message() << "\n" << etcd.log(0);
  EXPECT_GT(l.token(), first);
  EXPECT_LT(Steady::now() - restarted, 10s);
}

template <class Fn>
std::system_error connect_error(Fn&& fn);

TEST(EtcdBackend, MutualTlsWithCaClientCertificateAndKey) {
  EtcdCluster etcd(1, /*tls=*/true);
  const std::string base = "etcd://" + etcd.endpoints() + "?cacert=" + etcd.ca_file();
  Client client = connect(base + "&cert=" + etcd.client_cert_file() + "&key=" + etcd.client_key_file());
  Lease lease = client.acquire("tls", ttl_of(3s));
  const auto keys = keys_under(etcd, "distlock/tls/");
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(static_cast<std::uint64_t>(keys[0].create_rev), lease.token());
  lease.release();
  // The server demands a client certificate; plain text does not reach it either.
  ClientOptions quick;
  quick.connect_timeout = 500ms;
  quick.command_timeout = 500ms;
  EXPECT_EQ(connect_error([&] { connect(base, quick); }).code(), errc::backend_unavailable);
  EXPECT_EQ(connect_error([&] { connect("etcd://" + etcd.endpoints(), quick); }).code(),
            errc::backend_unavailable);
}

template <class Fn>
std::system_error connect_error(Fn&& fn) {
  try {
    fn();
  } catch (const std::system_error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an error";
  return std::system_error(std::error_code{});
}

TEST(EtcdBackend, BadUrlsAndUnreachableEndpointsGiveClearErrors) {
  const auto p1 = free_port(), p2 = free_port();
  const std::string dead = "etcd://127.0.0.1:" + std::to_string(p1) + ",127.0.0.1:" + std::to_string(p2);
  auto e = connect_error([&] { connect(dead + "?timeout=300ms"); });
  EXPECT_EQ(e.code(), errc::backend_unavailable);
  EXPECT_NE(std::string(e.what()).find(std::to_string(p2)), std::string::npos) << e.what();

  struct Case {
    std::string url;
    errc code;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {"etcd://", errc::invalid_url, "etcd://"},
      {"etcd://127.0.0.1:99999", errc::invalid_url, "99999"},
      {"etcd://127.0.0.1:2379/some/path", errc::invalid_url, "path"},
      {"etcd://127.0.0.1:2379?colour=red", errc::invalid_url, "colour"},
      {"etcd://127.0.0.1:2379?tls=maybe", errc::invalid_url, "maybe"},
      {"etcd://127.0.0.1:2379?cacert=/nonexistent/ca.pem", errc::invalid_argument, "/nonexistent/ca.pem"},
      {"etcd://127.0.0.1:2379?tls=1&cert=/nonexistent/c.pem&key=/nonexistent/k.pem", errc::invalid_argument,
       "/nonexistent/c.pem"},
      {"etcd://127.0.0.1:2379?cert=/etc/hostname", errc::invalid_argument, "key="},
  };
  for (const auto& c : cases) {
    auto err = connect_error([&] { connect(c.url); });
    EXPECT_EQ(err.code(), c.code) << c.url << ": " << err.what();
    EXPECT_NE(std::string(err.what()).find(c.mentions), std::string::npos) << c.url << ": " << err.what();
  }
}

TEST(EtcdBackend, AuthenticationWithUserAndPassword) {
  EtcdCluster etcd(1);
  etcd.etcdctl_ok({"user", "add", "root:rootpw"});
  etcd.etcdctl_ok({"user", "add", "locker:s3cret"});
  etcd.etcdctl_ok({"role", "add", "lockers"});
  etcd.etcdctl_ok({"role", "grant-permission", "lockers", "--prefix=true", "readwrite", "distlock/"});
  etcd.etcdctl_ok({"user", "grant-role", "locker", "lockers"});
  etcd.etcdctl_ok({"auth", "enable"});
  const std::string base = etcd.endpoints();

  auto wrong = connect_error([&] { connect("etcd://locker:wrong@" + base); });
  EXPECT_EQ(wrong.code(), errc::auth_failed) << wrong.what();
  EXPECT_NE(std::string(wrong.what()).find("locker"), std::string::npos) << wrong.what();
  EXPECT_EQ(std::string(wrong.what()).find("wrong"), std::string::npos)
      << "password leaked: " << wrong.what();

  auto none = connect_error([&] { connect("etcd://" + base); });
  EXPECT_EQ(none.code(), errc::auth_failed) << none.what();

  Client client = connect("etcd://locker:s3cret@" + base);
  EXPECT_EQ(client.url().find("s3cret"), std::string::npos);
  Client other = connect("etcd://locker:s3cret@" + base);
  Lease l = client.acquire("secured", ttl_of(3s));
  EXPECT_FALSE(other.try_acquire("secured", ttl_of(3s)).has_value());
  EXPECT_EQ(client.status("secured").token, l.token());
  l.release();
  EXPECT_TRUE(other.try_acquire("secured", ttl_of(3s)).has_value());

  // A prefix the user may not use.
  auto denied = connect_error([&] { connect("etcd://locker:s3cret@" + base + "?prefix=forbidden"); });
  EXPECT_EQ(denied.code(), errc::auth_failed) << denied.what();
}

// An acquire whose Txn reached etcd and was applied, but whose answer came after the
// command timeout, fails: it must leave no key behind. Such a key queues ahead of
// everybody and lives as long as this client keeps its session alive, so no other
// client could ever take the lock.
TEST(EtcdBackend, AnAcquireThatTimedOutAfterItsTxnWasAppliedLeavesNoKey) {
  EtcdCluster etcd(1);
  FaultProxy proxy(etcd.client_port(0));
  ClientOptions quick;
  quick.command_timeout = 500ms;
  Client client = connect("etcd://127.0.0.1:" + std::to_string(proxy.port()), quick);
  Client other = connect(etcd.url());
  // Make the session first (a lock of the same TTL), while the network is fast. Its
  // TTL (10 s) outlasts the slow spell, so the session (and any key on it) lives on.
  Lease warm = client.acquire("warm", ttl_of(10s));
  for (const bool may_wait : {false, true}) {
    SCOPED_TRACE(may_wait ? "acquire with a wait" : "try_acquire");
    const std::string name = may_wait ? "late-wait" : "late-try";
    const std::int64_t before = etcd.revision();
    proxy.delay(1500ms);  // requests arrive after the client has given up on them
    std::error_code ec;
    if (may_wait) {
      Lease l = client.acquire(name, ttl_of(10s, 20s), ec);
    } else {
      try {
        (void)client.try_acquire(name, ttl_of(10s));
        ec = {};
      } catch (const std::system_error& e) {
        ec = e.code();
      }
    }
    ASSERT_TRUE(ec) << "the acquire answered within the timeout";
    // Let the late Txn reach etcd and apply (switching the proxy back now would
    // deliver it together with the client's cancellation).
    ASSERT_TRUE(eventually([&] { return etcd.revision() > before; }, 10s)) << "the late Txn never applied";
    proxy.pass();
    // The other client gets the lock once the late Txn's key is cleaned up.
    std::optional<Lease> got;
    const bool acquired = eventually(
        [&] {
          got = other.try_acquire(name, ttl_of(10s));
          return got.has_value();
        },
        15s);
    EXPECT_TRUE(acquired) << "a key of the failed acquire blocks the lock: "
                          << keys_under(etcd, "distlock/" + name + "/").size() << " key(s) under it";
    got.reset();
  }
  EXPECT_TRUE(warm.owns());
}

}  // namespace
}  // namespace distlock::testing
