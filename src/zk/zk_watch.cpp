// Watching every lock under a name prefix on zk:// (Backend::watch_prefix; docs/zookeeper.md
// "Watching locks").
//
// ZooKeeper's watches are one-shot and Debian's C client (3.8) has no persistent recursive
// ones, so a watch keeps one-shot watches armed and infers the events from successive
// readings. It has its own session (its own handle, whose default watcher is this watch):
//   - a child watch on /distlock: lock directories made or deleted (names under the prefix);
//   - per lock directory under the prefix, a child watch (queue nodes come and go) and a data
//     watch on the first node (a revoke rewrites it) and on the lock-delay marker if any.
// A trigger only marks the directory dirty; the watch's thread re-reads it (getChildren2
// re-arming the child watch, then in one pipelined round the first node's data and Stat —
// its czxid is the token — and the marker), compares with what it read last, and reports:
//   - the first node changed from A to B: A's lease ended, then B acquired (B holds unless a
//     lost holder's lock-delay runs; it is reported once it holds). A's end is `released`
//     while A's session still exists (its presence node, kSessionsDir, was read after A was
//     gone), `lost` when A went in the same transaction as its session's presence node (the
//     directory's pzxid equals that of kSessionsDir and A's delete is the directory's only
//     change since the last reading: the server closed or expired the session), and `released`
//     otherwise (both gone in different transactions: a release followed by the end of the
//     session; or the session's end with another change of the directory before the read —
//     reported released, docs/zookeeper.md says so).
//   - the first node's data became "@revoked\n<owner>": `revoked` (its lease ended).
// A sequential node's number counts the children made in its directory before it (deletes
// move cversion, not the numbers). So a node that came and went between two readings is
// found: a node first in the queue now that was not there before, with numbers between the
// highest seen at the last reading and its own that are on no node now, had an unseen node
// before it; a queue emptied, or empty at both readings, with more cversion changes than seen,
// likewise; a directory found gone after a child notification that no reading saw (counted
// per directory), likewise; and a node seen waiting between A and B that is gone now may have
// held the lock. Each is a gap naming the lock (never a
// silent skip); the API layer then re-lists. A disconnection, a reconnection and a new session (after an
// expiry) are gaps too, and after each every directory is read again.
//
// `sync` sends a ZooKeeper sync on the watch's session (its server catches up with the
// leader; every notification of a change committed before it arrives before its answer),
// then waits until the watch's thread has read the root and every watched directory again.
//
// Cost per change of a watched lock: one getChildren2 of its directory, then one round of
// one get (the first node) plus one get per lock-delay marker and, when a lease ended, two
// exists (the holder's presence node and kSessionsDir). A new lock directory also costs a
// getChildren2 of /distlock.
#include <cerrno>
#include <set>

#include "zk/zk_backend_impl.hpp"

namespace distlock::detail::zk {

namespace {

// Readings of one directory in a row whose first node vanished before its read.
constexpr int kReadAttempts = 5;
// After a failed read (connection down), the thread waits this long or for a session event.
constexpr Millis kRetryPause{200};

std::string dir_path(const std::string& key) {
  return std::string(kRoot) + "/" + key;
}

// The owner of a first node from its data (the acquiring client's owner string), or of a
// revoked one ("@revoked\n<owner>").
std::string owner_of_value(const std::string& value) {
  if (value.starts_with(kRevokedValue)) return value.substr(kRevokedValue.size());
  return value;
}

class ZkPrefixWatch final : public PrefixWatch {
 public:
  ZkPrefixWatch(const UrlConfig& cfg, std::shared_ptr<Clock> clock, std::shared_ptr<RoundTrips> round_trips,
                std::string prefix, LockEventSink& sink)
      : cfg_(cfg),
        clock_(std::move(clock)),
        round_trips_(std::move(round_trips)),
        prefix_(std::move(prefix)),
        sink_(sink) {}

