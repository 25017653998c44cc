// Client::watch's token-order exception after a replaced source
// (LockEventSink::on_source_replaced, src/api/watch.cpp; redis+sentinel:// reports one per
// failover): the new server's state is reported even with an older token than the last
// one delivered — and only the new server's. A listing that was read from the old server
// (it started before the replacement and ended after it) is not the new server's state:
// it must neither be reported after the gap nor use up the exception, or the new server's
// older state is dropped as stale for good.
//
// The backend is a memory:// one whose prefix watch and listing the test drives: the
// test calls the sink itself (as a notification thread would) and scripts what each
// listing returns, holding one back until the source was replaced. Deterministic; about
// 0.1 s when the stream is right, 5 s (its bound) when the new state never comes.
//
// The same scripted backend checks the wording of an end inferred after a plain gap
// (WatchAfterAGap): a lease reported held before the gap whose end was among the missed
// events is not reported as an expiry.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "support/client_options.hpp"
#include "support/forwarding_backend.hpp"
#include "support/watch_recorder.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// What the test and the backend share: the sink of the live watch, the listing the next
// list_held returns (copied when the call starts: the server's snapshot), and whether
// that call waits for the test before it returns.
struct Script {
  std::mutex mu;
  std::condition_variable cv;
  distlock::detail::LockEventSink* sink = nullptr;
  std::vector<distlock::detail::ListedLock> listing;
  bool hold_next = false;  // the next listing waits until `hold_next` is false again
  bool holding = false;    // a listing is waiting
  int listings = 0;
  // What status() returns (none: it fails); the next status read may be held back as the
  // listing is, returning what `status` said when it started.
  std::optional<distlock::LockInfo> status;
  bool hold_next_status = false;
  bool status_holding = false;

  // Called by a backend call holding `lk` on `mu`: while `hold` is set, sets `holding` and
  // waits (at most 10 s) for the test to clear `hold`.
  void hold_back(std::unique_lock<std::mutex>& lk, const bool& hold, bool& holding) {
    if (!hold) return;
    holding = true;
    cv.notify_all();
    cv.wait_for(lk, 10s, [&] { return !hold; });
    holding = false;
  }
};

class ScriptedWatch final : public distlock::detail::PrefixWatch {
 public:
  explicit ScriptedWatch(Script& s) : s_(s) {}
  ~ScriptedWatch() override {
    std::lock_guard lk(s_.mu);
    s_.sink = nullptr;
  }
  bool sync(distlock::detail::Error&) override { return true; }  // the test delivers synchronously

 private:
  Script& s_;
};

class ScriptedWatchBackend final : public distlock::testing::ForwardingBackend {
 public:
  ScriptedWatchBackend(std::unique_ptr<distlock::detail::Backend> inner, Script& s)
      : ForwardingBackend(std::move(inner)), s_(s) {}

  std::unique_ptr<distlock::detail::PrefixWatch> watch_prefix(std::string_view,
                                                              distlock::detail::LockEventSink& sink,
                                                              distlock::detail::Error&) override {
    std::lock_guard lk(s_.mu);
    s_.sink = &sink;
    return std::make_unique<ScriptedWatch>(s_);
  }

  std::vector<distlock::detail::ListedLock> list_held(std::string_view, std::size_t, bool& truncated,
                                                      distlock::detail::Error&) override {
    truncated = false;
    std::unique_lock lk(s_.mu);
    ++s_.listings;
    auto snapshot = s_.listing;
    s_.hold_back(lk, s_.hold_next, s_.holding);
    s_.cv.notify_all();
    return snapshot;
  }

  // Without a scripted status every read fails (the watch then looks again later and
  // reports nothing).
  distlock::LockInfo status(std::string_view, distlock::detail::Error& ec) override {
    std::unique_lock lk(s_.mu);
    auto snapshot = s_.status;
    s_.hold_back(lk, s_.hold_next_status, s_.status_holding);
    if (!snapshot) {
      ec = make_error_code(distlock::errc::backend_unavailable);
      return {};
    }
    return *snapshot;
  }

 private:
  Script& s_;
};

distlock::detail::ListedLock held(const std::string& name, std::uint64_t token) {
  distlock::detail::ListedLock l;
  l.name = name;
  l.info.held = true;
  l.info.token = token;
  l.info.holder = "holder-" + std::to_string(token);
  return l;
}

