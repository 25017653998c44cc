// rediss:// against a redis-server listening with TLS (certificates made here by the
// openssl command in a temp dir: a CA, a server certificate for 127.0.0.1, a client
// certificate, and a second CA that signed nothing the server uses). Locks, waits
// (pub/sub and the hand-off), the shared connection under 16 threads, mutual TLS,
// and every way it can be misconfigured, each with its own error.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "support/client_options.hpp"
#include "support/process.hpp"
#include "support/redis_probes.hpp"
#include "support/redis_server.hpp"
#include "support/tls_certs.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;

std::string tls_url(const RedisServer& s, const Certs& c, const std::string& extra = {}) {
  return "rediss://127.0.0.1:" + std::to_string(s.tls_port()) + "/?cacert=" + c.path("ca.pem") + extra;
}

TEST(RedisTls, LocksWaitsAndHandOffsOverTls) {
  Certs certs;
  RedisServer server(tls_options(certs));
  auto a = distlock::connect(tls_url(server, certs));
  auto b = distlock::connect(tls_url(server, certs));
  std::uint64_t first = 0;
  {
    auto lease = a.acquire("tls/job", ttl_of(10s));
    first = lease.token();
    EXPECT_GT(first, 0u);
    EXPECT_EQ(server.command({"HGET", "distlock:{tls/job}", "@token"})->str, std::to_string(first));
    // b waits (queued; woken by its grant message, over TLS) until a releases.
    std::atomic<bool> got{false};
    std::uint64_t second = 0;
    std::thread waiter([&] {
      auto l = b.acquire("tls/job", ttl_of(10s));
      second = l.token();
      got = true;
    });
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (b.status("tls/job").waiters == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_EQ(b.status("tls/job").waiters, 1u);
    EXPECT_FALSE(got.load());
    lease.release();
    waiter.join();
    EXPECT_TRUE(got.load());
    EXPECT_GT(second, first);
  }
}

// The reader and writer roles of the shared connection run TLS reads and writes on
// one SSL object from different threads.
TEST(RedisTls, SixteenThreadsShareOneTlsConnection) {
  Certs certs;
  RedisServer server(tls_options(certs));
  auto client = distlock::connect(tls_url(server, certs));
  constexpr int kThreads = 16, kRounds = 100;
  std::atomic<int> held{0};
  std::mutex err_mu;
  std::string error;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < kRounds; ++i) {
          auto lease = client.acquire("tls/" + std::to_string(t) + "/" + std::to_string(i), ttl_of(10s));
          if (lease.owns()) held.fetch_add(1);
        }
      } catch (const std::exception& e) {
        std::lock_guard lk(err_mu);
        error = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(held.load(), kThreads * kRounds);
}

#if DISTLOCK_HAS_FENCING
// Fenced writes share the transport: a stale token is refused over TLS too.
TEST(RedisTls, FencedWritesOverTls) {
  Certs certs;
  RedisServer server(tls_options(certs));
  distlock::RedisFence fence(tls_url(server, certs));
  EXPECT_TRUE(fence.set("stock", "10", 7).applied());
  const auto stale = fence.set("stock", "9", 6);
  EXPECT_FALSE(stale.applied());
  EXPECT_EQ(stale.highest_token, 7u);
  EXPECT_EQ(std::string(server.command({"GET", "stock"})->str), "10");
}
#endif

// Connecting to `server`'s TLS port as `host`, trusting the CA of `certs`' file `ca_file`, fails
// verifying the server's certificate; returns the error's message.
std::string certificate_refused(const RedisServer& server, const Certs& certs, const std::string& host,
                                const char* ca_file) {
  const auto [ec, what] = connect_outcome("rediss://" + host + ":" + std::to_string(server.tls_port()) +
                                          "/?cacert=" + certs.path(ca_file));
  EXPECT_EQ(ec, errc::backend_unavailable) << what;
  EXPECT_NE(what.find("certificate verif"), std::string::npos) << what;
  return what;
}

TEST(RedisTls, AnUntrustedServerCertificateIsRefusedNamingTheCause) {
  Certs certs;
  RedisServer server(tls_options(certs));
  const std::string what = certificate_refused(server, certs, "127.0.0.1", "other-ca.pem");
  EXPECT_NE(what.find("127.0.0.1:" + std::to_string(server.tls_port())), std::string::npos) << what;
}

// The server certificate names 127.0.0.1 only: reaching it as "localhost" fails the
// name check although the CA is right.
TEST(RedisTls, TheServerNameIsChecked) {
  Certs certs;
  RedisServer server(tls_options(certs));
  certificate_refused(server, certs, "localhost", "ca.pem");
}

TEST(RedisTls, TlsAgainstAPlainPortAndPlainAgainstATlsPortFailClearly) {
  Certs certs;
  RedisServer server(tls_options(certs));
  auto [ec, what] = connect_outcome("rediss://127.0.0.1:" + std::to_string(server.port()) +
                                    "/?cacert=" + certs.path("ca.pem") + "&timeout=1s");
  EXPECT_EQ(ec, errc::backend_unavailable) << what;
  EXPECT_NE(what.find("TLS handshake"), std::string::npos) << what;
  std::tie(ec, what) =
      connect_outcome("redis://127.0.0.1:" + std::to_string(server.tls_port()) + "/?timeout=1s");
  EXPECT_EQ(ec, errc::backend_unavailable) << what;
  EXPECT_NE(what.find("127.0.0.1:" + std::to_string(server.tls_port())), std::string::npos) << what;
}

TEST(RedisTls, MutualTlsNeedsTheClientCertificate) {
  Certs certs;
  RedisServer server(tls_options(certs, /*auth_clients=*/true));
  const auto [ec, what] = connect_outcome(tls_url(server, certs));
  EXPECT_EQ(ec, errc::backend_unavailable) << what;
  auto client = distlock::connect(
      tls_url(server, certs, "&cert=" + certs.path("client.pem") + "&key=" + certs.path("client.key")));
  auto lease = client.acquire("mtls", ttl_of(5s));
  EXPECT_TRUE(lease.owns());
}

TEST(RedisTls, BadTlsParametersAreInvalidUrlNamingThem) {
  auto [ec, what] = connect_outcome("rediss://127.0.0.1:1/?cacert=/nonexistent/ca.pem");
  EXPECT_EQ(ec, errc::invalid_url) << what;
  EXPECT_NE(what.find("/nonexistent/ca.pem"), std::string::npos) << what;
  std::tie(ec, what) = connect_outcome("redis://127.0.0.1:1/?cacert=/etc/hostname");
  EXPECT_EQ(ec, errc::invalid_url) << what;
  EXPECT_NE(what.find("rediss://"), std::string::npos) << what;
  std::tie(ec, what) = connect_outcome("rediss://127.0.0.1:1/?key=/etc/hostname");
  EXPECT_EQ(ec, errc::invalid_url) << what;
  EXPECT_NE(what.find("cert="), std::string::npos) << what;
  Certs certs;
  std::tie(ec, what) = connect_outcome("rediss://127.0.0.1:1/?cacert=" + certs.path("ca.pem") + "&cert=" +
                                       certs.path("client.pem") + "&key=" + certs.path("server.key"));
  EXPECT_EQ(ec, errc::invalid_url) << what;  // the key does not belong to the certificate
  EXPECT_NE(what.find("client.pem"), std::string::npos) << what;
}

}  // namespace

}  // namespace distlock::testing