  ~ZkPrefixWatch() override {
    {
      LockGuard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    std::shared_ptr<zhandle_t> h;
    {
      LockGuard lk(mu_);
      h = std::move(handle_);
    }
    h.reset();  // closes the session (joins the C client's threads) before the members go
  }

  // Opens the session, reads the root and every directory under the prefix (watches armed,
  // nothing reported: the API layer lists the initial state), starts the thread.
  void start(Error& ec) {
    if (!open_session(ec)) return;
    const int rc = full_pass(true);
    if (rc != ZOK) {
      ec.fail(zk::is_transient(rc) ? errc::backend_unavailable : errc::protocol_error,
              "reading the lock directories under " + std::string(kRoot) + " at " + cfg_.redacted_url +
                  " failed: " + zk::describe(rc));
      return;
    }
    thread_ = std::thread([this] { run(); });
  }

  bool sync(Error& ec) override {
    auto h = handle();
    const SteadyTime deadline = clock_->now() + cfg_.command_timeout;
    if (!h) {
      ec.fail(errc::backend_unavailable, "watch of \"" + prefix_ + "\": no ZooKeeper session");
      return false;
    }
    auto synced = zk::submit_sync(h.get(), "/");
    const int rc = zk::await(synced, *clock_, deadline);
    if (rc != ZOK) {
      ec.fail(errc::backend_unavailable, "watch of \"" + prefix_ + "\": ZooKeeper sync at " +
                                             cfg_.redacted_url + " failed: " + zk::describe(rc));
      return false;
    }
    // Every notification of a change before the sync has arrived; a full reading that
    // starts after this point sees every change before it, reported.
    UniqueLock lk(mu_);
    const std::uint64_t ticket = ++full_asked_;
    cv_.notify_all();
    const SteadyTime until = clock_->now() + cfg_.connect_timeout + cfg_.command_timeout;
    while (!stopping_ && full_done_ < ticket && clock_->now() < until)
      clock_->wait_until(cv_, lk.native(), until);
    if (full_done_ < ticket) {
      ec.fail(errc::backend_unavailable,
              "watch of \"" + prefix_ + "\": the directories at " + cfg_.redacted_url +
                  " could not be read again within " +
                  std::to_string((cfg_.connect_timeout + cfg_.command_timeout).count()) + " ms");
      return false;
    }
    return true;
  }

  // A lease's node goes with its session (an expiry included), and the reading of its directory
  // reports that end: no status re-reads are needed to find expiries.
  bool publishes_expiries() const noexcept override { return true; }

 private:
  // What the watch knows of one lock directory (only the watch's thread touches these,
  // and start() before the thread exists).
  struct Dir {
    std::string name;  // decoded lock name
    bool listed = false;
    std::int64_t czxid = 0;  // of the directory: another one means deleted and made again
    std::int32_t cversion = 0;
    std::set<std::string> children;  // every child at the last reading
    std::string head;                // the first lock node at the last reading ("" none)
    std::uint64_t head_seq = 0;
    std::int64_t max_seq = -1;  // the highest lock node number seen in this directory (-1 none)
    bool held = false;          // its lease was reported (or found held at the start) and not ended
    bool revoked = false;       // its revoke was reported
    std::uint64_t token = 0;
    std::string owner;
    std::int64_t session = 0;  // the first node's ephemeralOwner
    // Child notifications of the directory counted before the last reading was sent
    // (child_events_): one counted since then is a change no reading saw.
    std::uint64_t child_events_read = 0;
    bool from_root = false;  // found by a reading of /distlock after the start, not read yet
  };

  // The watcher's context of one session: events of an older session are ignored.
  // Its SessionContext base (zk_call.hpp) counts the session's requests.
  struct SessionCtx : SessionContext {
    ZkPrefixWatch* watch = nullptr;
    std::uint64_t gen = 0;
  };

  static void on_zk_event(zhandle_t* zh, int type, int state, const char* path, void* ctx) {
    auto* c = static_cast<SessionCtx*>(static_cast<SessionContext*>(ctx));
    if (c != nullptr) c->watch->on_event(zh, c->gen, type, state, path);
  }

  // The C client's completion thread: only notes what happened; the thread reads and reports.
  void on_event(zhandle_t* zh, std::uint64_t gen, int type, int state, const char* path) noexcept {
    LockGuard lk(mu_);
    if (gen != gen_) return;
    if (type == ZOO_SESSION_EVENT) {
      if (state == ZOO_CONNECTED_STATE) {
        if (!ever_connected_ && !cfg_.credentials.empty()) {
          try {
            zk::submit_auth(zh, cfg_.credentials);
          } catch (...) {
          }
        }
        if (ever_connected_ && !connected_) {
          reconnected_ = true;
          full_asked_ += 1;
        }
        connected_ = true;
        ever_connected_ = true;
      } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
        connected_ = false;
        expired_ = true;
      } else if (connected_) {
        connected_ = false;
        disconnected_ = true;
      }
      cv_.notify_all();
      return;
    }
    if (path == nullptr || type == ZOO_NOTWATCHING_EVENT) return;
    const std::string_view p(path);
    const std::string root(kRoot);
    try {
      if (p == root) {
        root_dirty_ = true;
      } else if (p.starts_with(root + "/")) {
        std::string_view rest = p.substr(root.size() + 1);
        const auto slash = rest.find('/');
        std::string key(rest.substr(0, slash));
        if (type == ZOO_CHILD_EVENT && slash == std::string_view::npos) ++child_events_[key];
        dirty_.insert(std::move(key));
      }
    } catch (...) {  // no memory: read everything again
      full_asked_ += 1;
    }
    cv_.notify_all();
  }

