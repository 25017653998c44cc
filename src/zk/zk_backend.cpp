#include "zk/zk_backend.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/log.hpp"
#include "zk/zk_call.hpp"
#include "zk/zk_names.hpp"
#include "zk/zk_records.hpp"
#include "zk/zk_url.hpp"

namespace distlock::detail {

namespace {

// Every deadline is taken on the client's injected clock (ClientOptions::clock), the
// one the engine counts lease validity on; tests run it on a manual clock.
using SteadyTime = Clock::time_point;

// Rounds of create / list / watch one try_acquire may go through when nodes come and
// go under it (predecessor vanished between list and watch, parent removed, ...).
constexpr int kMaxRounds = 16;

// The C client's own log lines (connection refused, reconnecting, ...) are noise for
// a library user; DISTLOCK_ZK_LOG=1 shows them for debugging.
void zk_log_line(const char* message) {
  static const bool enabled = [] {
    const char* v = std::getenv("DISTLOCK_ZK_LOG");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  if (enabled) std::fprintf(stderr, "zookeeper: %s\n", message);
}

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

const Acls& acls() {
  static const Acls instance;
  return instance;
}

std::string key_of(std::string_view name, std::string_view owner) {
  std::string k;
  k.reserve(name.size() + owner.size() + 1);
  k.append(name);
  k.push_back('\0');
  k.append(owner);
  return k;
}

}  // namespace

class ZkBackend;

namespace {

// One ZooKeeper session; it is the session watcher's context. The handle is the last
// member, so it is destroyed first: closing the session joins the C client's threads
// before the fields its watcher writes go away.
struct Session {
  ZkBackend* backend = nullptr;
  std::uint64_t gen = 0;
  // Guarded by ZkBackend::mu_.
  bool connected = false;
  bool ever_connected = false;
  bool reconnected = false;  // connected again after a disconnection: nudge waiters
  bool expired = false;      // expired or auth failed: the keeper opens a new session
  bool auth_sent = false;
  zk::Handle zh;

  std::uint64_t generation() const noexcept { return gen; }
};

void session_watcher(zhandle_t* zh, int type, int state, const char* path, void* ctx);
void node_watcher(zhandle_t* zh, int type, int state, const char* path, void* ctx);

}  // namespace

class ZkBackend final : public Backend {
 public:
  using Config = zk::UrlConfig;

  ZkBackend(Config cfg, const ClientOptions& opts)
      : cfg_(std::move(cfg)),
        log_(opts.logger),
        clock_(opts.clock ? opts.clock : system_steady_clock()),
        records_(records_env()) {}

  ~ZkBackend() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (keeper_.joinable()) keeper_.join();
    std::shared_ptr<Session> last;
    {
      std::lock_guard lk(mu_);
      last = std::move(session_);
    }
    last.reset();  // closes the session: the server drops our ephemeral nodes at once
  }

  /// Opens the first session and waits for it; checks the chroot.
  std::error_code start(std::string& why) {
    auto s = open_session(why);
    if (!s) return make_error_code(errc::backend_unavailable);
    {
      std::lock_guard lk(mu_);
      session_ = s;
    }
    const SteadyTime deadline = clock_->now() + cfg_.connect_timeout;
    {
      std::unique_lock lk(mu_);
      wait_until(lk, deadline, [&] { return s->connected || s->expired; });
      if (s->expired) {
        why = "ZooKeeper at " + cfg_.redacted_url + " refused the session (authentication failed)";
        return make_error_code(errc::auth_failed);
      }
      if (!s->connected) {
        why = "no ZooKeeper server of " + cfg_.redacted_url + " answered within " +
              std::to_string(cfg_.connect_timeout.count()) + "ms";
        return make_error_code(errc::backend_unavailable);
      }
    }
    negotiated_ms_.store(zoo_recv_timeout(s->zh.get()));
    if (!cfg_.chroot.empty() && cfg_.chroot != "/") {
      // With a chroot, "/" is the chroot node itself.
      auto r = zk::submit_exists(s->zh.get(), "/");
      const int rc = zk::await(r, *clock_, clock_->now() + cfg_.command_timeout);
      if (rc == ZNONODE) {
        why = "chroot \"" + cfg_.chroot + "\" of " + cfg_.redacted_url +
              " does not exist on the ZooKeeper server (create it first, e.g. zkCli.sh create " +
              cfg_.chroot + ")";
        return make_error_code(errc::invalid_argument);
      }
      if (rc != ZOK) {
        why = "checking chroot \"" + cfg_.chroot + "\" of " + cfg_.redacted_url +
              " failed: " + zk::describe(rc);
        return make_error_code(zk::is_transient(rc) ? errc::backend_unavailable : errc::protocol_error);
      }
    }
    keeper_ = std::thread([this] { keeper_main(); });
    return {};
  }

