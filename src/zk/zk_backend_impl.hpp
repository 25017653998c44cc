// The ZooKeeper backend's private declarations, shared by its files: zk_session.cpp
// (sessions, their events, the keeper), zk_queue.cpp (the queue recipe: acquire,
// cancel, renew, release) and zk_backend.cpp (status, stats, factory). Not for use
// outside src/zk.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend.hpp"
#include "engine/log.hpp"
#include "engine/queue_recipe.hpp"
#include "engine/thread_annotations.hpp"
#include "zk/zk_backend.hpp"
#include "zk/zk_call.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_records.hpp"
#include "zk/zk_url.hpp"

namespace distlock::detail::zk {

// Every deadline is taken on the client's injected clock (ClientOptions::clock), the
// one the engine counts lease validity on; tests run it on a manual clock.
using SteadyTime = Clock::time_point;

// The C client's log sink (zk_session.cpp).
void zk_log_line(const char* message);

// ACLs. The "auth" scheme means "whatever identities this session authenticated as".
struct Acls {
  char auth_scheme[5] = "auth";
  char empty_id[1] = "";
  char world_scheme[6] = "world";
  char anyone_id[7] = "anyone";
  ACL creator_read[2];
  ACL root[1];
  ACL_vector creator_read_vec{};
  ACL_vector root_vec{};
  Acls() {
    creator_read[0] = ACL{ZOO_PERM_ALL, Id{auth_scheme, empty_id}};
    creator_read[1] = ACL{ZOO_PERM_READ, Id{world_scheme, anyone_id}};
    // The shared root: anybody may add a lock directory under it; only the server
    // (container clean-up) removes them.
    root[0] = ACL{ZOO_PERM_READ | ZOO_PERM_CREATE, Id{world_scheme, anyone_id}};
    creator_read_vec = ACL_vector{2, creator_read};
    root_vec = ACL_vector{1, root};
  }
};

const Acls& acls();

class ZkBackend;

// One ZooKeeper session; it is the session watcher's context. The handle is the last
// member, so it is destroyed first: closing the session joins the C client's threads
// before the fields its watcher writes go away.
// Its SessionContext base (zk_call.hpp) counts the requests into the backend's round trips.
struct Session : SessionContext {
  ZkBackend* backend = nullptr;
  std::uint64_t gen = 0;
  // Guarded by the backend's recipe_.mutex() (not annotated: ZkBackend is incomplete here and
  // recipe_ private, so `backend->recipe_.mutex()` cannot name it).
  bool connected = false;
  bool ever_connected = false;
  bool reconnected = false;  // connected again after a disconnection: nudge waiters
  bool expired = false;      // expired or auth failed: the keeper opens a new session
  bool auth_sent = false;
  // The smallest session timeout (ms) any connection of this session negotiated, 0
  // before the first. The server keeps the timeout the session was created with and
  // restores it after a restart or a leader change; a reconnect's value applies only
  // to that connection. So the session may expire after the smallest of them, never
  // later: it is the validity of its leases, and it never goes up.
  int floor_ms = 0;
  // Held nodes with a data watch of this session armed by a renewal's read, by path: the
  // node's czxid and version when it was armed. A notification of the node (changed: a revoke's
  // mark; deleted) or a reconnect removes it, so the next renewal reads the node again; until
  // then a renewal's `sync` alone confirms it (zk_queue.cpp, ZkBackend::confirm).
  std::map<std::string, std::pair<std::uint64_t, int>> armed;
  // Paths the C client keeps a data watch of `held_watcher` on (asked for, not fired yet), and
  // their bytes. It keeps them across reconnects and sets them all again on a new connection in
  // one request, which the server refuses above its jute.maxbuffer (1 MB by default) by closing
  // that connection, every time. So a renewal asks for a watch only while these stay within
  // kWatchedPathBytes; a node past that is read (unwatched) at every renewal, as before watches.
  std::set<std::string> watched;
  std::size_t watched_bytes = 0;
  zk::Handle zh;

  // Half of the server's default jute.maxbuffer: room for the session's other watches (waiters'
  // predecessors) and the request's own framing.
  static constexpr std::size_t kWatchedPathBytes = 512 * 1024;