  std::shared_ptr<zhandle_t> handle() {
    LockGuard lk(mu_);
    return handle_;
  }

  std::uint64_t child_events_of(const std::string& key) {
    LockGuard lk(mu_);
    auto it = child_events_.find(key);
    return it == child_events_.end() ? 0 : it->second;
  }

  // A new session (the first, or after an expiry); waits until it is connected.
  bool open_session(Error& ec) {
    auto ctx = std::make_unique<SessionCtx>();
    ctx->watch = this;
    ctx->round_trips = round_trips_.get();
    {
      LockGuard lk(mu_);
      ctx->gen = ++gen_;
      connected_ = ever_connected_ = expired_ = false;
    }
    errno = 0;
    zhandle_t* raw = zookeeper_init2(cfg_.connect_string.c_str(), &on_zk_event,
                                     static_cast<int>(cfg_.session_timeout.count()), nullptr,
                                     static_cast<SessionContext*>(ctx.get()), 0, &zk_log_line);
    if (raw == nullptr) {
      ec.fail(errc::backend_unavailable,
              "watch of \"" + prefix_ + "\": cannot start a ZooKeeper session for " + cfg_.redacted_url);
      return false;
    }
    std::shared_ptr<zhandle_t> h(raw, HandleCloser{});
    std::shared_ptr<zhandle_t> old;
    std::unique_ptr<SessionCtx> old_ctx;
    {
      LockGuard lk(mu_);
      old = std::move(handle_);
      handle_ = h;
      old_ctx = std::move(ctx_);
      ctx_ = std::move(ctx);
    }
    old.reset();  // the old session's threads end here; its context goes after them
    old_ctx.reset();
    const SteadyTime deadline = clock_->now() + cfg_.connect_timeout;
    UniqueLock lk(mu_);
    while (!connected_ && !expired_ && !stopping_ && clock_->now() < deadline)
      clock_->wait_until(cv_, lk.native(), deadline);
    if (connected_) return true;
    ec.fail(
        expired_ ? errc::auth_failed : errc::backend_unavailable,
        "watch of \"" + prefix_ + "\": " +
            (expired_ ? "ZooKeeper at " + cfg_.redacted_url + " refused the session (authentication failed)"
                      : "no ZooKeeper server of " + cfg_.redacted_url + " answered within " +
                            std::to_string(cfg_.connect_timeout.count()) + " ms"));
    return false;
  }