  Capabilities capabilities() const noexcept override { return {true, true}; }
  void set_listener(ChangeListener* listener) override { listener_.store(listener); }

  AcquireResult try_acquire(const AcquireRequest& req, std::error_code& ec) override;
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override;
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) override;
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        std::error_code& ec) override;
  // Waiting is driven by the predecessor watch each queued try_acquire leaves (set
  // atomically with the check, so nothing between the check and the wait is missed).
  void watch(std::string_view, std::error_code& ec) override { ec.clear(); }
  void unwatch(std::string_view) noexcept override {}
  LockInfo status(std::string_view name, std::error_code& ec) override;
  std::string url() const override { return cfg_.redacted_url; }

  // Records and listing: zk_records.cpp.
  std::string put_record(std::string_view key, std::string_view value, PutMode mode,
                         std::error_code& ec) override {
    return records_.put(key, value, mode, ec);
  }
  std::optional<std::string> get_record(std::string_view key, std::error_code& ec) override {
    return records_.get(key, ec);
  }
  bool erase_record(std::string_view key, std::error_code& ec) override { return records_.erase(key, ec); }
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    std::error_code& ec) override {
    return records_.list_held(prefix, limit, truncated, ec);
  }

  ZkStats stats() const {
    ZkStats st;
    st.watch_events = watch_events_.load();
    st.sessions = sessions_.load();
    st.orphans_removed = orphans_removed_.load();
    st.renew_syncs = renew_syncs_.load();
    st.session_timeout_ms = negotiated_ms_.load();
    std::lock_guard lk(mu_);
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

 private:
  // What this client has on the server for one (name, owner).
  struct Entry {
    std::string name, owner;
    std::uint64_t generation = 0;  // session the node belongs to
    std::string guid;              // of the current attempt
    std::string node;              // child name, empty when none (or unknown)
    std::int64_t czxid = 0;
    int version = 0;
    bool held = false;
    bool uncertain = false;    // a create whose answer was lost: find it by guid
    SteadyTime valid_until{};  // held: last confirmation's send time + session timeout
  };
  // A node of an abandoned attempt, to delete once connected (same session only).
  struct Orphan {
    std::string dir, guid;
    std::uint64_t generation = 0;
  };

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
  std::shared_ptr<Session> open_session(std::string& why);
  std::shared_ptr<Session> current_session() const {
    std::lock_guard lk(mu_);
    return session_;
  }
  /// The current session once it is connected (a new one after an expiry), or nullptr
  /// at `deadline`.
  std::shared_ptr<Session> usable_session(SteadyTime deadline) {
    std::unique_lock lk(mu_);
    wait_until(lk, deadline,
               [&] { return stopping_ || (session_ && session_->connected && !session_->expired); });
    if (stopping_ || !session_ || !session_->connected || session_->expired) return nullptr;
    return session_;
  }
  Millis session_timeout() const { return Millis(negotiated_ms_.load()); }
  /// cv_.wait_until with a predicate, on the injected clock (whose wait may return
  /// early: loop on its reading). `lk` holds mu_. Returns the predicate's last value.
  template <class Pred>
  bool wait_until(std::unique_lock<std::mutex>& lk, SteadyTime deadline, Pred pred) {
    while (!pred()) {
      if (clock_->now() >= deadline) return false;
      clock_->wait_until(cv_, lk, deadline);
    }
    return true;
  }
  const ACL_vector* node_acl() const {
    return cfg_.credentials.empty() ? &ZOO_OPEN_ACL_UNSAFE : &acls().creator_read_vec;
  }
  /// Creates /distlock and the lock directory if missing; the directory's outcome in `rc`.
  void ensure_dirs(zhandle_t* zh, const std::string& dir, SteadyTime deadline, int& rc);
  void add_orphan(std::string dir, std::string guid, std::uint64_t generation);
  void delete_or_orphan(const std::shared_ptr<Session>& s, const Entry& e) noexcept;
  std::error_code fail(int rc, const std::string& what, std::string_view name);

  void keeper_main();
  void replace_expired_session();
  void sweep_orphans(const std::shared_ptr<Session>& s, std::vector<Orphan> orphans);

  Config cfg_;
  Logger log_;
  const std::shared_ptr<Clock> clock_;
  std::atomic<ChangeListener*> listener_{nullptr};
  std::atomic<std::uint64_t> attempts_{0};
  std::atomic<std::uint64_t> next_generation_{1};
  std::atomic<int> negotiated_ms_{0};
  std::atomic<std::uint64_t> watch_events_{0}, sessions_{0}, orphans_removed_{0}, renew_syncs_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;            // session state changes and keeper work
  std::shared_ptr<Session> session_;      // guarded by mu_
  std::map<std::string, Entry> entries_;  // guarded by mu_; key: name '\0' owner
  std::vector<Orphan> orphans_;           // guarded by mu_
  SteadyTime orphan_retry_at_{};          // guarded by mu_
  bool stopping_ = false;                 // guarded by mu_
  std::thread keeper_;
  zk::Records records_;
};

