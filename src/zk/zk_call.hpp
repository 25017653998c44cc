// Thin RAII and request layer over ZooKeeper's threaded C client (libzookeeper_mt).
//
// Every request is asynchronous: `submit_*` hands the C client a heap reference to a
// `Reply` and returns it; `await` waits for the answer up to a deadline. A reply that
// arrives after the waiter gave up is still received (the C client owns a reference
// until its completion runs), and an abandoned create is undone by its completion, so
// a timed-out create never leaves an orphan node behind while the session lives.
// Pipelining is free: submit several requests, then await them (one round trip).
//
// Thread-safety: submit_* may be called from any thread, including the C client's
// completion thread (they never block); await must not be called on that thread.
//
// Example:
//   zk::Handle zh(zookeeper_init2(...));
//   auto created = zk::submit_create(zh.get(), "/distlock/x/g-lock-", owner, acl, ZOO_EPHEMERAL_SEQUENTIAL);
//   auto listed = zk::submit_children(zh.get(), "/distlock/x");   // same round trip
//   if (zk::await(created, clock, deadline) == ZOK) use(created->value, created->stat.czxid);
#pragma once

#include <zookeeper/zookeeper.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "distlock/clock.hpp"
#include "engine/round_trips.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::detail::zk {

/// Closes a session: first waits, at most kCloseDrain, until every request submitted on it
/// has run its completion (SessionContext::in_flight), then zookeeper_close (its ephemeral
/// nodes go at once; the client's threads are joined). The C client drops a request still in
/// flight when it closes without running its completion, and with it the request's memory
/// and the Reply it carries: fire-and-forget requests (a session's presence node, the undo of
/// an abandoned create) are often still in flight when a short-lived client closes. A request
/// unanswered after the bound (a frozen server) is left to that. Never call it on the C
/// client's completion thread (it would wait out the bound: that thread runs the completions).
void close_session(zhandle_t* zh) noexcept;

/// How long close_session waits for the answers in flight: a live server answers within a
/// round trip, and a dead one's requests fail at once (connection loss).
inline constexpr std::chrono::milliseconds kCloseDrain{500};

struct HandleCloser {
  void operator()(zhandle_t* zh) const noexcept { close_session(zh); }
};
using Handle = std::unique_ptr<zhandle_t, HandleCloser>;

/// The requests of one session handed to the C client whose completion has not run yet.
class InFlight {
 public:
  void started() {
    LockGuard lk(mu_);
    ++count_;
  }
  void finished() {
    LockGuard lk(mu_);
    if (--count_ == 0) cv_.notify_all();
  }
  /// Waits until none is in flight or `bound` (real time) has passed; true if none is.
  bool drain(std::chrono::milliseconds bound) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    UniqueLock lk(mu_);
    while (count_ > 0 && std::chrono::steady_clock::now() < deadline) cv_.wait_until(lk.native(), deadline);
    return count_ == 0;
  }

 private:
  AnnotatedMutex mu_;
  std::condition_variable cv_;
  int count_ DISTLOCK_GUARDED_BY(mu_) = 0;
};

/// What the context of every session these calls are made on (zookeeper_init2's
/// `context`, passed as a SessionContext*) starts with: where its requests are counted
/// (engine/round_trips.hpp), one per submit_* call (a multi is one request), and which of
/// them are still in flight (close_session waits for them). A session whose context is
/// null counts nothing and is closed without waiting.
struct SessionContext {
  RoundTrips* round_trips = nullptr;  ///< outlives the session
  InFlight in_flight;
};

/// "No answer before the deadline": not a ZooKeeper code (those are > -200).
inline constexpr int kTimedOut = -10000;

/// One request's outcome, shared by the waiting thread and the completion thread.
struct Reply {
  AnnotatedMutex mu;
  std::condition_variable cv;
  bool done DISTLOCK_GUARDED_BY(mu) = false;
  bool abandoned DISTLOCK_GUARDED_BY(mu) = false;  // the waiter stopped waiting
  int rc = ZOK;
  Stat stat{};
  std::string value;                  // create: the created path; get: the data
  std::vector<std::string> children;  // get_children
  zhandle_t* zh = nullptr;            // create: to undo a create nobody waits for any more
  SessionContext* session = nullptr;  // the session's context (null: none), for its in_flight
  bool undo_if_abandoned = false;
  // create_and_touch: buffers the C client fills when the answer arrives.
  std::vector<char> path_buffer;
  Stat parent_stat{};
  zoo_op_result_t results[2]{};
};
using ReplyPtr = std::shared_ptr<Reply>;