// Reads `w` until the new master's state of p/x (held with `token`) shows, 5 s at most on this
// steady clock: it must come after the replacement's gap (a gap `is_replacement` accepts), and
// nothing of p/x may come between that gap and it (the old master's `what`: listing or read).
void expect_only_the_new_state(Watch& w, std::uint64_t token,
                               const std::function<bool(const WatchEvent&)>& is_replacement,
                               const char* what) {
  std::vector<std::string> seen;
  bool replaced = false, state_seen = false;
  std::vector<std::string> wrong;
  const auto end = Clock::now() + 5s;
  while (!state_seen && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    if (!e) break;
    seen.push_back(describe(*e));
    if (e->kind == WatchEventKind::gap && is_replacement(*e)) {
      replaced = true;
      continue;
    }
    if (!replaced || e->name != "p/x") continue;
    if (e->kind == WatchEventKind::state && e->held && e->token == token) {
      state_seen = true;
    } else {
      wrong.push_back(describe(*e));
    }
  }
  const std::string all = joined(seen);
  ASSERT_TRUE(replaced) << "no gap for the replacement; events:" << all;
  EXPECT_TRUE(state_seen) << "the new master's state (p/x held with token " << token
                          << ") never came; events:" << all;
  EXPECT_TRUE(wrong.empty()) << "after the replacement's gap, p/x was reported from the old master's " << what
                             << "; events:" << all;
}

// The old master listed "p/x" with token 5 in a listing that was still being read when
// the failover replaced the source; the new master has "p/x" with token 3 (it lacks the
// release of 3 and the lease of 5). After the failover's gap the stream must show the
// new master's state (token 3), and nothing read from the old master.
TEST(WatchSourceReplaced, AListingReadBeforeTheReplacementDoesNotHideTheNewServersState) {
  Script script;
  const auto opts = distlock::testing::quiet();
  distlock::Client client =
      distlock::testing::client_through<ScriptedWatchBackend>("watch-source-replaced", opts, nullptr, script);
  distlock::Watch w = client.watch("p/");  // its first listing is empty

  auto deliver = [&](auto&& call) {
    std::lock_guard lk(script.mu);
    ASSERT_NE(script.sink, nullptr);
    call(*script.sink);
  };
  distlock::detail::LockEvent acquired;
  acquired.kind = distlock::detail::LockEvent::Kind::acquired;
  acquired.name = "p/x";
  acquired.token = 5;
  acquired.owner = "holder-5";
  deliver([&](distlock::detail::LockEventSink& s) { s.on_event(std::move(acquired)); });
  auto first = w.next(5000ms);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->kind, WatchEventKind::acquired) << describe(*first);
  ASSERT_EQ(first->token, 5u);

  // The old master's channel breaks; the re-list it causes reads the old master (token 5)
  // and is still under way when the failover replaces the source.
  {
    std::unique_lock lk(script.mu);
    script.listing = {held("p/x", 5)};
    script.hold_next = true;
  }
  deliver([](distlock::detail::LockEventSink& s) { s.on_gap("the old master's channel broke"); });
  {
    std::unique_lock lk(script.mu);
    ASSERT_TRUE(script.cv.wait_for(lk, 5s, [&] { return script.holding; })) << "the re-list never started";
    script.listing = {held("p/x", 3)};  // what the new master has
  }
  deliver(
      [](distlock::detail::LockEventSink& s) { s.on_source_replaced("the master moved to the new one"); });
  {
    std::lock_guard lk(script.mu);
    script.hold_next = false;
  }
  script.cv.notify_all();

  ASSERT_NO_FATAL_FAILURE(expect_only_the_new_state(
      w, 3, [](const WatchEvent& e) { return e.detail.find("moved") != std::string::npos; }, "listing"));
  {
    std::lock_guard lk(script.mu);
    EXPECT_GE(script.listings, 3) << "initial listing, the break's and the replacement's";
  }
}