namespace {

void session_watcher(zhandle_t* zh, int type, int state, const char*, void* ctx) {
  if (type != ZOO_SESSION_EVENT || ctx == nullptr) return;
  auto* s = static_cast<Session*>(ctx);
  s->backend->on_session_event(zh, *s, state);
}

void node_watcher(zhandle_t*, int type, int, const char* path, void* ctx) {
  if (ctx == nullptr || type == ZOO_SESSION_EVENT || type == ZOO_NOTWATCHING_EVENT) return;
  static_cast<ZkBackend*>(ctx)->on_node_event(type, path);
}

}  // namespace

std::shared_ptr<Session> ZkBackend::open_session(std::string& why) {
  auto s = std::make_shared<Session>();
  s->backend = this;
  s->gen = next_generation_.fetch_add(1);
  errno = 0;
  s->zh.reset(zookeeper_init2(cfg_.connect_string.c_str(), &session_watcher,
                              static_cast<int>(cfg_.session_timeout.count()), nullptr, s.get(), 0,
                              &zk_log_line));
  if (!s->zh) {
    const int err = errno;
    why = "cannot start a ZooKeeper session for " + cfg_.redacted_url + ": " +
          (err == EINVAL ? std::string("a host name does not resolve or the host list is malformed")
                         : std::string(std::strerror(err)));
    return nullptr;
  }
  sessions_.fetch_add(1);
  return s;
}

void ZkBackend::on_session_event(zhandle_t* zh, Session& s, int state) noexcept {
  // Recorded on the session itself (current or not yet published), so a CONNECTED
  // event that arrives before the session is installed is not lost.
  std::lock_guard lk(mu_);
  if (state == ZOO_CONNECTED_STATE && !s.auth_sent && !cfg_.credentials.empty()) {
    // The C client accepts credentials only on a live handle (not between connection
    // attempts), so they are added on the first connection, before the session counts
    // as usable: they reach the server ahead of any of our requests, and the client
    // re-sends them after every reconnect.
    try {
      zk::submit_auth(zh, cfg_.credentials);
    } catch (...) {
    }
    s.auth_sent = true;
  }
  if (state == ZOO_CONNECTED_STATE) {
    if (s.ever_connected && !s.connected) s.reconnected = true;
    s.connected = true;
    s.ever_connected = true;
  } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
    s.connected = false;
    s.expired = true;
  } else {
    // CONNECTING / ASSOCIATING / NOTCONNECTED: ownership is uncertain until we hear from
    // the ensemble again; the engine's local deadline takes care of owns().
    s.connected = false;
  }
  cv_.notify_all();
}

void ZkBackend::on_node_event(int type, const char* path) noexcept {
  if (path == nullptr) return;
  if (type == ZOO_DELETED_EVENT) watch_events_.fetch_add(1);
  auto name = zk::name_of_node_path(path);
  ChangeListener* l = listener_.load();
  if (name && l != nullptr) l->on_change(*name);
}

void ZkBackend::add_orphan(std::string dir, std::string guid, std::uint64_t generation) {
  std::lock_guard lk(mu_);
  orphans_.push_back(Orphan{std::move(dir), std::move(guid), generation});
  cv_.notify_all();
}

void ZkBackend::delete_or_orphan(const std::shared_ptr<Session>& s, const Entry& e) noexcept {
  try {
    const std::string dir = zk::lock_dir(e.name);
    if (!e.node.empty() && s && s->generation() == e.generation) {
      auto r = zk::submit_delete(s->zh.get(), dir + "/" + e.node, e.version);
      const int rc = zk::await(r, *clock_, clock_->now() + cfg_.command_timeout);
      if (rc == ZOK || rc == ZNONODE || rc == ZBADVERSION) return;
      log_.log(LogLevel::debug, "zk: deleting {}/{} failed ({}); retried after reconnect", dir, e.node,
               zk::describe(rc));
    }
    if (!e.guid.empty() && (!e.node.empty() || e.uncertain)) add_orphan(dir, e.guid, e.generation);
  } catch (...) {
    log_.log(LogLevel::warning, "zk: could not schedule clean-up of lock \"{}\"", e.name);
  }
}

