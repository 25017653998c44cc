// Closing a ZooKeeper session with requests still in flight (src/zk/zk_call.*): the C client
// drops a request that is in flight when its handle closes without running its completion,
// and so leaks the request and the Reply it carries. zk::close_session (every handle's
// closer) first waits, at most zk::kCloseDrain, until the completions of its session's
// requests have run. Found by the ASan build: a client closed right after it connected leaked
// the fire-and-forget creates of its session's presence node (4 runs of 20).
#include "zk/zk_call.hpp"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "zk/zk_test_util.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
namespace zk = distlock::detail::zk;

// A session context that also hears when the session connects.
struct ConnectedContext : zk::SessionContext {
  std::mutex mu;
  std::condition_variable cv;
  bool connected = false;
};

void on_session_event(zhandle_t*, int type, int state, const char*, void* ctx) {
  if (type != ZOO_SESSION_EVENT || state != ZOO_CONNECTED_STATE) return;
  auto* c = static_cast<ConnectedContext*>(static_cast<zk::SessionContext*>(ctx));
  std::lock_guard lk(c->mu);
  c->connected = true;
  c->cv.notify_all();
}

bool answered(const zk::ReplyPtr& r) {
  distlock::detail::LockGuard lk(r->mu);
  return r->done;
}

TEST(ZkCall, ClosingASessionRunsTheCompletionsOfItsRequestsInFlightFirst) {
  constexpr int kSessions = 20;
  constexpr int kRequests = 20;
  RawZk setup(shared_server().hostport());
  ASSERT_TRUE(setup.create("/close-drain") == ZOK || setup.exists("/close-drain") == ZOK);
  int unanswered = 0;
  for (int s = 0; s < kSessions; ++s) {
    ConnectedContext ctx;
    zk::Handle zh(zookeeper_init2(shared_server().hostport().c_str(), &on_session_event, 10000, nullptr,
                                  static_cast<zk::SessionContext*>(&ctx), 0, nullptr));
    ASSERT_NE(zh, nullptr);
    {
      std::unique_lock lk(ctx.mu);
      ASSERT_TRUE(ctx.cv.wait_for(lk, 10s, [&] { return ctx.connected; }))
          << "session " << s << " never connected";
    }
    // Fire and forget, as a session's presence node is created: nobody awaits these.
    std::vector<zk::ReplyPtr> replies;
    for (int i = 0; i < kRequests; ++i) {
      replies.push_back(zk::submit_create(zh.get(), "/close-drain/n-", "x", &ZOO_OPEN_ACL_UNSAFE,
                                          ZOO_EPHEMERAL_SEQUENTIAL));
      replies.back()->undo_if_abandoned = false;
    }
    zh.reset();  // close at once, requests still in flight
    for (const auto& r : replies) unanswered += answered(r) ? 0 : 1;
  }
  EXPECT_EQ(unanswered, 0) << unanswered << " of " << kSessions * kRequests
                           << " requests in flight at the close never ran their completion (leaked)";
}

}  // namespace
}  // namespace distlock::testing
