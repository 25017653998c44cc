// redlocks:// — Redlock over TLS to every master, on the Redis stack's sockets:
// locks, release notifications (one TLS subscriber per master), mutual TLS with a
// password, a master that stalls in the TLS handshake, and each misconfiguration
// with its own error. The masters are redis-servers with a TLS port, certificates
// made by openssl in a temp dir (tests/support/tls_certs.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"
#include "masters.hpp"
#include "support/redis_probes.hpp"
#include "support/tls_certs.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(RedlockTls, LocksAndReleaseNotificationsGoOverTls) {
  Certs certs;
  Masters m(3, tls_options(certs));
  const std::string url = m.tls_url("cacert=" + certs.path("ca.pem"));
  auto holder = connect(url);
  auto waiter = connect(url);
  LockOptions opts;
  opts.ttl = 30s;
  auto lease = holder.acquire("tls/job", opts);
  ASSERT_TRUE(lease.owns());
  for (std::size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m.keys(i, "distlock:redlock:lock:*").size(), 1u) << "master " << i;
  }
  auto got = std::async(std::launch::async, [&] {
    LockOptions w = opts;
    w.wait = 20s;
    return waiter.acquire("tls/job", w).owns();
  });
  // The waiter's subscriptions, made over TLS, are live on every master.
  const std::string channel = "distlock:redlock:released:tls/job";
  const auto until = Clock::now() + 10s;
  auto subscribed = [&] {
    for (std::size_t i = 0; i < m.size(); ++i) {
      if (subscribers(m[i], channel) != 1) return false;
    }
    return true;
  };
  while (!subscribed() && Clock::now() < until) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(subscribed());
  lease.release();
  ASSERT_EQ(got.wait_for(20s), std::future_status::ready);
  EXPECT_TRUE(got.get());
}

TEST(RedlockTls, MutualTlsWithAPasswordNeedsTheClientCertificate) {
  Certs certs;
  RedisServerOptions o = tls_options(certs, /*auth_clients=*/true);
  o.password = "s3cret";
  Masters m(3, o);
  const std::string base = "cacert=" + certs.path("ca.pem");
  // TLS 1.3 finishes the client's side of the handshake first; the server's refusal
  // ("certificate required" alert, or a reset) comes with the first read or write.
  auto [ec, what] = connect_outcome(m.tls_url(base + "&timeout=1s", ":s3cret"));
  EXPECT_EQ(ec, errc::quorum_unavailable) << what;
  EXPECT_NE(what.find("TLS"), std::string::npos) << what;
  EXPECT_NE(what.find("127.0.0.1:" + std::to_string(m[0].tls_port())), std::string::npos) << what;
  const std::string mtls = base + "&cert=" + certs.path("client.pem") + "&key=" + certs.path("client.key");
  std::tie(ec, what) = connect_outcome(m.tls_url(mtls, ":wrong"));
  EXPECT_EQ(ec, errc::auth_failed) << what;
  auto client = connect(m.tls_url(mtls, ":s3cret"));
  auto lease = client.acquire("mtls");
  EXPECT_TRUE(lease.owns());
}

TEST(RedlockTls, AnUntrustedCertificateOrAPlainPortFailsNamingTheCause) {
  Certs certs;
  Masters m(3, tls_options(certs));
  auto [ec, what] = connect_outcome(m.tls_url("cacert=" + certs.path("other-ca.pem")));
  EXPECT_EQ(ec, errc::quorum_unavailable) << what;
  EXPECT_NE(what.find("certificate verif"), std::string::npos) << what;
  EXPECT_NE(what.find("127.0.0.1:" + std::to_string(m[0].tls_port())), std::string::npos) << what;
  // redlocks:// against the plain ports.
  std::string plain = "redlocks://";
  for (std::size_t i = 0; i < m.size(); ++i)
    plain += (i ? "," : "") + ("127.0.0.1:" + std::to_string(m[i].port()));
  std::tie(ec, what) = connect_outcome(plain + "?timeout=1s&cacert=" + certs.path("ca.pem"));
  EXPECT_EQ(ec, errc::quorum_unavailable) << what;
  EXPECT_NE(what.find("TLS handshake"), std::string::npos) << what;
}

TEST(RedlockTls, TlsSettingsAreCheckedBeforeConnecting) {
  Certs certs;
  const std::string hosts = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3";
  auto [ec, what] = connect_outcome("redlock://" + hosts + "?cacert=" + certs.path("ca.pem"));
  EXPECT_EQ(ec, errc::invalid_url) << what;
  EXPECT_NE(what.find("redlocks://"), std::string::npos) << what;
  std::tie(ec, what) = connect_outcome("redlocks://" + hosts + "?cacert=/nonexistent/ca.pem");
  EXPECT_EQ(ec, errc::invalid_url) << what;
  EXPECT_NE(what.find("/nonexistent/ca.pem"), std::string::npos) << what;
  std::tie(ec, what) = connect_outcome("redlocks://" + hosts + "?key=" + certs.path("client.key"));
  EXPECT_EQ(ec, errc::invalid_url) << what;
  EXPECT_NE(what.find("cert="), std::string::npos) << what;
  // A key that does not belong to the certificate: found before any connection.
  std::tie(ec, what) = connect_outcome("redlocks://" + hosts + "?cacert=" + certs.path("ca.pem") + "&cert=" +
                                       certs.path("client.pem") + "&key=" + certs.path("server.key"));
  EXPECT_EQ(ec, errc::invalid_url) << what;
  EXPECT_NE(what.find("client.pem"), std::string::npos) << what;
}

// Two of five masters are paused before the client first connects: their TCP
// connects succeed (the kernel accepts) but their TLS handshakes never finish. The
// handshakes run inside the fan-out's poll loop, so an acquisition costs one per-node
// timeout (400 ms), not one per stalled master as connecting one master after
// another would; bound measured on this process's steady clock.
TEST(RedlockTls, MastersStalledInTheHandshakeCostOneTimeoutNotOneEach) {
  Certs certs;
  Masters m(5, tls_options(certs));
  m[1].pause();
  m[3].pause();
  constexpr auto kTimeout = 400ms;
  auto client = connect(m.tls_url("cacert=" + certs.path("ca.pem") + "&timeout=400ms"));
  const auto t0 = Clock::now();
  auto lease = client.acquire("stalled");
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  EXPECT_TRUE(lease.owns());
  EXPECT_LT(took, 2 * kTimeout - 50ms) << "took " << took.count() << " ms";
  lease.release();
  m[1].resume();
  m[3].resume();
}

}  // namespace
}  // namespace distlock::testing
