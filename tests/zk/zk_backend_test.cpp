// zk:// against a real ZooKeeper server started by this binary (one per process:
// CTest runs each TEST in its own process, and a standalone server starts in ~1 s).
#include "zk/zk_backend.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_server.hpp"
#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;

Client connect_zk(const std::string& suffix = "?session_timeout=4s") {
  return connect(shared_server().url(suffix), quiet());
}

detail::ZkStats stats_of(const Client& c) {
  auto st = detail::zk_stats(distlock::detail::engine_of(c)->backend());
  EXPECT_TRUE(st.has_value());
  return st.value_or(detail::ZkStats{});
}

LockOptions ttl(Millis t) {
  LockOptions o;
  o.ttl = t;
  return o;
}

std::string queue_dir(const std::string& name) {
  return detail::zk::lock_dir(name);
}

// Starts one thread per client of `clients` into `threads`, each acquiring `name` with `ttl_ms`
// and `wait`, then calling `granted(i)` while it holds the lease; the next thread starts only
// once this one is in the queue (the waiter count `holder_client` sees, within 10 s).
void start_queued_waiters(Client& holder_client, const std::string& name, std::vector<Client>& clients,
                          Millis ttl_ms, Millis wait, std::function<void(int)> granted,
                          std::vector<std::thread>& threads) {
  for (int i = 0; i < static_cast<int>(clients.size()); ++i) {
    threads.emplace_back([&clients, name, ttl_ms, wait, granted, i] {
      LockOptions o = ttl(ttl_ms);
      o.wait = wait;
      std::error_code ec;
      Lease l = clients[static_cast<std::size_t>(i)].acquire(name, o, ec);
      ASSERT_FALSE(ec) << ec.message();
      granted(i);
    });
    ASSERT_TRUE(
        eventually([&] { return holder_client.status(name).waiters == static_cast<unsigned>(i + 1); }, 10s))
        << "waiter " << i << " of \"" << name << "\" was not queued within 10 s";
  }
}

TEST(ZkBackend, AcquireReleaseTokenIsTheNodesCzxid) {
  Client client = connect_zk();
  RawZk raw(shared_server().hostport());
  Lease lease = client.acquire("orders/42", ttl(4s));
  ASSERT_TRUE(lease.owns());
  const auto nodes = raw.children(queue_dir("orders/42"));
  ASSERT_EQ(nodes.size(), 1u);
  Stat st{};
  ASSERT_EQ(raw.exists(queue_dir("orders/42") + "/" + nodes[0], &st), ZOK);
  EXPECT_EQ(lease.token(), static_cast<std::uint64_t>(st.czxid));
  EXPECT_NE(st.ephemeralOwner, 0) << "lock node must be ephemeral";
  EXPECT_EQ(st.ephemeralOwner, stats_of(client).session_id);
  EXPECT_NE(nodes[0].find("-lock-"), std::string::npos) << nodes[0];

  const LockInfo info = client.status("orders/42");
  EXPECT_TRUE(info.held);
  EXPECT_EQ(info.token, lease.token());
  EXPECT_EQ(info.waiters, 0u);
  ASSERT_TRUE(info.holder.has_value());
  EXPECT_EQ(info.holder->rfind(client.id(), 0), 0u) << *info.holder;
  EXPECT_FALSE(info.ttl_remaining.has_value());

  lease.release();
  EXPECT_TRUE(raw.children(queue_dir("orders/42")).empty());
  EXPECT_FALSE(client.status("orders/42").held);
}

// Client::stats().round_trips on zk://: every request counts one (src/zk/zk_call.cpp). After a
// first acquisition (the session's presence node, the lock directory's parents), one attempt
// (try_acquire) on a free name is three: a sync and the listing of the queue, sent together (the
// sync makes a lagging follower catch up first: docs/zookeeper.md "Acquire"), then one multi
// (create our node and touch the directory); its release is one delete; a status of a free name
// is two (a sync and the listing).
TEST(ZkBackend, RoundTripsCountOneRequestEach) {
  Client client = connect_zk();
  {
    Lease warm = client.acquire("rt/warm", ttl(4s));
    ASSERT_TRUE(warm.owns());
  }
  const std::uint64_t start = client.stats().round_trips;
  EXPECT_GT(start, 0u);
  // TTL 8 s (twice the session timeout, the most allowed): its first renewal, a sync and an
  // exists, comes 2.7 s later, after the counted calls.
  auto lease = client.try_acquire("rt/warm", ttl(8s));
  ASSERT_TRUE(lease);
  EXPECT_EQ(client.stats().round_trips - start, 3u);
  lease->release();
  EXPECT_EQ(client.stats().round_trips - start, 4u);
  // A status of a name nobody ever took: a sync and the listing, sent together (a lagging
  // follower catches up first: docs/design.md "ZooKeeper").
  EXPECT_FALSE(client.status("rt/never").held);
  EXPECT_EQ(client.stats().round_trips - start, 6u);
}