  void gap(const std::string& reason) {
    if (!baseline_) sink_.on_gap(reason);
  }

  // A gap of one lock only (`gap_names` = {name}); the API layer still re-lists the prefix.
  void name_gap(const Dir& d, const std::string& reason) {
    if (!baseline_) sink_.on_names_gap("lock \"" + d.name + "\": " + reason, {d.name});
  }

  void report(LockEvent::Kind kind, const Dir& d, std::string detail = {}) {
    if (baseline_) return;
    LockEvent ev;
    ev.kind = kind;
    ev.name = d.name;
    ev.token = d.token;
    ev.owner = d.owner;
    ev.detail = std::move(detail);
    sink_.on_event(std::move(ev));
  }

  // Reads /distlock (child watch armed) and then every directory under the prefix that is
  // new or gone. ZOK, or the failing code.
  int read_root(std::set<std::string>& to_read) {
    auto h = handle();
    if (!h) return ZCONNECTIONLOSS;
    const SteadyTime deadline = clock_->now() + cfg_.command_timeout;
    auto listed = zk::submit_children_stat(h.get(), std::string(kRoot), true);
    int rc = zk::await(listed, *clock_, deadline);
    if (rc == ZNONODE) {
      // No lock yet: watch for the root to appear (then its children are read).
      SessionCtx* ctx = nullptr;
      {
        LockGuard lk(mu_);
        ctx = ctx_.get();
      }
      auto ex = zk::submit_exists(h.get(), std::string(kRoot), &on_zk_event, ctx);
      rc = zk::await(ex, *clock_, deadline);
      if (rc == ZOK) return read_root(to_read);  // made meanwhile
      if (rc != ZNONODE) return rc;
      for (auto& [key, d] : dirs_) to_read.insert(key);
      return ZOK;
    }
    if (rc != ZOK) return rc;
    std::set<std::string> present;
    for (const auto& child : listed->children) {
      auto name = decode_component(child);  // ".records", ".sessions" and foreign nodes do not decode
      if (!name || !name->starts_with(prefix_)) continue;
      present.insert(child);
      auto [it, made] = dirs_.try_emplace(child);
      if (made) {
        it->second.name = std::move(*name);
        it->second.from_root = !baseline_;
        to_read.insert(child);
      }
    }
    for (auto& [key, d] : dirs_)
      if (!present.count(key)) to_read.insert(key);
    return ZOK;
  }

