// Helpers for tests of `Client::watch` (distlock/watch.hpp), written once for every backend:
//
//   describe(e)                 one line for a message: "acquired ho/x token=7 held=1 <detail>"
//   next_change(w, limit)       the next event that is not a `state` (is_change), or nullopt
//                               at `limit`
//   next_matching(w, limit, match, &seen)
//                               the first event `match` accepts, or nullopt at `limit`; every
//                               event read on the way (that one too) is described into `seen`
//   event_of(kind, name, token) a matcher for next_matching (empty name, token 0: any)
//   joined(seen)                those lines, each on its own indented line, for a message
//   HandOffOrder                the checks of a stream of acquired/released, per name
//                               (check; take_state for a re-list's `state` after a gap)
//   WatchRecorder               a thread that reads a watch into a vector, with receipt times
//
// And the bodies of cases every backend's watch test runs (each call inside
// ASSERT_NO_FATAL_FAILURE; the backend's own checks follow it in the test):
//   expect_hand_offs_in_token_order(w, url, name, n, limit)   two clients, n hand-offs
//   expect_stop_from_another_thread_ends_next(w)
//   expect_killed_holder_lost(w, url, name, ttl_ms, out)  a lock_tool holder's acquired, its
//                                                         SIGKILL, then its `lost`
//   expect_revoke_reported(w, admin, lease, name)         acquired, revoke, `revoked`, holder told
//   expect_live_again(w, holder, name, limit)             after a gap: `name` taken and released,
//                                                         its acquired (gaps skipped), released
//   expect_held_state(w, name, token)                     the next event (10 s) is `name`'s `state`,
//                                                         held with `token`
//
// Every wait is bounded by its `limit`, measured on the steady clock; none sleeps.
//
// Example:
//   Watch w = watcher.watch("ho/");
//   HandOffOrder order;
//   while (auto e = next_change(w, 10s)) ASSERT_NO_FATAL_FAILURE(order.check(*e));
//   EXPECT_EQ(order.of("ho/x").released, n);
//
// Thread-safety: the free functions read only their arguments (a `Watch` must not be read by
// two threads at once). A HandOffOrder is for one thread. A WatchRecorder is the only reader
// of its watch until `finish()` or its destruction; `events()` may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::testing {

/// "kind name token=N held=0|1 detail" (and " inferred" when the event was inferred).
std::string describe(const WatchEvent& e);

/// Whether `e` is a change: any kind but `state` (a listing's entry).
inline bool is_change(const WatchEvent& e) {
  return e.kind != WatchEventKind::state;
}

/// A matcher for `next_matching`: an event of `kind`, of `name` (empty: any name), with
/// `token` (0: any token).
std::function<bool(const WatchEvent&)> event_of(WatchEventKind kind, std::string name = {},
                                                std::uint64_t token = 0);

/// The next event of `w` that is not a `state`, waiting up to `limit` (steady clock);
/// nullopt when none came.
std::optional<WatchEvent> next_change(Watch& w, Millis limit);

/// Reads `w` until an event `match` accepts (returned) or `limit` (steady clock; nullopt).
/// Every event read, the matching one too, is appended to `*seen` (when given) as `describe`.
std::optional<WatchEvent> next_matching(Watch& w, Millis limit,
                                        const std::function<bool(const WatchEvent&)>& match,
                                        std::vector<std::string>* seen = nullptr);

/// `lines`, each after a new line and two spaces (for a failure message).
std::string joined(const std::vector<std::string>& lines);

/// Checks a stream of hand-offs, per name: an `acquired` comes while the name is free and has
/// a token above the name's last; a `released` closes exactly the name's last token; any other
/// kind fails. Call `check` inside ASSERT_NO_FATAL_FAILURE (it ASSERTs).
class HandOffOrder {
 public:
  struct Name {
    std::uint64_t last = 0;  // the token of the last `acquired`
    bool held = false;
    bool gap_since_acquired = false;  // a gap came while this lease was believed held
    int acquired = 0, released = 0;
  };

