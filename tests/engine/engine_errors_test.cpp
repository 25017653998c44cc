// The error channel (src/engine/backend_error.hpp): the sentence a backend call fails
// with reaches the exception of the public call that made it, and only that one. A
// wrapper backend fails chosen calls with a chosen code and sentence; everything else
// goes to a memory:// store.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend_error.hpp"
#include "engine/engine.hpp"
#include "support/forwarding_backend.hpp"
#include "support/manual_clock.hpp"
#include "support/memory_fixture.hpp"
#include "support/thrown.hpp"

using distlock::errc;
using distlock::detail::Error;

namespace {

struct EngineErrors : distlock::testing::ManualMemoryTest {};

// Each armed call fails once with its code and sentence (none: only the code).
class FailsOnce final : public distlock::testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  struct Failure {
    errc code;
    std::string detail;
  };
  std::optional<Failure> on_acquire, on_status, on_release, on_list, on_put;

  distlock::detail::AcquireResult try_acquire(const distlock::detail::AcquireRequest& req,
                                              Error& ec) override {
    if (fire(on_acquire, ec)) return {};
    return ForwardingBackend::try_acquire(req, ec);
  }
  distlock::LockInfo status(std::string_view name, Error& ec) override {
    if (fire(on_status, ec)) return {};
    return ForwardingBackend::status(name, ec);
  }
  distlock::detail::ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                                          Error& ec) override {
    if (fire(on_release, ec)) return distlock::detail::ReleaseStatus::released;
    return ForwardingBackend::release(name, owner, token, ec);
  }
  std::vector<distlock::detail::ListedLock> list_held(std::string_view prefix, std::size_t limit,
                                                      bool& truncated, Error& ec) override {
    if (fire(on_list, ec)) return {};
    return ForwardingBackend::list_held(prefix, limit, truncated, ec);
  }
  std::string put_record(std::string_view key, std::string_view value, distlock::detail::PutMode mode,
                         Error& ec) override {
    if (fire(on_put, ec)) return {};
    return ForwardingBackend::put_record(key, value, mode, ec);
  }

 private:
  static bool fire(std::optional<Failure>& f, Error& ec) {
    if (!f) return false;
    ec.clear();
    ec = make_error_code(f->code);
    if (!f->detail.empty()) ec.set_detail(f->detail);
    f.reset();
    return true;
  }
};

// Arms `slot` to fail once with `code` and `detail`, then runs `call`: the code it threw, with its
// message in `msg`.
std::error_code fail_once(std::optional<FailsOnce::Failure>& slot, errc code, std::string detail,
                          const std::function<void()>& call, std::string& msg) {
  slot = FailsOnce::Failure{code, std::move(detail)};
  msg.clear();
  return distlock::testing::code_of(call, &msg);
}

TEST_F(EngineErrors, EachPublicCallNamesTheCauseItsBackendCallFailedWith) {
  auto opts = options();
  FailsOnce* raw = nullptr;
  auto c = distlock::testing::client_through<FailsOnce>(store_name, opts, &raw);
  std::string msg;
  // The call fails with the code its backend call failed with, its message naming the cause.
  const auto expect_named = [&](std::optional<FailsOnce::Failure>& slot, errc code, const std::string& cause,
                                const std::function<void()>& call) {
    EXPECT_EQ(fail_once(slot, code, cause, call, msg), code) << cause;
    EXPECT_NE(msg.find(cause), std::string::npos) << msg;
  };
  expect_named(raw->on_acquire, errc::backend_unavailable,
               "acquire Txn failed at etcd://a:1: deadline exceeded", [&] { (void)c.try_acquire("job"); });
  expect_named(raw->on_status, errc::backend_unavailable, "status Range at etcd://a:1: unreachable",
               [&] { (void)c.status("job"); });
  expect_named(raw->on_list, errc::protocol_error, "SCAN at redis://b:2: ERR unknown command",
               [&] { (void)c.list(""); });
  expect_named(raw->on_put, errc::backend_unavailable, "record write at zk://c:3: connection loss",
               [&] { (void)c.semaphore("pool", 2); });
  auto lease = c.acquire("job");
  expect_named(raw->on_release, errc::backend_unavailable, "DEL at redis://b:2: connection reset",
               [&] { lease.release(); });
}

// A sentence belongs to the call that failed: a later call on the same thread that
// fails with a code alone says nothing more, whichever public call it is.
TEST_F(EngineErrors, ASentenceIsNeverShownWithALaterCallsError) {
  auto opts = options();
  FailsOnce* raw = nullptr;
  auto c = distlock::testing::client_through<FailsOnce>(store_name, opts, &raw);
  std::string msg;

  fail_once(
      raw->on_status, errc::backend_unavailable, "first cause", [&] { (void)c.status("job"); }, msg);
  ASSERT_NE(msg.find("first cause"), std::string::npos) << msg;
  EXPECT_EQ(fail_once(
                raw->on_acquire, errc::backend_unavailable, "", [&] { (void)c.try_acquire("job"); }, msg),
            errc::backend_unavailable);
  EXPECT_EQ(msg.find("first cause"), std::string::npos) << msg;

  fail_once(
      raw->on_put, errc::backend_unavailable, "second cause", [&] { (void)c.semaphore("pool", 2); }, msg);
  ASSERT_NE(msg.find("second cause"), std::string::npos) << msg;
  EXPECT_EQ(fail_once(
                raw->on_list, errc::protocol_error, "", [&] { (void)c.list(""); }, msg),
            errc::protocol_error);
  EXPECT_EQ(msg.find("second cause"), std::string::npos) << msg;

  // The error_code overloads give the code; a following throwing call is clean.
  raw->on_status = {{errc::backend_unavailable, "third cause"}};
  std::error_code ec;
  (void)c.status("job", ec);
  EXPECT_EQ(ec, errc::backend_unavailable);
  auto lease = c.acquire("job");
  EXPECT_EQ(fail_once(
                raw->on_release, errc::backend_unavailable, "", [&] { lease.release(); }, msg),
            errc::backend_unavailable);
  EXPECT_EQ(msg.find("third cause"), std::string::npos) << msg;
}

TEST(BackendError, IsAnErrorCodeWhoseDetailOnlyClearOrFailReplaces) {
  Error e;
  EXPECT_FALSE(e);
  EXPECT_EQ(e.suffix(), "");
  e.set_detail("cause known first");
  e = make_error_code(errc::backend_unavailable);  // a code set after the cause keeps it
  EXPECT_EQ(e, errc::backend_unavailable);
  EXPECT_EQ(e.detail(), "cause known first");
  EXPECT_EQ(e.suffix(), ": cause known first");
  std::error_code& as_code = e;  // what a transport helper takes
  as_code = make_error_code(errc::timeout);
  EXPECT_EQ(e, errc::timeout);
  e.fail(errc::protocol_error, "other");
  EXPECT_EQ(e, errc::protocol_error);
  EXPECT_EQ(e.detail(), "other");
  EXPECT_EQ(e.take_detail(), "other");
  EXPECT_EQ(e.detail(), "");
  EXPECT_EQ(e, errc::protocol_error);
  e.fail(errc::busy, "x");
  e.clear();
  EXPECT_FALSE(e);
  EXPECT_EQ(e.detail(), "");
}

}  // namespace