  // Reads one directory (child watch, first node's data watch, marker's data watch) and
  // reports what changed since the last reading. ZOK, ZNOTEMPTY when the queue kept moving
  // under the reads (the caller reads it again later), or the failing code.
  int read_dir(const std::string& key) {
    auto h = handle();
    if (!h) return ZCONNECTIONLOSS;
    Dir& d = dirs_[key];
    if (d.name.empty()) {
      auto name = decode_component(key);
      if (!name) return ZOK;
      d.name = std::move(*name);
    }
    const std::string path = dir_path(key);
    for (int attempt = 0; attempt < kReadAttempts; ++attempt) {
      const SteadyTime deadline = clock_->now() + cfg_.command_timeout;
      // Counted before the reading is sent: a notification that arrives while it is on the way
      // counts as unseen (a gap where none was needed at worst, never a skip).
      const std::uint64_t child_events = child_events_of(key);
      auto listed = zk::submit_children_stat(h.get(), path, true);
      // While a lease is known held, the same round reads its session's presence node and
      // kSessionsDir's Stat: if the lease ended, they tell how (a read one round later would
      // let a new session of the holder's client move kSessionsDir's pzxid first).
      ReplyPtr presence, sessions;
      if (d.listed && d.held) {
        if (d.session != 0) presence = zk::submit_exists(h.get(), session_presence_path(d.session));
        sessions = zk::submit_exists(h.get(), std::string(kSessionsDir));
      }
      int rc = zk::await(listed, *clock_, deadline);
      if (rc == ZNONODE) {
        // The directory is gone (the server deletes an empty container), and with it every
        // node; its child watch is gone too: the root's watch shows it made again.
        // Not held at the last reading (its queue empty, or its first node not holding): a
        // child notified since then, a node made after that reading, may have held the lock
        // and gone with the directory; so may a node of a directory never read.
        if (d.held)
          name_gap(d, "its directory went away before the end of the lease of token " +
                          std::to_string(d.token) + " was read");
        else if (d.listed && child_events_of(key) > d.child_events_read)
          name_gap(d,
                   "its queue changed after the last reading and its directory went away before the next: "
                   "a lease may have come and gone unseen");
        else if (!d.listed && d.from_root)
          name_gap(d,
                   "its directory was made and went away before it was read: a lease may have come and gone "
                   "unseen");
        dirs_.erase(key);
        {
          LockGuard lk(mu_);
          child_events_.erase(key);
        }
        return ZOK;
      }
      if (rc != ZOK) return rc;
      const Stat dir_stat = listed->stat;
      const auto queue = queue_order(listed->children);
      const bool has_marker = std::find(listed->children.begin(), listed->children.end(),
                                        std::string(kDelayNode)) != listed->children.end();
      ReplyPtr first, marker, note;
      if (!queue.empty()) first = zk::submit_get_watched(h.get(), path + "/" + queue.front().node);
      if (!queue.empty() && has_marker)
        marker = zk::submit_get_watched(h.get(), path + "/" + std::string(kDelayNode));
      const bool same_dir = d.listed && d.czxid == dir_stat.czxid;
      const bool ended = same_dir && d.held && (queue.empty() || queue.front().node != d.head);
      if (ended && std::find(listed->children.begin(), listed->children.end(), std::string(kRevokedNode)) !=
                       listed->children.end())
        note = zk::submit_get(h.get(), path + "/" + std::string(kRevokedNode));
      if (first) {
        rc = zk::await(first, *clock_, deadline);
        if (rc == ZNONODE) continue;  // left meanwhile: read the queue again
        if (rc != ZOK) return rc;
      }
      if (marker) {
        rc = zk::await(marker, *clock_, deadline);
        if (rc == ZNONODE)
          marker.reset();
        else if (rc != ZOK)
          return rc;
      }
      int presence_rc = ZNONODE, sessions_rc = ZNONODE;
      if (presence) presence_rc = zk::await(presence, *clock_, deadline);
      if (sessions) sessions_rc = zk::await(sessions, *clock_, deadline);
      // The ended lease was revoked (and its node deleted) between two readings: the revoke
      // note names its token.
      const bool revoked_unseen = note && zk::await(note, *clock_, deadline) == ZOK &&
                                  note->value.starts_with(std::to_string(d.token) + "\n");
      if ((presence && zk::is_transient(presence_rc)) || (sessions && zk::is_transient(sessions_rc)))
        return zk::is_transient(presence_rc) ? presence_rc : sessions_rc;
      apply(d, same_dir, listed->children, queue, dir_stat, first, marker, presence_rc,
            sessions_rc == ZOK ? sessions->stat.pzxid : -1, revoked_unseen);
      d.child_events_read = child_events;
      d.from_root = false;
      return ZOK;
    }
    return ZNOTEMPTY;
  }