ReplyPtr submit_create(zhandle_t* zh, const std::string& path, std::string_view data, const ACL_vector* acl,
                       int mode);
/// One transaction: create `path` and touch (setData) its parent `parent`. On ZOK,
/// `value` is the created path and `stat` the parent's Stat after the transaction:
/// `numChildren` says whether anybody else is there, and `mzxid` is the transaction's
/// zxid, i.e. the new node's czxid. Saves the separate listing when uncontended.
ReplyPtr submit_create_and_touch(zhandle_t* zh, const std::string& path, std::string_view data,
                                 const ACL_vector* acl, int mode, const std::string& parent);
ReplyPtr submit_delete(zhandle_t* zh, const std::string& path, int version);
/// One transaction of two setData (each at its version, -1: any): both or neither. On
/// ZOK, `stat` is the first node's new Stat (its mtime: the leader's wall clock at the
/// transaction).
ReplyPtr submit_set_both(zhandle_t* zh, const std::string& path1, std::string_view data1, int version1,
                         const std::string& path2, std::string_view data2, int version2);
/// One transaction of two deletes (each at its version, -1: any): both or neither.
ReplyPtr submit_delete_both(zhandle_t* zh, const std::string& path1, int version1, const std::string& path2,
                            int version2);
/// exists; with a non-null `watcher`, also leaves a one-shot watch on `path`.
ReplyPtr submit_exists(zhandle_t* zh, const std::string& path, watcher_fn watcher = nullptr,
                       void* watcher_ctx = nullptr);
ReplyPtr submit_children(zhandle_t* zh, const std::string& path);
/// getChildren2: `children` and the parent's `stat` (cversion, pzxid). With `watch`, also
/// leaves a one-shot child watch, delivered to the handle's default watcher.
ReplyPtr submit_children_stat(zhandle_t* zh, const std::string& path, bool watch);
/// get that also leaves a one-shot data watch (the handle's default watcher).
ReplyPtr submit_get_watched(zhandle_t* zh, const std::string& path);
/// get: on ZOK, `value` is the node's data (empty for none) and `stat` its Stat.
ReplyPtr submit_get(zhandle_t* zh, const std::string& path);
/// get that also leaves a one-shot data watch delivered to `watcher` (only when the node exists:
/// unlike exists, a get of a missing node leaves no watch behind).
ReplyPtr submit_get(zhandle_t* zh, const std::string& path, watcher_fn watcher, void* watcher_ctx);
/// set (setData) at `version` (-1: any); on ZOK, `stat` is the node's new Stat.
ReplyPtr submit_set(zhandle_t* zh, const std::string& path, std::string_view data, int version);
/// sync: the server this session is connected to catches up with the leader (a
/// follower asks the leader and applies everything committed before the answer).
/// Requests submitted after it on the same session are answered only after it
/// completes (per-session FIFO), so an `exists` pipelined behind a sync reads state at
/// least as new as the leader's at the time of the sync.
ReplyPtr submit_sync(zhandle_t* zh, const std::string& path);
/// A sync and, pipelined behind it (one round trip), the children of `path` in `listed`: the
/// listing reads state at least as new as the leader's when the sync was answered (a lagging
/// follower catches up first; one cut off from the leader does not answer the sync). Returns
/// the sync's rc, awaited until `deadline` on `clock`; the caller awaits `listed` after ZOK.
int list_after_sync(zhandle_t* zh, const std::string& path, Clock& clock, Clock::time_point deadline,
                    ReplyPtr& listed);
/// The same for the data of `path` (a `get`, in `got`): a record read after a sync.
int get_after_sync(zhandle_t* zh, const std::string& path, Clock& clock, Clock::time_point deadline,
                   ReplyPtr& got);
/// Adds digest credentials "user:password" to the session (re-sent on reconnect).
ReplyPtr submit_auth(zhandle_t* zh, const std::string& credentials);

/// Waits until the reply arrives or `deadline` on `clock` (the client's injected clock,
/// so deadlines run on the same time as the engine's) passes; returns its rc or
/// kTimedOut (the reply is then marked abandoned).
int await(const ReplyPtr& reply, Clock& clock, Clock::time_point deadline);

/// True for the codes after which the request may or may not have been applied, or
/// the connection/session is not usable right now (retrying later may work).
bool is_transient(int rc) noexcept;
/// "ZNOAUTH (not authenticated)" style text for messages.
std::string describe(int rc);

}  // namespace distlock::detail::zk