  std::uint64_t generation() const noexcept { return gen; }
  // True (and counted) if a watch on `path` may be asked for: asked for already, or within budget.
  bool may_watch(const std::string& path) {
    if (watched.contains(path)) return true;
    if (watched_bytes + path.size() > kWatchedPathBytes) return false;
    watched.insert(path);
    watched_bytes += path.size();
    return true;
  }
  // The C client holds no watch on `path` any more (it fired, or the read that asked for it found
  // no node, which leaves none).
  void unwatched(const std::string& path) {
    if (watched.erase(path) > 0) watched_bytes -= path.size();
  }
};

// The C client's watcher callbacks (zk_session.cpp).
void session_watcher(zhandle_t* zh, int type, int state, const char* path, void* ctx);
void node_watcher(zhandle_t* zh, int type, int state, const char* path, void* ctx);
// A held node's data watch (ctx: the Session): disarms it (Session::armed).
void held_watcher(zhandle_t* zh, int type, int state, const char* path, void* ctx);

// One acquisition's node in one lock's queue (the recipe's entry; token is the node's
// czxid, confirmed the send time of the last grant or renewal). Its fields are guarded
// by the recipe's mutex; while it is not held, the acquiring thread alone writes them.
struct Entry final : QueueEntry {
  using QueueEntry::QueueEntry;
  std::uint64_t generation = 0;  // session the node belongs to
  std::string guid;              // of the current attempt
  std::string node;              // child name, empty when none (or unknown)
  std::string predecessor;       // behind: the child just before ours
  int version = 0;
  bool uncertain = false;    // a create whose answer was lost: find it by guid
  SteadyTime valid_until{};  // held: confirmed + session timeout
  // Lock-delay (zk_delay.cpp): the version of the marker this hold wrote (-1: none), and
  // whether release() (not forget) is deleting the node: the marker goes with it then.
  int delay_version = -1;
  bool releasing = false;
};

class ZkBackend final : public QueueBackend<RecordsBackend<zk::Records>>, private QueueStore {
 public:
  using Config = zk::UrlConfig;

  ZkBackend(Config cfg, const ClientOptions& opts)
      : cfg_(std::move(cfg)),
        log_(opts.logger),
        clock_(opts.clock ? opts.clock : system_steady_clock()),
        recipe_(*this, clock_, log_),
        records_(records_env()) {}

  ~ZkBackend() override {
    {
      LockGuard lk(recipe_.mutex());
      stopping_ = true;
      cv_.notify_all();
    }
    if (keeper_.joinable()) keeper_.join();
    std::shared_ptr<Session> last;
    {
      LockGuard lk(recipe_.mutex());
      last = std::move(session_);
    }
    last.reset();  // closes the session: the server drops our ephemeral nodes at once
  }

  /// Opens the first session and waits for it; checks the chroot.
  void start(Error& ec) {
    ec.clear();
    auto s = open_session(ec);
    if (!s) return;
    {
      LockGuard lk(recipe_.mutex());
      session_ = s;
    }
    const SteadyTime deadline = clock_->now() + cfg_.connect_timeout;
    {
      UniqueLock lk(recipe_.mutex());
      wait_until(lk, deadline, [&] { return s->connected || s->expired; });
      if (s->expired) {
        return ec.fail(make_error_code(errc::auth_failed),
                       "ZooKeeper at " + cfg_.redacted_url + " refused the session (authentication failed)");
      }
      if (!s->connected) {
        return ec.fail(make_error_code(errc::backend_unavailable),
                       "no ZooKeeper server of " + cfg_.redacted_url + " answered within " +
                           std::to_string(cfg_.connect_timeout.count()) + "ms");
      }
    }
    // negotiated_ms_ was set by the CONNECTED event (record_session_event).
    if (!cfg_.chroot.empty() && cfg_.chroot != "/") {
      // With a chroot, "/" is the chroot node itself.
      auto r = zk::submit_exists(s->zh.get(), "/");
      const int rc = zk::await(r, *clock_, clock_->now() + cfg_.command_timeout);
      if (rc == ZNONODE) {
        return ec.fail(make_error_code(errc::invalid_argument),
                       "chroot \"" + cfg_.chroot + "\" of " + cfg_.redacted_url +
                           " does not exist on the ZooKeeper server (create it first, e.g. zkCli.sh create " +
                           cfg_.chroot + ")");
      }
      if (rc != ZOK) {
        return ec.fail(
            make_error_code(zk::is_transient(rc) ? errc::backend_unavailable : errc::protocol_error),
            "checking chroot \"" + cfg_.chroot + "\" of " + cfg_.redacted_url +
                " failed: " + zk::describe(rc));
      }
    }
    keeper_ = std::thread([this] { keeper_main(); });
  }