  void apply(Dir& d, bool same_dir, const std::vector<std::string>& children,
             const std::vector<LockNode>& queue, const Stat& dir_stat, const ReplyPtr& first,
             const ReplyPtr& marker, int presence_rc, std::int64_t sessions_pzxid, bool revoked_unseen) {
    if (d.listed && !same_dir && d.held) {
      name_gap(d, "its directory was deleted and made again; the end of the lease of token " +
                      std::to_string(d.token) + " was not seen");
      d.held = false;
    }
    const std::set<std::string> before = same_dir ? d.children : std::set<std::string>{};
    const std::int32_t cversion_before = same_dir ? d.cversion : 0;
    const std::set<std::string> now(children.begin(), children.end());
    const std::string prev_head = same_dir ? d.head : std::string();
    const std::uint64_t prev_seq = same_dir ? d.head_seq : 0;
    const std::int64_t max_seq_before = same_dir ? d.max_seq : -1;

    // The first node now, and whether it holds.
    std::string head;
    std::uint64_t head_seq = 0, token = 0;
    std::string owner;
    std::int64_t session = 0;
    bool revoked_now = false, holds = false;
    if (!queue.empty() && first) {
      head = queue.front().node;
      head_seq = queue.front().seq;
      token = static_cast<std::uint64_t>(first->stat.czxid);
      owner = owner_of_value(first->value);
      session = first->stat.ephemeralOwner;
      revoked_now = first->value.starts_with(kRevokedValue);
      holds = !revoked_now && (!marker || marker_lets_first_hold(marker->value, token));
    }

    if (head != prev_head || !same_dir) {
      // The lease of the previous first node ended.
      if (d.held) {
        // The directory's last child change is the holder's delete only when it is the one
        // change since the last reading; that change and the holder's presence node's delete
        // are one transaction (the same pzxid) only when the server ended the holder's session.
        // Another session's end (a waiter's) can be the last change of both directories.
        const bool session_gone = presence_rc == ZNONODE && sessions_pzxid >= 0 &&
                                  sessions_pzxid == dir_stat.pzxid &&
                                  dir_stat.cversion - cversion_before == 1;
        if (revoked_unseen) {
          report(LockEvent::Kind::revoked, d);
        } else if (session_gone) {
          report(LockEvent::Kind::lost, d,
                 "the holder's ZooKeeper session ended (expired, or its client closed it) while it held the "
                 "lock: its node went in the same transaction as the session");
        } else {
          report(LockEvent::Kind::released, d);
        }
        d.held = false;
      }
      // Nodes that may have held the lock between the two readings.
      if (d.listed || !baseline_) {
        // Children gone since the last reading, and lock nodes new since then numbered
        // before the first one.
        std::int64_t vanished = 0, appeared_before = 0;
        for (const auto& c : before)
          if (!now.count(c)) ++vanished;
        for (const auto& c : now) {
          if (before.count(c)) continue;
          auto n = parse_lock_node(c);
          if (n && n->seq < head_seq) ++appeared_before;
        }
        std::string why;
        for (const auto& c : before) {
          auto n = parse_lock_node(c);
          if (n && n->node != prev_head && !now.count(c) && n->seq > prev_seq &&
              (head.empty() || n->seq < head_seq)) {
            why = "node " + n->node + ", seen waiting, is gone and may have held the lock in between";
            break;
          }
        }
        // A sequential node's number counts the creates in the directory before it (its
        // deletes move cversion but not the numbers: measured, zk_watch_many_names_test). Every
        // number above the highest one seen at the last reading and below B's is a node made
        // since: one not among the lock nodes new now (a marker or note counts too, a false
        // alarm at worst) came and went unseen, and may have held the lock before B.
        if (why.empty() && !head.empty() && !before.count(head) &&
            static_cast<std::int64_t>(head_seq) - (max_seq_before + 1) > appeared_before) {
          why = "node " + head + " is numbered " + std::to_string(head_seq) +
                " and the highest seen before was " + std::to_string(max_seq_before) +
                ": a node between them came and went unseen";
        }
        if (why.empty() && head.empty() &&
            static_cast<std::int64_t>(dir_stat.cversion) - cversion_before >
                vanished + static_cast<std::int64_t>(now.size()) -
                    (static_cast<std::int64_t>(before.size()) - vanished)) {
          why = "the queue emptied after more changes than were seen: a node came and went unseen";
        }
        if (!why.empty()) name_gap(d, "leases may have been missed: " + why);
      }
      d.head = head;
      d.head_seq = head_seq;
      d.token = token;
      d.owner = owner;
      d.session = session;
      d.revoked = revoked_now;
      if (revoked_now && !baseline_)
        name_gap(d, "token " + std::to_string(token) + " was held and revoked unseen");
      if (holds) {
        d.held = true;
        report(LockEvent::Kind::acquired, d);
      }
    } else if (!head.empty()) {
      // Same first node: held now (a lock-delay ran out), or revoked.
      if (revoked_now && !d.revoked) {
        d.revoked = true;
        if (d.held) {
          d.held = false;
          report(LockEvent::Kind::revoked, d);
        }
      } else if (holds && !d.held && !d.revoked) {
        d.held = true;
        d.token = token;
        d.owner = owner;
        d.session = session;
        report(LockEvent::Kind::acquired, d);
      }
    } else {
      // An empty queue at both readings (a directory the server has not deleted yet): a node
      // made and deleted between them was first, so it may have held the lock. The directory's
      // cversion counts it; the children seen made or gone do not.
      std::int64_t seen = 0;
      for (const auto& c : before)
        if (!now.count(c)) ++seen;
      for (const auto& c : now)
        if (!before.count(c)) ++seen;
      if (static_cast<std::int64_t>(dir_stat.cversion) - cversion_before > seen)
        name_gap(d, "leases may have been missed: the queue was empty at two readings and changed " +
                        std::to_string(dir_stat.cversion - cversion_before) + " times between them, " +
                        std::to_string(seen) + " of them seen: a node came and went unseen");
    }
    d.listed = true;
    d.czxid = dir_stat.czxid;
    d.cversion = dir_stat.cversion;
    d.children = now;
    d.max_seq = max_seq_before;
    for (const auto& n : queue) d.max_seq = std::max(d.max_seq, static_cast<std::int64_t>(n.seq));
  }