TEST(ZkBackend, NegotiatedSessionTimeoutIsTheValidity) {
  Client client = connect_zk("?session_timeout=3s");
  EXPECT_EQ(stats_of(client).session_timeout_ms, 3000);
  Lease lease = client.acquire("validity", ttl(3s));
  // deadline = send time + 3 s session - 300 ms margin
  EXPECT_GT(lease.remaining(), 2000ms);
  EXPECT_LE(lease.remaining(), 2700ms);
  EXPECT_EQ(client.renew_now(), 1u);
  EXPECT_TRUE(lease.owns());
}

TEST(ZkBackend, SessionTimeoutDefaultsToTheLockTtl) {
  ClientOptions o = quiet();
  o.lock_defaults.ttl = 5s;
  Client client = connect(shared_server().url(), o);
  EXPECT_EQ(stats_of(client).session_timeout_ms, 5000);
  // The server clamps to its bounds (maxSessionTimeout 60 s in the test server).
  o.lock_defaults.ttl = std::chrono::minutes(5);
  Client clamped = connect(shared_server().url(), o);
  EXPECT_EQ(stats_of(clamped).session_timeout_ms, 60000);
}

TEST(ZkBackend, OddNamesAreSafeAndDistinct) {
  Client client = connect_zk();
  RawZk raw(shared_server().hostport());
  const std::vector<std::string> names = {"a/b",
                                          "a%2Fb",
                                          ".",
                                          "..",
                                          "x\r\ny",
                                          "with spaces",
                                          std::string("\xff\xfe\x01", 3),
                                          "zookeeper",
                                          std::string(4096, 'n'),
                                          "/leading",
                                          "trailing/"};
  std::vector<Lease> held;
  for (const auto& n : names) {
    std::error_code ec;
    held.push_back(client.acquire(n, ttl(4s), ec));
    ASSERT_FALSE(ec) << "name of " << n.size() << " bytes: " << ec.message();
    EXPECT_TRUE(held.back().owns());
  }
  // All held at once: every name maps to its own directory.
  EXPECT_EQ(raw.children("/distlock").size() >= names.size(), true);
  for (const auto& n : names) EXPECT_TRUE(client.status(n).held) << n.size();
  held.clear();
  for (const auto& n : names) EXPECT_FALSE(client.status(n).held) << n.size();
}

