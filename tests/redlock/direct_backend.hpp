// Test support for the tests that drive the redlock:// backend directly (below the engine): the
// backend made from a URL, the name of a case parameterised by its lock-delay, and three masters
// behind fault proxies set up for an attempt whose request waits on master 0.
//
//   auto backend = make_backend(m.url());                  // nullptr (and a test failure) on error
//   INSTANTIATE_TEST_SUITE_P(Delay, Suite, ::testing::Values(0ms, 1000ms), lock_delay_name);
//   HeldMaster0 s;
//   ASSERT_NO_FATAL_FAILURE(s.set_up(kOwner, key, lock_delay));
//   ASSERT_FALSE(s.client->try_acquire(req, ec).acquired);    // busy on 1 and 2, no answer from 0
//
// Thread-safety: each call uses only its arguments; a HeldMaster0 belongs to one test thread.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/backend_error.hpp"
#include "engine/url.hpp"
#include "masters.hpp"
#include "redlock/redlock_backend.hpp"
#include "support/client_options.hpp"
#include "support/fault_proxy.hpp"

namespace distlock::testing {

/// The redlock:// backend of `url_text`, with a logger that drops its lines (quiet()); nullptr, after
/// ADD_FAILURE with the error, when the URL does not parse or the backend cannot be made.
inline std::unique_ptr<detail::Backend> make_backend(const std::string& url_text) {
  const ClientOptions opts = quiet();
  detail::Url url;
  detail::Error ec;
  if ((ec = detail::parse_url(url_text, url))) {
    ADD_FAILURE() << ec.detail();
    return nullptr;
  }
  auto b = detail::make_redlock_backend(url, opts, ec);
  if (!b) ADD_FAILURE() << ec.message() << " " << ec.detail();
  return b;
}

/// "WithLockDelay" or "NoLockDelay": the name of a case whose parameter is its lock-delay.
inline std::string lock_delay_name(const ::testing::TestParamInfo<std::chrono::milliseconds>& param) {
  return param.param.count() ? "WithLockDelay" : "NoLockDelay";
}

/// Three masters, master i behind proxy p<i>: `client` reaches them through the proxies and
/// `third` directly, each with a per-master timeout of 500 ms (far above a loaded host's round
/// trip: only master 0, held back, stays silent).
struct HeldMaster0 {
  Masters m{3};
  FaultProxy p0{m[0].port()}, p1{m[1].port()}, p2{m[2].port()};
  std::unique_ptr<detail::Backend> client, third;

  /// Makes both backends; opens the client's connection to every master (a lease "warm-up" of
  /// `owner` with `lock_delay`, released); has others hold `key` on masters 1 and 2 (values
  /// "other-holder-x" and "other-holder-y", 60 s); holds master 0's open connection back.
  /// Each step is asserted (call it in ASSERT_NO_FATAL_FAILURE).
  void set_up(std::string_view owner, const std::string& key, std::chrono::milliseconds lock_delay) {
    const std::string url = "redlock://127.0.0.1:" + std::to_string(p0.port()) +
                            ",127.0.0.1:" + std::to_string(p1.port()) +
                            ",127.0.0.1:" + std::to_string(p2.port()) + "?timeout=500ms";
    client = make_backend(url);
    third = make_backend(m.url("timeout=500ms"));
    ASSERT_TRUE(client && third);
    detail::Error ec;
    const detail::AcquireRequest warm{"warm-up", owner, std::chrono::seconds(10), false, lock_delay};
    ASSERT_TRUE(client->try_acquire(warm, ec).acquired) << ec.message() << " " << ec.detail();
    ASSERT_EQ(client->release("warm-up", owner, 0, ec), detail::ReleaseStatus::released);
    ASSERT_EQ(m[1].command({"SET", key, "other-holder-x", "PX", "60000"})->type, REDIS_REPLY_STATUS);
    ASSERT_EQ(m[2].command({"SET", key, "other-holder-y", "PX", "60000"})->type, REDIS_REPLY_STATUS);
    ASSERT_TRUE(p0.hold_open());
  }
};

}  // namespace distlock::testing