  // The root and every known directory. ZOK or the first failing code.
  int full_pass(bool baseline) {
    baseline_ = baseline;
    std::set<std::string> to_read;
    int rc = read_root(to_read);
    if (rc == ZOK) {
      for (auto& [key, d] : dirs_) to_read.insert(key);
      for (const auto& key : to_read) {
        const int drc = read_dir(key);
        if (drc == ZNOTEMPTY && baseline) {
          // A queue that kept moving under the start's reads: the thread reads it first (a
          // lease found held then is reported `acquired`).
          LockGuard lk(mu_);
          dirty_.insert(key);
          continue;
        }
        if (drc != ZOK && rc == ZOK) rc = drc;
        if (zk::is_transient(drc)) break;
      }
    }
    baseline_ = false;
    return rc;
  }

  void run() {
    UniqueLock lk(mu_);
    while (!stopping_) {
      const auto has_work = [&]() DISTLOCK_REQUIRES(mu_) {
        return stopping_ || expired_ || disconnected_ || reconnected_ || root_dirty_ || !dirty_.empty() ||
               full_asked_ > full_done_;
      };
      if (!has_work()) cv_.wait(lk.native());
      if (stopping_) break;
      if (disconnected_) {
        disconnected_ = false;
        lk.unlock();
        gap("the watch's connection to ZooKeeper at " + cfg_.redacted_url + " was lost");
        lk.lock();
        continue;
      }
      if (expired_) {
        lk.unlock();
        gap("the watch's ZooKeeper session at " + cfg_.redacted_url +
            " expired: its watches were gone until a new session armed them again");
        Error ec;
        const bool ok = open_session(ec);
        lk.lock();
        if (!ok) {
          expired_ = true;
          const SteadyTime until = clock_->now() + kRetryPause;
          while (!stopping_ && clock_->now() < until) clock_->wait_until(cv_, lk.native(), until);
        } else {
          full_asked_ += 1;
        }
        continue;
      }
      const bool was_reconnect = reconnected_;
      reconnected_ = false;
      const std::uint64_t ticket = full_asked_;
      const bool full = ticket > full_done_;
      const bool root = root_dirty_;
      std::set<std::string> dirty = std::move(dirty_);
      dirty_.clear();
      root_dirty_ = false;
      lk.unlock();
      int rc = ZOK;
      if (full) {
        rc = full_pass(false);
      } else {
        std::set<std::string> to_read = dirty;
        if (root) rc = read_root(to_read);
        if (rc == ZOK) {
          for (const auto& key : to_read) {
            const int drc = read_dir(key);
            if (drc == ZOK) continue;
            if (rc == ZOK) rc = drc;
            dirty.insert(key);
            if (zk::is_transient(drc)) break;
          }
        }
      }
      if (rc == ZOK && was_reconnect)
        gap("the watch reconnected to ZooKeeper at " + cfg_.redacted_url +
            ": changes while it was away are known only from the readings since");
      lk.lock();
      if (rc == ZOK) {
        if (full) full_done_ = std::max(full_done_, ticket);
        cv_.notify_all();
        continue;
      }
      // Read again: everything on a failed full reading, else what was not read.
      if (!full) {
        root_dirty_ = root_dirty_ || root;
        dirty_.insert(dirty.begin(), dirty.end());
      }
      if (was_reconnect) reconnected_ = true;
      if (rc == ZNOTEMPTY) continue;  // the queue moved under the reads: at once
      const SteadyTime until = clock_->now() + kRetryPause;
      while (!stopping_ && !expired_ && clock_->now() < until) clock_->wait_until(cv_, lk.native(), until);
    }
  }