  /// An `acquired` or `released` in token order, each lease closed before the next (ASSERTs);
  /// a `lost` only as the contract's inferred end of a lease believed held across a gap
  /// (docs/design.md "Watching locks": it ended while events were missed).
  void check(const WatchEvent& e);
  /// A `gap`: every lease believed held may have ended among the missed events.
  void take_gap();
  /// A re-list's `state` of a name (after a gap): the lease as read then. A held state never
  /// has a token below the name's last (ASSERTs); the name's last token and held follow it.
  void take_state(const WatchEvent& e);
  /// The record of `name` (all zero when it had no event).
  const Name& of(const std::string& name) { return names_[name]; }
  /// The client ids (the holder before its ':') of every `acquired`.
  const std::set<std::string>& holders() const { return holders_; }

 private:
  std::map<std::string, Name> names_;
  std::set<std::string> holders_;
};

/// A watch event and when the recorder received it.
struct Received {
  WatchEvent ev;
  std::chrono::steady_clock::time_point at;
};

/// Reads `w` on a thread of its own into a vector until `finish()` (which also reads what is
/// still queued, waiting at most 100 ms for each more event).
class WatchRecorder {
 public:
  explicit WatchRecorder(Watch& w);
  ~WatchRecorder();
  WatchRecorder(const WatchRecorder&) = delete;
  WatchRecorder& operator=(const WatchRecorder&) = delete;

  /// Stops reading once no event has come for 100 ms; idempotent.
  void finish();
  /// A copy of the events received so far, in order.
  std::vector<Received> events() const;

 private:
  void run();

  Watch& w_;
  std::atomic<bool> stop_{false};
  mutable detail::AnnotatedMutex mu_;
  std::vector<Received> events_ DISTLOCK_GUARDED_BY(mu_);
  std::thread thread_;
};

/// Two clients of `url` (each `ttl_of(10 s, 60 s)`) hand `name` to each other `hand_offs`
/// times (one more per client at most); `w`, watching `name` and nothing else in use, must
/// report every `acquired` and `released` in the order HandOffOrder checks, each change
/// within 10 s and all within `limit` (steady clock), both clients among the holders, and
/// nothing after the last release.
void expect_hand_offs_in_token_order(Watch& w, const std::string& url, const std::string& name, int hand_offs,
                                     Millis limit);

/// `w` (of a prefix nobody locks under) is stopped by another thread while this one waits in
/// `next(30 s)`: no event comes and `next` returns within 10 s (steady clock).
void expect_stop_from_another_thread_ends_next(Watch& w);

/// What `expect_killed_holder_lost` saw.
struct KilledHolder {
  WatchEvent acquired;   // the holder's `acquired`
  WatchEvent lost;       // the change after the kill: `lost`, of its name and token
  Millis after_kill{0};  // from the SIGKILL to that change, steady clock
};

/// Starts a lock_tool holder of `name` on `url` with a TTL of `ttl_ms` and ASSERTs its
/// `acquired` within 20 s; SIGKILLs it and ASSERTs a next change within 15 s, EXPECTing it
/// to be `lost` with the name and token of that `acquired`. Whether it was inferred, and how
/// soon it came, the caller checks in `out`.
void expect_killed_holder_lost(Watch& w, const std::string& url, const std::string& name, int ttl_ms,
                               KilledHolder& out);

/// `lease` (of `lease_name`, just taken, watched by `w`) is reported `acquired`; `admin`
/// revokes it; the watch reports `revoked` with the lease's token, and the holder's on_lost
/// runs within 10 s (the caller's TTL must be below that).
void expect_revoke_reported(Watch& w, Client& admin, Lease& lease, const std::string& lease_name);

/// After a gap: `holder` takes `name` (TTL 60 s) and releases it; the next change of `w` that
/// is not a gap (each waited for up to `limit`) is its `acquired` with its token, then its
/// `released` (10 s).
void expect_live_again(Watch& w, Client& holder, const std::string& name, Millis limit);

/// The next event of `w`, within 10 s (steady clock), is the `state` of `name`, held with
/// `token`: a watch's initial listing, or its re-list after a gap. No event is a fatal failure.
void expect_held_state(Watch& w, const std::string& name, std::uint64_t token);

}  // namespace distlock::testing