std::error_code ZkBackend::fail(int rc, const std::string& what, std::string_view name) {
  if (rc == ZNOAUTH || rc == ZAUTHFAILED) {
    log_.log(LogLevel::warning,
             "zk: {} for lock \"{}\" was denied: {}; the credentials of {} are not allowed to use this lock "
             "(wrong user or password?)",
             what, name, zk::describe(rc), cfg_.redacted_url);
    return make_error_code(errc::auth_failed);
  }
  if (zk::is_transient(rc)) {
    log_.log(LogLevel::warning, "zk: {} for lock \"{}\" failed: {} ({})", what, name, zk::describe(rc),
             cfg_.redacted_url);
    return make_error_code(errc::backend_unavailable);
  }
  log_.log(LogLevel::warning, "zk: {} for lock \"{}\" failed: {}", what, name, zk::describe(rc));
  return make_error_code(rc == ZBADARGUMENTS ? errc::invalid_argument : errc::protocol_error);
}

void ZkBackend::ensure_dirs(zhandle_t* zh, const std::string& dir, SteadyTime deadline, int& rc) {
  // Pipelined: root (persistent), then the lock directory (a container, so the server
  // deletes it once its last lock node is gone). "Already exists" is success.
  auto root = zk::submit_create(zh, std::string(zk::kRoot), {}, &acls().root_vec, ZOO_PERSISTENT);
  root->undo_if_abandoned = false;
  auto leaf = zk::submit_create(zh, dir, {}, node_acl(), ZOO_CONTAINER);
  leaf->undo_if_abandoned = false;
  rc = zk::await(root, *clock_, deadline);
  if (rc != ZOK && rc != ZNODEEXISTS) return;
  rc = zk::await(leaf, *clock_, deadline);
  if (rc == ZUNIMPLEMENTED || rc == ZBADARGUMENTS) {
    // A server without container nodes (< 3.5.3): a persistent directory instead.
    auto plain = zk::submit_create(zh, dir, {}, node_acl(), ZOO_PERSISTENT);
    plain->undo_if_abandoned = false;
    rc = zk::await(plain, *clock_, deadline);
  }
  if (rc == ZNODEEXISTS) rc = ZOK;
}