// The expiry re-read of a held name reads the old master (it shows "p/x" free: its
// release there never reached the watcher) and is judged after the failover replaced the
// source; the new master has "p/x" held with token 5. After the failover's gap the stream
// must not report token 5 lost on the old master's word: the new master's state (held, 5)
// is what it shows.
TEST(WatchSourceReplaced, AnExpiryReadFromTheOldServerIsNotReportedAfterTheReplacement) {
  Script script;
  const auto opts = distlock::testing::quiet();
  distlock::Client client = distlock::testing::client_through<ScriptedWatchBackend>(
      "watch-source-replaced-expiry", opts, nullptr, script);
  distlock::Watch w = client.watch("p/");

  {
    std::lock_guard lk(script.mu);
    script.status = distlock::LockInfo{};  // the old master: p/x free
    script.hold_next_status = true;
    script.listing = {held("p/x", 5)};  // the new master: p/x held with token 5
  }
  distlock::detail::LockEvent acquired;
  acquired.kind = distlock::detail::LockEvent::Kind::acquired;
  acquired.name = "p/x";
  acquired.token = 5;
  acquired.owner = "holder-5";
  {
    std::lock_guard lk(script.mu);
    ASSERT_NE(script.sink, nullptr);
    script.sink->on_event(std::move(acquired));
  }
  auto first = w.next(5000ms);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->kind, WatchEventKind::acquired) << describe(*first);

  // The first expiry check comes about 1 s after the acquire (kFirstCheck); wait up to 5 s.
  {
    std::unique_lock lk(script.mu);
    ASSERT_TRUE(script.cv.wait_for(lk, 5s, [&] { return script.status_holding; }))
        << "the expiry re-read never started";
    ASSERT_NE(script.sink, nullptr);
    script.sink->on_source_replaced("the master moved to the new one");
    script.status = held("p/x", 5).info;  // from now on reads see the new master
    script.hold_next_status = false;
  }
  script.cv.notify_all();

  ASSERT_NO_FATAL_FAILURE(expect_only_the_new_state(
      w, 5, [](const WatchEvent&) { return true; }, "read"));
}

// A plain gap (the channel broke) while "p/x" was reported held with token 5: its release
// was among the missed events. The gap's re-list is still being read when the next lease's
// `acquired` (token 7) arrives, so the watcher infers the end of token 5 — and must say it
// ended while events were missed, not that it expired with no end published (the landing
// run of 699f183 saw "no end of this lease published: it expired" for a released lease).
TEST(WatchAfterAGap, AnEndInferredBeforeTheReListSaysEventsWereMissedNotThatItExpired) {
  Script script;
  const auto opts = distlock::testing::quiet();
  distlock::Client client =
      distlock::testing::client_through<ScriptedWatchBackend>("watch-after-a-gap", opts, nullptr, script);
  WatchOptions wo;
  wo.expiry_checks = false;  // no status read races the scripted events
  distlock::Watch w = client.watch("p/", wo);
  auto deliver = [&](distlock::detail::LockEvent::Kind kind, std::uint64_t token) {
    distlock::detail::LockEvent ev;
    ev.kind = kind;
    ev.name = "p/x";
    ev.token = token;
    ev.owner = "holder-" + std::to_string(token);
    std::lock_guard lk(script.mu);
    ASSERT_NE(script.sink, nullptr);
    script.sink->on_event(std::move(ev));
  };
  deliver(distlock::detail::LockEvent::Kind::acquired, 5);
  auto first = w.next(5000ms);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->kind, WatchEventKind::acquired) << describe(*first);

  {
    std::lock_guard lk(script.mu);
    script.listing = {held("p/x", 7)};
    script.hold_next = true;
    script.sink->on_gap("the channel broke");
  }
  {
    std::unique_lock lk(script.mu);
    ASSERT_TRUE(script.cv.wait_for(lk, 5s, [&] { return script.holding; })) << "the re-list never started";
  }
  deliver(distlock::detail::LockEvent::Kind::acquired, 7);  // arrives while the re-list is read
  {
    std::lock_guard lk(script.mu);
    script.hold_next = false;
  }
  script.cv.notify_all();

  std::vector<std::string> seen;
  std::optional<WatchEvent> inferred_end, next_acquired;
  const auto end = Clock::now() + 5s;
  while (!next_acquired && Clock::now() < end) {
    auto e = w.next(std::chrono::ceil<Millis>(end - Clock::now()));
    if (!e) break;
    seen.push_back(describe(*e));
    if (e->kind == WatchEventKind::lost) inferred_end = e;
    if (e->kind == WatchEventKind::acquired && e->token == 7) next_acquired = e;
  }
  ASSERT_TRUE(next_acquired) << "token 7 was never reported" << joined(seen);
  ASSERT_TRUE(inferred_end) << "the end of token 5 was not reported before token 7" << joined(seen);
  EXPECT_TRUE(inferred_end->inferred) << describe(*inferred_end);
  EXPECT_EQ(inferred_end->token, 5u) << describe(*inferred_end);
  EXPECT_NE(inferred_end->detail.find("events were missed"), std::string::npos) << describe(*inferred_end);
  EXPECT_EQ(inferred_end->detail.find("it expired"), std::string::npos) << describe(*inferred_end);
}

}  // namespace
}  // namespace distlock::testing