  Capabilities capabilities() const noexcept override { return {true, true, true}; }
  // release marks the entry so its delete takes its lock-delay marker too; forget (a lost
  // lease) deletes the node alone, so the marker holds the name back (zk_delay.cpp).
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        Error& ec) override;
  void forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept override;

  // Waiting is driven by the predecessor watch each queued try_acquire leaves (set
  // atomically with the check, so nothing between the check and the wait is missed).
  void watch(std::string_view, Error& ec) override { ec.clear(); }
  void unwatch(std::string_view) noexcept override {}
  LockInfo status(std::string_view name, Error& ec) override;
  std::string url() const override { return cfg_.redacted_url; }
  std::uint64_t round_trips() const noexcept override { return round_trips_->count(); }
  // Revoke (zk_revoke.cpp).
  Revoked revoke(std::string_view name, std::string_view note, Millis note_life, Error& ec) override;
  std::optional<std::string> revoke_note(std::string_view name, Error& ec) override;
  // Prefix watch (zk_watch.cpp): a session of its own, one-shot watches re-armed on each trigger.
  std::unique_ptr<PrefixWatch> watch_prefix(std::string_view prefix, LockEventSink& sink, Error& ec) override;

  // Records and listing (RecordsBackend forwards them): zk_records.cpp.
  zk::Records& records() noexcept override { return records_; }
  // The lock calls run the queue recipe (engine/queue_recipe.hpp) over this store
  // (zk_queue.cpp).
  QueueRecipe& recipe() noexcept override { return recipe_; }

  ZkStats stats() const {
    ZkStats st;
    st.watch_events = watch_events_.load();
    st.sessions = sessions_.load();
    st.orphans_removed = orphans_removed_.load();
    st.renew_syncs = renew_syncs_.load();
    st.renew_reads = renew_reads_.load();
    st.status_reads = status_reads_.load();
    st.session_timeout_ms = negotiated_ms_.load();
    LockGuard lk(recipe_.mutex());
    if (session_ && session_->zh) {
      if (const clientid_t* id = zoo_client_id(session_->zh.get())) {
        st.session_id = id->client_id;
        st.session_password.assign(id->passwd, sizeof id->passwd);
      }
    }
    return st;
  }

  // Called by the C client's completion thread.
  void on_session_event(zhandle_t* zh, Session& s, int state) noexcept;
  void on_node_event(int type, const char* path) noexcept;
  void on_held_node_event(Session& s, const char* path) noexcept;

 private:
  // QueueStore (zk_queue.cpp).
  bool admit(const AcquireRequest& req, Clock::time_point started, Error& ec) override;
  QueueEntryPtr new_entry(const AcquireRequest& req, Error& ec) override;
  bool live(const QueueEntry& e) const override DISTLOCK_REQUIRES(recipe_.mutex());
  QueuePosition enqueue(QueueEntry& e, const AcquireRequest& req, Clock::time_point started,
                        Error& ec) override;
  std::optional<Millis> grant(QueueEntry& e, const QueuePosition& pos) override
      DISTLOCK_REQUIRES(recipe_.mutex());
  Watch watch_predecessor(QueueEntry& e, Clock::time_point started, Error& ec) override;
  Deleted delete_place(QueueEntry& e, Error& ec) override;
  void confirm(std::span<QueueEntry* const> entries, std::span<RenewStatus> out, Clock::time_point sent,
               Error& ec) override;
  void confirmed(QueueEntry& e, Clock::time_point sent) override DISTLOCK_REQUIRES(recipe_.mutex());
  void orphans_waiting() noexcept override;
  std::string revoke_note_path(std::string_view name) const;
  std::string delay_path(std::string_view name) const;
  // The entry's node (czxid my_czxid) is first: settles the lock-delay marker. first: it may
  // be granted (its own marker written when req.lock_delay > 0); held_back: a lost holder's
  // delay runs (pos.holder_ttl: the time left); again; failed.
  QueuePosition::Kind settle_delay(Entry& entry, const AcquireRequest& req, std::uint64_t my_czxid,
                                   zhandle_t* zh, SteadyTime deadline, QueuePosition& pos, Error& ec);
  // Whether the queue's first node (czxid `first_czxid`) holds the lock, given the lock dir's
  // children `children`: not while a lost holder's lock-delay runs (the marker is "lost", or
  // armed naming another node): the first node is then a waiter waiting it out. rc: the
  // marker read's error (ZOK, or a failure: the answer is then true, as without a marker).
  bool first_holds(zhandle_t* zh, std::string_view name, const std::vector<std::string>& children,
                   std::uint64_t first_czxid, SteadyTime deadline, int& rc);
  // delete_place found our node at another version: a revoke's mark. Deleted once our
  // lease would have run out (retry until then); gone when it is not ours.
  Deleted delete_revoked(const Entry& e, const std::shared_ptr<Session>& s, const std::string& path,
                         SteadyTime deadline, Error& ec);