AcquireResult ZkBackend::try_acquire(const AcquireRequest& req, std::error_code& ec) {
  ec.clear();
  const SteadyTime budget_end = clock_->now() + cfg_.connect_timeout + cfg_.command_timeout;
  const std::string key = key_of(req.name, req.owner);
  const std::string dir = zk::lock_dir(req.name);
  const std::string name(req.name);

  auto s = usable_session(budget_end);
  if (!s) {
    ec = fail(zk::kTimedOut, "waiting for a ZooKeeper connection", name);
    return {};
  }
  // The lease lives as long as the session; the engine renews every ttl/3 (at most
  // ttl/2) and must do so well within the session timeout.
  if (session_timeout().count() > 0 && req.ttl > 2 * session_timeout()) {
    std::string why =
        "ttl " + std::to_string(req.ttl.count()) + "ms is more than twice the ZooKeeper session timeout " +
        std::to_string(session_timeout().count()) + "ms (" +
        (cfg_.session_timeout_from_url ? "session_timeout="
                                       : "requested from the client's lock_defaults.ttl: ") +
        std::to_string(cfg_.session_timeout.count()) + "ms, negotiated by the server " + cfg_.redacted_url +
        " as " + std::to_string(session_timeout().count()) +
        "ms); a zk:// lease lasts as long as its session, so it could not be renewed in time. Use a ttl "
        "of at most " +
        std::to_string((2 * session_timeout()).count()) +
        "ms, or ask for a longer session with "
        "session_timeout= in the URL (the server grants between its minSessionTimeout and "
        "maxSessionTimeout, by default 2 and 20 times its tickTime)";
    log_.log(LogLevel::warning, "zk: lock \"{}\": {}", name, why);
    set_error_detail(std::move(why));
    ec = make_error_code(errc::invalid_argument);
    return {};
  }

  Entry e;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) e = it->second;
  }
  e.name = name;
  e.owner = std::string(req.owner);
  if (e.generation != s->generation()) {
    e = Entry{name, e.owner};
    e.generation = s->generation();
  }
  if (e.held) {
    // The engine asks again, so it no longer counts this lease as held (its local
    // deadline passed): give the old node up and queue afresh with a new token.
    delete_or_orphan(s, e);
    e = Entry{name, e.owner};
    e.generation = s->generation();
  }

  auto store = [&] {
    std::lock_guard lk(mu_);
    entries_[key] = e;
  };
  auto forget = [&] {
    std::lock_guard lk(mu_);
    entries_.erase(key);
  };
  // Ours: the lease counts from the send time of the request that showed it.
  auto owned = [&](SteadyTime sent) {
    e.held = true;
    e.valid_until = sent + session_timeout();
    store();
    AcquireResult res;
    res.acquired = true;
    res.token = static_cast<std::uint64_t>(e.czxid);
    res.validity = session_timeout();
    return res;
  };
  // A transient failure: wait (bounded) for the connection to come back; a new session
  // means our nodes are gone, so start over in it. A request that got no answer within
  // the command timeout ends the attempt: the server counts as unavailable, and
  // retrying on a connection the client still believes alive would only pile up
  // requests behind the silent one.
  auto recover = [&](int rc, const char* what) -> bool {
    s = rc == zk::kTimedOut ? nullptr : usable_session(budget_end);
    if (!s) {
      delete_or_orphan(current_session(), e);
      forget();
      ec = fail(rc, what, name);
      return false;
    }
    if (s->generation() != e.generation) {
      e = Entry{name, e.owner};
      e.generation = s->generation();
    }
    return true;
  };

  for (int round = 0; round < kMaxRounds; ++round) {
    zhandle_t* zh = s->zh.get();
    const SteadyTime deadline = std::min(budget_end, clock_->now() + cfg_.command_timeout);
    const SteadyTime sent = clock_->now();
    zk::ReplyPtr created, listed;
    if (e.node.empty() && !e.uncertain && !req.keep_queued) {
      // One attempt only: a non-empty queue means busy, no need to write anything.
      listed = zk::submit_children(zh, dir);
      const int rc = zk::await(listed, *clock_, deadline);
      if (rc == ZOK && !zk::queue_order(listed->children).empty()) {
        forget();
        return {};
      }
      if (rc != ZOK && rc != ZNONODE) {
        if (zk::is_transient(rc) && recover(rc, "listing the queue")) continue;
        ec = fail(rc, "listing the queue", name);
        forget();
        return {};
      }
    }
    if (e.node.empty() && !e.uncertain) {
      e.guid = zk::make_guid(req.owner, attempts_.fetch_add(1));
      // Create our node and touch the directory in one transaction: the directory's
      // Stat tells whether anybody else is queued (uncontended: one round trip, no
      // listing), and its mzxid is the transaction's zxid, i.e. our node's czxid.
      created = zk::submit_create_and_touch(zh, dir + "/" + e.guid + std::string(zk::kLockMarker), req.owner,
                                            node_acl(), ZOO_EPHEMERAL_SEQUENTIAL, dir);
      listed.reset();
      const int rc = zk::await(created, *clock_, deadline);
      if (rc == ZNONODE) {
        int dir_rc = ZOK;
        ensure_dirs(zh, dir, deadline, dir_rc);
        if (dir_rc == ZOK) continue;
        if (zk::is_transient(dir_rc) && recover(dir_rc, "creating the lock directory")) continue;
        ec = fail(dir_rc, "creating the lock directory " + dir, name);
        forget();
        return {};
      }
      if (rc == zk::kTimedOut) {
        // Still in flight: its completion deletes the node if it lands; the keeper also
        // looks for it by guid. Retry with a new guid.
        add_orphan(dir, e.guid, e.generation);
        e.node.clear();
        e.guid.clear();
        if (recover(rc, "creating the lock node")) continue;
        return {};
      }
      if (zk::is_transient(rc)) {
        // The create may or may not have been applied: find it by guid once reconnected.
        e.uncertain = true;
        if (recover(rc, "creating the lock node")) continue;
        return {};
      }
      if (rc != ZOK) {
        ec = fail(rc, "creating a lock node under " + dir, name);
        forget();
        return {};
      }
      e.node = created->value.substr(created->value.rfind('/') + 1);
      e.czxid = created->stat.mzxid;  // the directory's Stat: same transaction, same zxid
      e.version = 0;                  // a new node
      if (created->stat.numChildren == 1) {
        return owned(sent);
      }
    }

    if (!listed || e.uncertain) {
      listed = zk::submit_children(zh, dir);
    }
    int rc = zk::await(listed, *clock_, deadline);
    if (rc == ZNONODE) rc = ZOK;  // directory gone: our node is not there either
    if (rc != ZOK) {
      if (zk::is_transient(rc) && recover(rc, "listing the queue")) continue;
      ec = fail(rc, "listing the queue", name);
      delete_or_orphan(s, e);
      forget();
      return {};
    }
    const std::vector<zk::LockNode> queue = zk::queue_order(listed->children);
    if (e.uncertain) {
      e.uncertain = false;
      auto mine =
          std::find_if(queue.begin(), queue.end(), [&](const zk::LockNode& n) { return n.guid == e.guid; });
      if (mine == queue.end()) {
        e.node.clear();  // the lost create was never applied: create again
        continue;
      }
      // Adopt the node the lost create made; its czxid comes with its Stat.
      auto st = zk::submit_exists(zh, dir + "/" + mine->node);
      const int src = zk::await(st, *clock_, deadline);
      if (src != ZOK) {
        e.node.clear();
        if (src != ZNONODE) add_orphan(dir, e.guid, e.generation);
        continue;
      }
      e.node = mine->node;
      e.czxid = st->stat.czxid;
      e.version = st->stat.version;
      continue;  // list again with the adopted node known
    }
    auto me =
        std::find_if(queue.begin(), queue.end(), [&](const zk::LockNode& n) { return n.node == e.node; });
    if (me == queue.end()) {
      // Our node was deleted from outside (or the directory went away): queue again.
      e.node.clear();
      continue;
    }
    if (me == queue.begin()) {
      return owned(sent);
    }
    if (!req.keep_queued) {
      delete_or_orphan(s, e);
      forget();
      return {};
    }
    // Queued: watch only the immediate predecessor (no herd). If it is already gone
    // the exists call says so and we look again.
    const std::string predecessor = dir + "/" + std::prev(me)->node;
    auto w = zk::submit_exists(zh, predecessor, &node_watcher, this);
    const int wrc = zk::await(w, *clock_, deadline);
    if (wrc == ZNONODE) continue;
    if (wrc != ZOK) {
      if (zk::is_transient(wrc) && recover(wrc, "watching the predecessor")) continue;
      ec = fail(wrc, "watching the predecessor", name);
      delete_or_orphan(s, e);
      forget();
      return {};
    }
    store();
    return {};  // busy; the watch calls on_change(name) when the predecessor goes
  }
  // The queue kept changing under us; report busy and let the engine come back.
  if (req.keep_queued) {
    store();
  } else {
    delete_or_orphan(s, e);
    forget();
  }
  return {};
}