TEST(ZkBackend, FifoOrderOfWaiters) {
  constexpr int kWaiters = 8;
  Client holder_client = connect_zk();
  Lease holder = holder_client.acquire("fifo", ttl(4s));
  std::vector<Client> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(connect_zk());
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread> threads;
  ASSERT_NO_FATAL_FAILURE(start_queued_waiters(
      holder_client, "fifo", clients, 4s, 30s,
      [&](int i) {
        std::lock_guard lk(mu);
        order.push_back(i);
      },
      threads));
  holder.release();
  for (auto& t : threads) t.join();
  std::vector<int> expected(kWaiters);
  for (int i = 0; i < kWaiters; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
}

TEST(ZkBackend, OneReleaseWakesExactlyOneWaiter) {
  constexpr int kWaiters = 16;
  Client holder_client = connect_zk("?session_timeout=10s");
  Lease holder = holder_client.acquire("herd", ttl(10s));
  std::vector<Client> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(connect_zk("?session_timeout=10s"));
  std::atomic<int> acquired{0};
  std::atomic<bool> let_go{false};
  std::vector<std::thread> threads;
  ASSERT_NO_FATAL_FAILURE(start_queued_waiters(
      holder_client, "herd", clients, 10s, 60s,
      [&](int) {
        ++acquired;
        while (!let_go) std::this_thread::sleep_for(5ms);
      },
      threads));
  auto total_events = [&] {
    std::uint64_t n = 0;
    for (auto& c : clients) n += stats_of(c).watch_events;
    return n;
  };
  ASSERT_EQ(total_events(), 0u);
  holder.release();
  ASSERT_TRUE(eventually([&] { return acquired.load() == 1; }, 10s));
  std::this_thread::sleep_for(500ms);  // give a herd time to show up
  EXPECT_EQ(acquired.load(), 1);
  EXPECT_EQ(total_events(), 1u) << "a release must notify exactly one waiter";
  int woken = 0;
  for (auto& c : clients) woken += stats_of(c).watch_events > 0 ? 1 : 0;
  EXPECT_EQ(woken, 1);
  let_go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(acquired.load(), kWaiters);
  // Each of the 16 hand-overs after the first woke exactly one client.
  EXPECT_EQ(total_events(), static_cast<std::uint64_t>(kWaiters));
}

// Ends `client`'s session on the server the way Curator's KillSession does: a second
// connection attaches to the session (id + password) and closes it. The server drops
// whichever connection attached last, so the client may take its session back before
// the close request arrives; then the close does nothing and the session (and the
// lease) legitimately live on. So the close is repeated until `node`, an ephemeral
// node of the session, is gone. Returns the steady time just before the last check that
// saw the node still there: the session ended after it.
std::chrono::steady_clock::time_point end_session(const Client& client, RawZk& observer,
                                                  const std::string& node, int& attempts) {
  const detail::ZkStats st = stats_of(client);
  clientid_t id{};
  id.client_id = st.session_id;
  std::memcpy(id.passwd, st.session_password.data(), sizeof id.passwd);
  for (attempts = 1; attempts <= 20; ++attempts) {
    const auto alive_at = std::chrono::steady_clock::now();
    if (observer.exists(node) != ZOK) {
      ADD_FAILURE() << "lock node " << node << " vanished before the session was closed";
      return alive_at;
    }
    { RawZk thief(shared_server().hostport(), id); }
    if (eventually([&] { return observer.exists(node) == ZNONODE; }, 5s)) return alive_at;
  }
  ADD_FAILURE() << "the session survived 20 attempts to close it";
  return std::chrono::steady_clock::now();
}

TEST(ZkBackend, ExpiredSessionLosesItsLocksAndANewSessionServesNewOnes) {
  Client client = connect_zk("?session_timeout=2s");
  Client other = connect_zk("?session_timeout=2s");
  LockOptions opts = ttl(2s);
  ASSERT_FALSE(opts.validate_and_fill());
  Lease lease = client.acquire("expiry", opts);
  const std::uint64_t first_token = lease.token();
  std::atomic<bool> callback{false};
  lease.on_lost([&] { callback = true; });
  // When the stop token fires, on the process's own clock.
  std::atomic<std::chrono::steady_clock::rep> stopped_at{0};
  std::stop_callback on_stop(
      lease.stop_token(), [&] { stopped_at = std::chrono::steady_clock::now().time_since_epoch().count(); });
  const detail::ZkStats before = stats_of(client);
  const Millis session(before.session_timeout_ms);
  RawZk observer(shared_server().hostport());
  const auto nodes = observer.children(queue_dir("expiry"));
  ASSERT_EQ(nodes.size(), 1u);
  int attempts = 0;
  const auto alive_at = end_session(client, observer, queue_dir("expiry") + "/" + nodes[0], attempts);
  // The guarantee: a lease whose session is gone is lost within the session timeout
  // plus one renewal interval of the session's end (the last confirmation was sent
  // before the end, so the local deadline, send time + session - margin, comes before
  // end + session; a renewal after the end is refused at once). Slack for a loaded machine: 2 s.
  const Millis bound = session + opts.renew_interval;
  ASSERT_TRUE(eventually([&] { return lease.stop_token().stop_requested(); }, bound + 10s))
      << "the stop token did not fire " << (bound + 10s).count() << " ms after the session was closed";
  const auto lost_after = std::chrono::duration_cast<Millis>(
      std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(stopped_at.load())) -
      alive_at);
  std::printf(
      "session closed after %d attempt(s); stop token fired %lld ms after the session was last seen "
      "alive (bound %lld ms + 2000 ms slack)\n",
      attempts, static_cast<long long>(lost_after.count()), static_cast<long long>(bound.count()));
  EXPECT_LE(lost_after, bound + 2s);
  // The stop token is requested just before the on_lost callbacks run, on the thread that
  // saw the loss: wait (bounded, 5 s) for the callback too.
  for (int i = 0; i < 500 && !callback.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(callback.load());
  EXPECT_FALSE(lease.owns());
  // Another client can take it now, with a larger token.
  Lease next = other.acquire("expiry", ttl(2s));
  const std::uint64_t next_token = next.token();
  EXPECT_GT(next_token, first_token);
  next.release();
  // The expired client opened a new session and locks again.
  Lease again = client.acquire("expiry", ttl(2s));
  EXPECT_GT(again.token(), next_token);
  EXPECT_EQ(stats_of(client).sessions, 2u);
  EXPECT_NE(stats_of(client).session_id, before.session_id);
  std::error_code ec;
  lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_TRUE(again.owns()) << "releasing the lost lease must not touch the new one";
}

TEST(ZkBackend, NodeDeletedFromOutsideIsALoss) {
  Client client = connect_zk();
  RawZk raw(shared_server().hostport());
  Lease lease = client.acquire("deleted", ttl(4s));
  const auto nodes = raw.children(queue_dir("deleted"));
  ASSERT_EQ(nodes.size(), 1u);
  ASSERT_EQ(raw.remove(queue_dir("deleted") + "/" + nodes[0]), ZOK);
  client.renew_now();
  EXPECT_TRUE(lease.stop_token().stop_requested());
  std::error_code ec;
  lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
}

TEST(ZkBackend, ChrootKeepsNodesUnderIt) {
  RawZk raw(shared_server().hostport());
  ASSERT_EQ(raw.create("/tenant-a"), ZOK);
  Client client = connect_zk("/tenant-a?session_timeout=4s");
  Lease lease = client.acquire("job", ttl(4s));
  EXPECT_EQ(raw.children("/tenant-a" + queue_dir("job")).size(), 1u);
  EXPECT_TRUE(raw.children(queue_dir("job")).empty());
}

TEST(ZkBackend, MissingChrootIsAClearError) {
  std::error_code ec;
  try {
    connect(shared_server().url("/no/such/chroot"), quiet());
    FAIL() << "connect must fail";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("chroot \"/no/such/chroot\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

TEST(ZkBackend, WrongPasswordCannotJoinOrDisturbAnotherUsersLock) {
  const std::string hp = shared_server().hostport();
  Client alice = connect("zk://alice:right@" + hp + "?session_timeout=4s", quiet());
  std::vector<std::string> messages;
  std::mutex mu;
  ClientOptions mallory_opts;
  mallory_opts.logger = [&](LogLevel, std::string_view m) {
    std::lock_guard lk(mu);
    messages.emplace_back(m);
  };
  Client mallory = connect("zk://alice:wrong@" + hp + "?session_timeout=4s", mallory_opts);
  Lease lease = alice.acquire("vault", ttl(4s));

  std::error_code ec;
  mallory.acquire(
      "vault",
      [] {
        LockOptions o;
        o.ttl = 4s;
        o.wait = 0ms;
        return o;
      }(),
      ec);
  EXPECT_EQ(ec, errc::busy) << "a one-shot attempt only reads the queue: " << ec.message();
  LockOptions waiting = ttl(4s);
  waiting.wait = 2s;
  mallory.acquire("vault", waiting, ec);
  EXPECT_EQ(ec, errc::auth_failed) << ec.message();
  {
    std::lock_guard lk(mu);
    const bool named = std::any_of(messages.begin(), messages.end(), [](const std::string& m) {
      return m.find("wrong user or password") != std::string::npos && m.find("vault") != std::string::npos;
    });
    EXPECT_TRUE(named) << "the log must name the lock and the credential problem";
  }
  // Reading is allowed to everybody: status works.
  EXPECT_TRUE(mallory.status("vault").held);
  // An unauthenticated raw client cannot delete alice's node either.
  RawZk raw(hp);
  const auto nodes = raw.children(queue_dir("vault"));
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(raw.remove(queue_dir("vault") + "/" + nodes[0]), ZNOAUTH);
  EXPECT_TRUE(lease.owns());
  lease.release();
  // The same credentials from another client work.
  Client alice2 = connect("zk://alice:right@" + hp + "?session_timeout=4s", quiet());
  EXPECT_TRUE(alice2.try_acquire("vault", ttl(4s)).has_value());
}

TEST(ZkBackend, TtlFarAboveTheSessionTimeoutIsRejected) {
  Client client = connect_zk("?session_timeout=2s");
  std::error_code ec;
  client.acquire("long-ttl", ttl(60s), ec);
  EXPECT_EQ(ec, errc::invalid_argument);
}

}  // namespace
}  // namespace distlock::testing