  zk::RecordsEnv records_env() {
    zk::RecordsEnv env;
    env.session = [this](SteadyTime deadline, std::shared_ptr<void>& keep) -> zhandle_t* {
      auto s = usable_session(deadline);
      keep = s;
      return s ? s->zh.get() : nullptr;
    };
    env.node_acl = node_acl();
    env.root_acl = &acls().root_vec;
    env.clock = clock_;
    env.connect_timeout = cfg_.connect_timeout;
    env.command_timeout = cfg_.command_timeout;
    env.url = cfg_.redacted_url;
    return env;
  }
  // Null with ec (backend_unavailable, the detail naming the URL and the cause) when the
  // client library refuses to start a session.
  std::shared_ptr<Session> open_session(Error& ec);
  std::shared_ptr<Session> current_session() const {
    LockGuard lk(recipe_.mutex());
    return session_;
  }
  /// The current session once it is connected (a new one after an expiry), or nullptr
  /// at `deadline`.
  std::shared_ptr<Session> usable_session(SteadyTime deadline) {
    UniqueLock lk(recipe_.mutex());
    wait_until(lk, deadline, [&]() DISTLOCK_REQUIRES(recipe_.mutex()) {
      return stopping_ || (session_ && session_->connected && !session_->expired);
    });
    if (stopping_ || !session_ || !session_->connected || session_->expired) return nullptr;
    return session_;
  }
  Millis session_timeout() const { return Millis(negotiated_ms_.load()); }
  /// cv_.wait_until with a predicate, on the injected clock (whose wait may return
  /// early: loop on its reading). `lk` holds mu_. Returns the predicate's last value.
  template <class Pred>
  bool wait_until(UniqueLock& lk, SteadyTime deadline, Pred pred) DISTLOCK_REQUIRES(recipe_.mutex()) {
    while (!pred()) {
      if (clock_->now() >= deadline) return false;
      clock_->wait_until(cv_, lk.native(), deadline);
    }
    return true;
  }
  const ACL_vector* node_acl() const {
    return cfg_.credentials.empty() ? &ZOO_OPEN_ACL_UNSAFE : &acls().creator_read_vec;
  }
  /// Creates /distlock and the lock directory if missing; the directory's outcome in `rc`.
  void ensure_dirs(zhandle_t* zh, const std::string& dir, SteadyTime deadline, int& rc);
  /// The error for ZooKeeper code `rc` of step `what`, naming the step, the server and the cause.
  Error fail(int rc, const std::string& what, std::string_view name);

  /// Records a session event under mu_. Returns the new negotiated timeout (ms) when
  /// this connection changed it (the old one in `before`), else 0.
  int record_session_event(zhandle_t* zh, Session& s, int state, int& before) noexcept
      DISTLOCK_REQUIRES(recipe_.mutex());
  void keeper_main();
  void replace_expired_session();

  Config cfg_;
  // Every session's requests, its prefix watches' included (engine/round_trips.hpp);
  // shared with those watches, which own their sessions apart from the backend's.
  const std::shared_ptr<RoundTrips> round_trips_ = std::make_shared<RoundTrips>();
  Logger log_;
  const std::shared_ptr<Clock> clock_;
  // The entries (one per acquisition node) and the orphans (nodes of abandoned
  // attempts) live in the recipe; its mutex guards the sessions as well.
  QueueRecipe recipe_;
  std::atomic<std::uint64_t> attempts_{0};
  std::atomic<std::uint64_t> next_generation_{1};
  std::atomic<int> negotiated_ms_{0};
  std::atomic<std::uint64_t> watch_events_{0}, sessions_{0}, orphans_removed_{0}, renew_syncs_{0},
      renew_reads_{0}, status_reads_{0};

  std::condition_variable cv_;  // session state changes and keeper work
  std::shared_ptr<Session> session_ DISTLOCK_GUARDED_BY(recipe_.mutex());
  SteadyTime orphan_retry_at_ DISTLOCK_GUARDED_BY(recipe_.mutex()){};
  bool stopping_ DISTLOCK_GUARDED_BY(recipe_.mutex()) = false;
  std::thread keeper_;
  zk::Records records_;
};

}  // namespace distlock::detail::zk