void ZkBackend::cancel_acquire(std::string_view name, std::string_view owner) noexcept {
  try {
    Entry e;
    {
      std::lock_guard lk(mu_);
      auto it = entries_.find(key_of(name, owner));
      if (it == entries_.end()) return;
      e = it->second;
      entries_.erase(it);
    }
    delete_or_orphan(current_session(), e);
  } catch (...) {
    log_.log(LogLevel::warning, "zk: cancelling the wait for lock \"{}\" failed", name);
  }
}

void ZkBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) {
  ec.clear();
  auto s = current_session();
  {
    std::lock_guard lk(mu_);
    if (!s || !s->connected) {
      ec = make_error_code(errc::backend_unavailable);
      return;
    }
  }
  // One round trip from here: a sync, then an exists per lease, all in flight at once.
  // The sync makes the server we are connected to catch up with the leader before it
  // answers the reads behind it (per-session FIFO), so a lagging or partitioned
  // follower cannot confirm a node the leader has already deleted: it either answers
  // with the leader's state or not at all (failed: the local deadline decides).
  zk::ReplyPtr synced;
  std::vector<zk::ReplyPtr> replies(items.size());
  std::vector<std::string> keys(items.size());
  const SteadyTime sent = clock_->now();
  {
    std::vector<std::string> paths(items.size());
    {
      std::lock_guard lk(mu_);
      for (std::size_t i = 0; i < items.size(); ++i) {
        keys[i] = key_of(items[i].name, items[i].owner);
        auto it = entries_.find(keys[i]);
        if (it == entries_.end() || !it->second.held || it->second.generation != s->generation() ||
            static_cast<std::uint64_t>(it->second.czxid) != items[i].token) {
          out[i] = RenewStatus::not_owner;
          continue;
        }
        paths[i] = zk::lock_dir(items[i].name) + "/" + it->second.node;
      }
    }
    // The path of a sync only names the server's tree; "/" (the chroot) always exists.
    if (std::any_of(paths.begin(), paths.end(), [](const std::string& p) { return !p.empty(); })) {
      synced = zk::submit_sync(s->zh.get(), "/");
      renew_syncs_.fetch_add(1);
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!paths[i].empty()) replies[i] = zk::submit_exists(s->zh.get(), paths[i]);
    }
  }
  const SteadyTime deadline = sent + cfg_.command_timeout;
  const clientid_t* id = zoo_client_id(s->zh.get());
  const std::int64_t session_id = id != nullptr ? id->client_id : 0;
  const int sync_rc = synced ? zk::await(synced, *clock_, deadline) : ZOK;
  std::vector<int> codes(items.size(), ZOK);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!replies[i]) continue;
    codes[i] = zk::await(replies[i], *clock_, deadline);
    // Without a completed sync the answer may be a follower's stale view: unknown.
    if (sync_rc != ZOK) codes[i] = zk::kTimedOut;
  }
  if (sync_rc != ZOK) {
    log_.log(LogLevel::debug, "zk: renewal sync with the leader failed: {}", zk::describe(sync_rc));
  }
  std::lock_guard lk(mu_);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!replies[i]) continue;
    const int rc = codes[i];
    if (rc == ZOK && replies[i]->stat.ephemeralOwner == session_id &&
        static_cast<std::uint64_t>(replies[i]->stat.czxid) == items[i].token) {
      out[i] = RenewStatus::renewed;
      auto it = entries_.find(keys[i]);
      if (it != entries_.end() && it->second.held) it->second.valid_until = sent + session_timeout();
    } else if (rc == ZOK || rc == ZNONODE) {
      out[i] = RenewStatus::not_owner;
      entries_.erase(keys[i]);
    } else {
      out[i] = RenewStatus::failed;
    }
  }
}