  const UrlConfig cfg_;
  const std::shared_ptr<Clock> clock_;
  const std::shared_ptr<RoundTrips> round_trips_;  // the client's (ZkBackend::round_trips())
  const std::string prefix_;
  LockEventSink& sink_;

  // The watch's thread only (and start() before it).
  std::map<std::string, Dir> dirs_;  // by encoded name
  bool baseline_ = false;            // a start's reading: nothing is reported

  AnnotatedMutex mu_;
  std::condition_variable cv_;
  std::uint64_t gen_ DISTLOCK_GUARDED_BY(mu_) = 0;
  bool connected_ DISTLOCK_GUARDED_BY(mu_) = false;
  bool ever_connected_ DISTLOCK_GUARDED_BY(mu_) = false;
  bool expired_ DISTLOCK_GUARDED_BY(mu_) = false;
  bool disconnected_ DISTLOCK_GUARDED_BY(mu_) = false;  // a gap to report
  bool reconnected_ DISTLOCK_GUARDED_BY(mu_) = false;   // a gap to report after the reading
  bool root_dirty_ DISTLOCK_GUARDED_BY(mu_) = false;
  std::set<std::string> dirty_ DISTLOCK_GUARDED_BY(mu_);
  // Child notifications received per lock directory (by encoded name) until it is found gone.
  std::map<std::string, std::uint64_t> child_events_ DISTLOCK_GUARDED_BY(mu_);
  std::uint64_t full_asked_ DISTLOCK_GUARDED_BY(mu_) = 0;
  std::uint64_t full_done_ DISTLOCK_GUARDED_BY(mu_) = 0;
  bool stopping_ DISTLOCK_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::unique_ptr<SessionCtx> ctx_ DISTLOCK_GUARDED_BY(mu_);
  std::shared_ptr<zhandle_t> handle_ DISTLOCK_GUARDED_BY(mu_);  // last: closed first
};

}  // namespace

std::unique_ptr<PrefixWatch> ZkBackend::watch_prefix(std::string_view prefix, LockEventSink& sink,
                                                     Error& ec) {
  ec.clear();
  auto w = std::make_unique<ZkPrefixWatch>(cfg_, clock_, round_trips_, std::string(prefix), sink);
  w->start(ec);
  if (ec) {
    ec.set_detail("cannot watch \"" + std::string(prefix) + "\": " + ec.detail());
    return nullptr;
  }
  return w;
}

}  // namespace distlock::detail::zk
