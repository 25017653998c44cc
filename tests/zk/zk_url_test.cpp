// zk:// without a server: path encoding, URL validation, unreachable servers.
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <set>

#include "distlock/distlock.hpp"
#include "support/process.hpp"
#include "zk/zk_names.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
namespace zk = distlock::detail::zk;

TEST(ZkNames, EncodingIsInjectiveAndSafe) {
  const std::vector<std::string> raw = {"a/b", "a%2Fb",   ".", "..", "x\r\ny", std::string("\0\xff", 2),
                                        "",    "plain-_9"};
  std::set<std::string> seen;
  for (const auto& r : raw) {
    const std::string enc = zk::encode_component(r);
    EXPECT_EQ(enc.find('/'), std::string::npos) << enc;
    EXPECT_NE(enc, ".");
    EXPECT_NE(enc, "..");
    for (char c : enc)
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '%' || c == '_' || c == '-');
    EXPECT_EQ(zk::decode_component(enc), r);
    EXPECT_TRUE(seen.insert(enc).second) << "collision for " << enc;
  }
  EXPECT_EQ(zk::encode_component("orders/42"), "orders%2F42");
  EXPECT_FALSE(zk::decode_component("%4").has_value());
  EXPECT_FALSE(zk::decode_component("%zz").has_value());
  EXPECT_FALSE(zk::decode_component("a.b").has_value());
}

TEST(ZkNames, QueueOrderFollowsSequenceNotGuid) {
  const std::string g1 = zk::make_guid("ffff:1", 7);
  const std::string g2 = zk::make_guid("0000:2", 1);
  const auto q = zk::queue_order(
      {g1 + "-lock-0000000010", "stranger", g2 + "-lock-0000000002", g1 + "-lock-0000000003"});
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0].seq, 2u);
  EXPECT_EQ(q[0].guid, g2);
  EXPECT_EQ(q[1].seq, 3u);
  EXPECT_EQ(q[2].seq, 10u);
  EXPECT_EQ(zk::owner_of_guid(g1), "ffff:1");
  EXPECT_EQ(zk::name_of_node_path("/distlock/orders%2F42/x-lock-0000000001"), "orders/42");
  EXPECT_FALSE(zk::name_of_node_path("/elsewhere/a/b").has_value());
}

TEST(ZkNames, ChrootValidation) {
  EXPECT_EQ(zk::chroot_problem(""), "");
  EXPECT_EQ(zk::chroot_problem("/"), "");
  EXPECT_EQ(zk::chroot_problem("/apps/locks"), "");
  EXPECT_NE(zk::chroot_problem("/a//b"), "");
  EXPECT_NE(zk::chroot_problem("/a/"), "");
  EXPECT_NE(zk::chroot_problem("/a/../b"), "");
}

void expect_url_error(const std::string& url, errc code, const std::string& needle) {
  try {
    connect(url);
    ADD_FAILURE() << url << " was accepted";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), code) << url << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << url << ": " << e.what();
  }
}

TEST(ZkUrl, MalformedUrlsNameTheirProblem) {
  expect_url_error("zk://", errc::invalid_url, "names no ZooKeeper server");
  expect_url_error("zk://alice@127.0.0.1:2181", errc::invalid_url, "user and a password");
  expect_url_error("zk://127.0.0.1:2181?sessiontimeout=2s", errc::invalid_url,
                   "unknown query parameter \"sessiontimeout\"");
  expect_url_error("zk://127.0.0.1:2181?session_timeout=soon", errc::invalid_url, "session_timeout \"soon\"");
  expect_url_error("zk://127.0.0.1:2181/a//b", errc::invalid_url, "chroot \"/a//b\"");
  expect_url_error("zk://127.0.0.1:2181/a/", errc::invalid_url, "must not end with '/'");
  expect_url_error("zk://127.0.0.1:99999", errc::invalid_url, "out of range");
}

TEST(ZkUrl, PasswordIsMaskedInErrors) {
  try {
    connect("zk://alice:s3cret@127.0.0.1:" + std::to_string(free_port()) + "?timeout=300ms");
    ADD_FAILURE() << "connect to a closed port succeeded";
  } catch (const std::system_error& e) {
    EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
  }
}

TEST(ZkUrl, UnreachableServersFailWithinTheConnectTimeout) {
  const std::string url = "zk://127.0.0.1:" + std::to_string(free_port()) +
                          ",127.0.0.1:" + std::to_string(free_port()) + "?timeout=500ms";
  const auto start = std::chrono::steady_clock::now();
  try {
    connect(url);
    ADD_FAILURE() << "connect to closed ports succeeded";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::backend_unavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find("answered within 500ms"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "must give up near the connect timeout";
}

TEST(ZkUrl, UnresolvableHostIsBackendUnavailable) {
  const auto start = std::chrono::steady_clock::now();
  try {
    connect("zk://no-such-host.invalid:2181?timeout=500ms");
    ADD_FAILURE() << "connect to an unresolvable host succeeded";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::backend_unavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

}  // namespace
}  // namespace distlock::testing