ReleaseStatus ZkBackend::release(std::string_view name, std::string_view owner, std::uint64_t token,
                                 std::error_code& ec) {
  ec.clear();
  Entry e;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key_of(name, owner));
    if (it == entries_.end()) return ReleaseStatus::not_owner;
    if (!it->second.held || static_cast<std::uint64_t>(it->second.czxid) != token) {
      return ReleaseStatus::not_owner;
    }
    e = it->second;
    entries_.erase(it);
  }
  auto s = current_session();
  if (!s || s->generation() != e.generation) return ReleaseStatus::not_owner;  // session ended: node gone
  auto r = zk::submit_delete(s->zh.get(), zk::lock_dir(name) + "/" + e.node, e.version);
  const int rc = zk::await(r, *clock_, clock_->now() + cfg_.command_timeout);
  if (rc == ZOK) return ReleaseStatus::released;
  if (rc == ZNONODE || rc == ZBADVERSION) return ReleaseStatus::not_owner;
  if (zk::is_transient(rc)) {
    // Still ours while the session lives: delete it as soon as we are connected again.
    add_orphan(zk::lock_dir(name), e.guid, e.generation);
  }
  ec = fail(rc, "deleting the lock node", name);
  return ReleaseStatus::released;
}

LockInfo ZkBackend::status(std::string_view name, std::error_code& ec) {
  ec.clear();
  auto s = usable_session(clock_->now() + cfg_.connect_timeout);
  if (!s) {
    ec = fail(zk::kTimedOut, "waiting for a ZooKeeper connection", name);
    return {};
  }
  const std::string dir = zk::lock_dir(name);
  for (int round = 0; round < 4; ++round) {
    const SteadyTime deadline = clock_->now() + cfg_.command_timeout;
    auto listed = zk::submit_children(s->zh.get(), dir);
    const int rc = zk::await(listed, *clock_, deadline);
    LockInfo info;
    info.waiters = 0;
    if (rc == ZNONODE) return info;
    if (rc != ZOK) {
      ec = fail(rc, "listing the queue", name);
      return {};
    }
    const auto queue = zk::queue_order(listed->children);
    if (queue.empty()) return info;
    auto st = zk::submit_exists(s->zh.get(), dir + "/" + queue.front().node);
    const int src = zk::await(st, *clock_, deadline);
    if (src == ZNONODE) continue;  // released meanwhile: look again
    if (src != ZOK) {
      ec = fail(src, "reading the holder's node", name);
      return {};
    }
    info.held = true;
    info.token = static_cast<std::uint64_t>(st->stat.czxid);
    if (auto owner = zk::owner_of_guid(queue.front().guid)) info.holder = *owner;
    info.waiters = queue.size() - 1;
    return info;  // ttl_remaining stays unknown: the holder's session decides
  }
  ec = make_error_code(errc::backend_unavailable);
  return {};
}

void ZkBackend::keeper_main() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    const SteadyTime soon = clock_->now() + std::chrono::milliseconds(10);
    SteadyTime wake = clock_->now() + std::chrono::seconds(1);
    if (session_ && session_->connected) {  // both jobs need the connection
      for (const auto& [k, e] : entries_) {
        if (e.held) wake = std::min(wake, std::max(e.valid_until, soon));
      }
      if (!orphans_.empty()) wake = std::min(wake, std::max(orphan_retry_at_, soon));
    }
    wait_until(lk, wake, [&] {
      return stopping_ || (session_ && (session_->expired || session_->reconnected)) ||
             (session_ && session_->connected && !orphans_.empty() && clock_->now() >= orphan_retry_at_);
    });
    if (stopping_) break;
    if (session_ && session_->expired) {
      lk.unlock();
      replace_expired_session();
      lk.lock();
      continue;
    }
    std::vector<std::string> nudge;
    if (session_ && session_->reconnected) {
      // Back within the session: our nodes and watches survived, but a predecessor may
      // have gone while we were away; let every waiter look again.
      session_->reconnected = false;
      for (const auto& [k, e] : entries_) {
        if (!e.held) nudge.push_back(e.name);
      }
    }
    // Leases past their validity: the engine has already declared them lost (its
    // deadline is earlier); free the node so others are not blocked by a lease nobody uses.
    std::vector<Entry> stale;
    const SteadyTime now = clock_->now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.held && it->second.valid_until <= now && session_ && session_->connected) {
        stale.push_back(it->second);
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    std::vector<Orphan> orphans;
    auto s = session_;
    if (s && s->connected && !orphans_.empty() && now >= orphan_retry_at_) orphans.swap(orphans_);
    lk.unlock();
    ChangeListener* l = listener_.load();
    for (const auto& n : nudge) {
      if (l != nullptr) l->on_change(n);
    }
    for (const auto& e : stale) {
      if (l != nullptr) l->on_lease_lost(e.name, e.owner);
      delete_or_orphan(s, e);
    }
    if (!orphans.empty()) sweep_orphans(s, std::move(orphans));
    s.reset();  // never the last reference under mu_ (closing calls the session watcher)
    lk.lock();
  }
}

void ZkBackend::sweep_orphans(const std::shared_ptr<Session>& s, std::vector<Orphan> orphans) {
  std::vector<Orphan> retry;
  for (auto& o : orphans) {
    if (o.generation != s->generation()) continue;  // that session is gone, and its nodes with it
    const SteadyTime deadline = clock_->now() + cfg_.command_timeout;
    auto listed = zk::submit_children(s->zh.get(), o.dir);
    int rc = zk::await(listed, *clock_, deadline);
    if (rc == ZNONODE) continue;
    if (rc != ZOK) {
      retry.push_back(std::move(o));
      continue;
    }
    bool ok = true;
    for (const auto& n : zk::queue_order(listed->children)) {
      if (n.guid != o.guid) continue;
      auto d = zk::submit_delete(s->zh.get(), o.dir + "/" + n.node, -1);
      rc = zk::await(d, *clock_, deadline);
      if (rc == ZOK) {
        orphans_removed_.fetch_add(1);
        log_.log(LogLevel::info, "zk: removed node {}/{} of an abandoned attempt", o.dir, n.node);
      } else if (rc != ZNONODE) {
        ok = false;
      }
    }
    if (!ok) retry.push_back(std::move(o));
  }
  std::lock_guard lk(mu_);
  if (!retry.empty()) {
    orphans_.insert(orphans_.end(), std::make_move_iterator(retry.begin()),
                    std::make_move_iterator(retry.end()));
    orphan_retry_at_ = clock_->now() + std::chrono::milliseconds(200);
  }
}

void ZkBackend::replace_expired_session() {
  std::shared_ptr<Session> old;
  std::vector<Entry> lost;
  {
    std::lock_guard lk(mu_);
    if (!session_ || !session_->expired) return;
    old = session_;
    for (auto& [k, e] : entries_) lost.push_back(e);
    entries_.clear();
    orphans_.clear();
  }
  log_.log(LogLevel::warning, "zk: session to {} expired; every lock it held is lost; opening a new session",
           cfg_.redacted_url);
  std::string why;
  auto fresh = open_session(why);
  {
    std::lock_guard lk(mu_);
    if (fresh) {
      session_ = fresh;
    } else {
      log_.log(LogLevel::warning, "zk: {}; retrying", why);
      orphan_retry_at_ = clock_->now() + std::chrono::milliseconds(500);
    }
    cv_.notify_all();
  }
  old.reset();  // zookeeper_close, outside our lock and off the completion thread
  if (!fresh) {
    std::unique_lock lk(mu_);
    wait_until(lk, clock_->now() + std::chrono::milliseconds(500), [&] { return stopping_; });
  }
  ChangeListener* l = listener_.load();
  if (l == nullptr) return;
  for (const auto& e : lost) {
    if (e.held) l->on_lease_lost(e.name, e.owner);
  }
  for (const auto& e : lost) {
    if (!e.held) l->on_change(e.name);
  }
}

std::optional<ZkStats> zk_stats(const Backend& backend) {
  if (const auto* zk = dynamic_cast<const ZkBackend*>(&backend)) return zk->stats();
  return std::nullopt;
}

std::unique_ptr<Backend> make_zk_backend(const Url& url, const ClientOptions& opts, std::error_code& ec,
                                         std::string& why) {
  ZkBackend::Config cfg;
  if ((ec = zk::parse_url(url, opts, cfg, why))) return nullptr;
  auto backend = std::make_unique<ZkBackend>(std::move(cfg), opts);
  if ((ec = backend->start(why))) return nullptr;
  return backend;
}

}  // namespace distlock::detail
