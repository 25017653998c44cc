// The redis+cluster:// backend's private declarations, shared by its files:
// cluster_routing.cpp (the slot map, routing and redirections), cluster_renew.cpp
// (renewal pipelines per node), cluster_queue.cpp (acquire and the wait queue),
// cluster_watch.cpp (watches, the mover thread, the
// masters' configuration check), cluster_prefix_watch.cpp (Client::watch) and cluster_backend.cpp (key
// layout, acquire, release, status, records, listing, factory). Not for use outside src/rediscluster.
#pragma once

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "engine/log.hpp"
#include "engine/thread_annotations.hpp"
#include "redis/connection.hpp"
#include "redis/lock_scripts.hpp"
#include "redis/records.hpp"
#include "redis/redis_backend.hpp"
#include "redis/slots.hpp"
#include "redis/subscriber.hpp"
#include "redis/wait_queue.hpp"
#include "rediscluster/cluster_backend.hpp"

namespace distlock::detail::rediscluster {

using redis::Connection;
using redis::ConnectionOptions;
using redis::ConnectionPool;
using redis::Reply;
using redis::Script;

constexpr std::size_t kSlots = 16384;
// Redirections (MOVED, ASK, TRYAGAIN) followed for one call before giving up: a
// slot moves at most once or twice during one call; more means a map in flux.
constexpr int kMaxAttempts = 6;
constexpr std::size_t kRenewChunk = 1000;
// A node that could not be reached triggers a map refresh at most this often.
constexpr Millis kRefreshOnFailureEvery{500};

// cluster_routing.cpp
bool starts_with(std::string_view s, std::string_view p);

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 :6381" (an empty host: the answering node's).
struct Redirect {
  std::uint16_t slot = 0;
  std::string host;
  std::uint16_t port = 0;
};
bool parse_redirect(std::string_view text, std::string_view default_host, Redirect& out);
bool find_redirect(std::string_view text, std::string_view default_host, Redirect& out, bool& ask);

using redis::to_u64;  // redis/connection.hpp

// One node's renewal pipeline, run by the node's renewal worker. It owns copies of
// its keys and arguments: the caller may stop waiting and return before it ran.
// The worker writes replies/ec/error, then sets `done` under the backend's work_mu_;
// the caller reads them after it saw `done`.
struct RenewJob {
  std::vector<std::string> keys;
  std::vector<std::string> args;        // owner, ttl per key
  std::vector<std::size_t> call_sizes;  // locks per EVALSHA, in order
  std::vector<bool> call_delayed;       // per EVALSHA: its locks' markers follow them in `keys`
  std::vector<Reply> replies;           // one per call
  Error ec;                             // the node could not be reached or the transport failed
  // Both guarded by the backend's work_mu_ (a lock of another object, which an annotation
  // here cannot name).
  bool done = false;
  bool abandoned = false;  // the caller stopped waiting
};

struct Node {
  explicit Node(const ConnectionOptions& o) : opts(o), pool(o, 8) {}
  const ConnectionOptions opts;
  ConnectionPool pool;
  std::unique_ptr<redis::Subscriber> sub;  // created on first watch; guarded by the backend's map_mu_
  std::atomic<bool> failing{false};        // its last call failed (logged once per outage)
  std::atomic<bool> config_checked{false};
  // The renewal worker, started on the node's first renewal; guarded by work_mu_.
  std::thread worker;
  std::condition_variable work_cv;
  std::deque<std::shared_ptr<RenewJob>> jobs;
  // A pipeline outlived its caller's wait and the worker has not come back from it
  // (a hung node): written under work_mu_, read also without it.
  std::atomic<bool> renewal_stuck{false};
};

class ClusterPrefixWatch;

class ClusterBackend final : public Backend {
 public:
  ClusterBackend(const ConnectionOptions& base, std::vector<std::pair<std::string, std::uint16_t>> seeds,
                 std::map<std::string, std::pair<std::string, std::uint16_t>> nat, std::string prefix,
                 std::string url, const ClientOptions& opts)
      : base_(redis::counted(base)),
        nat_(std::move(nat)),
        prefix_(std::move(prefix)),
        url_(std::move(url)),
        log_(opts.logger),
        slots_(kSlots) {
    for (auto& [host, port] : seeds) seeds_.push_back(node_at(host, port));
    waits_ = std::make_unique<redis::WaitQueue>(
        opts.clock ? opts.clock : system_steady_clock(),
        [this](const std::vector<redis::WaitQueue::Wait>& w) { return refresh_waits(w); },
        [this](std::string_view name) { wake(name); },
        [this](const redis::WaitQueue::Wait& w) { return cancel_wait(w); });
    mover_ = std::thread([this] { run_mover(); });
  }

  ~ClusterBackend() override;

  Capabilities capabilities() const noexcept override { return {true, true, true}; }
  void set_listener(ChangeListener* listener) override { listener_.store(listener); }

  void connect_now(Error& ec);
  AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override;
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override;
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) override;
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                        Error& ec) override;
  void forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept override;
  Revoked revoke(std::string_view name, std::string_view note, Millis note_life, Error& ec) override;
  std::optional<std::string> revoke_note(std::string_view name, Error& ec) override;
  void watch(std::string_view name, Error& ec) override;
  void unwatch(std::string_view name) noexcept override;
  std::unique_ptr<PrefixWatch> watch_prefix(std::string_view prefix, LockEventSink& sink, Error& ec) override;
  LockInfo status(std::string_view name, Error& ec) override;
  std::string put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) override;
  std::optional<std::string> get_record(std::string_view key, Error& ec) override;
  bool erase_record(std::string_view key, Error& ec) override;
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    Error& ec) override;

  std::string url() const override { return url_; }
  std::uint64_t round_trips() const noexcept override { return base_.round_trips->count(); }

 private:
  friend class ClusterPrefixWatch;  // cluster_prefix_watch.cpp: the slot map, nodes and settings

  const redisReply* record_command(const char* cmd, const char* what, std::string_view key, Reply& r,
                                   Error& ec);

  void unexpected(const char* what, Error& ec) {
    ec = make_error_code(errc::protocol_error);
    ec.set_detail(std::string("unexpected reply to ") + what);
  }

  std::vector<Node*> all_masters(Error& ec);

  // cluster_queue.cpp: the wait queue of a name (docs/redis-cluster.md "How waiting works").
  using Answer = redis::QueueAnswer;
  // One run of the queue's acquire script: `entry` and `mode` as redis/lock_scripts.hpp says.
  Answer run_acquire(const AcquireRequest& req, const std::string& entry, const char* mode, Error& ec);
  AcquireResult acquire_queued(const AcquireRequest& req, Error& ec);
  std::vector<redis::WaitQueue::Answer> refresh_waits(const std::vector<redis::WaitQueue::Wait>& waits);
  bool cancel_wait(const redis::WaitQueue::Wait& w);
  // A message on a name's release channel: "released", or a grant to one waiter.
  void on_name_message(std::string_view channel, std::string_view payload);
  void wake(std::string_view name) {
    ChangeListener* l = listener_.load();
    if (l) l->on_change(name);
  }

  struct Watch {
    Node* node = nullptr;
    std::string channel;
  };
  using Attempt = std::function<const redisReply*(Connection&, bool asking, Error&)>;

  const redisReply* route(std::uint16_t slot, const char* what, const Attempt& attempt, Error& ec);

  std::uint64_t map_version() const {
    LockGuard lk(map_mu_);
    return map_version_;
  }

  Node* node_at(const std::string& host, std::uint16_t port) {
    LockGuard lk(map_mu_);
    return node_at_locked(host, port);
  }
  Node* node_at_locked(const std::string& announced_host, std::uint16_t announced_port)
      DISTLOCK_REQUIRES(map_mu_);
  Node* node_for(std::uint16_t slot, Error& ec);

  void learn_redirect(std::string_view text, std::string_view host) {
    Redirect to;
    if (parse_redirect(text, host, to)) learn_redirect_to(to);
  }
  void learn_redirect_to(const Redirect& to) {
    LockGuard lk(map_mu_);
    slots_[to.slot] = node_at_locked(to.host, to.port);
  }

  void refresh_after_failure();
  void request_refresh();
  bool refresh_map(std::uint64_t seen_version, Error& ec);
  // A map refresh whose failure only matters to a later call (it refreshes again).
  void refresh_map_quietly() {
    Error ignored;
    refresh_map(map_version(), ignored);
  }
  bool load_map_from(Node& node, Error& ec);
  void check_new_masters();
  void check_config(Node& node);
  redis::Subscriber& subscriber_of(Node& node);
  void on_channel(std::string_view channel);
  void on_dropped(Node* node, std::string_view channel);
  void run_mover();

  // After a transport failure: ec's detail (the connection's, naming the node) is said
  // with what failed.
  void failed(Node& node, const char* what, Error& ec) {
    const std::string msg = std::string(what) + ": " + ec.detail();
    report(node, msg);
    ec.set_detail(msg);
  }
  // One warning per node and outage, one info line when it answers again.
  void report(Node& node, const std::string& message) {
    if (!node.failing.exchange(true)) log_.log(LogLevel::warning, "{}", message);
  }
  void ok(Node& node) {
    if (node.failing.exchange(false)) log_.log(LogLevel::info, "{} answers again", node.opts.describe());
  }

  // The leases of this client acquired with a lock_delay (name '\0' owner): their renewal
  // and release name the lock-delay marker, the others' do not (a script naming a key the
  // node lacks is refused while the slot migrates; docs/redis-cluster.md "Lock-delay").
  void note_delayed(std::string_view name, std::string_view owner, bool on) {
    std::string key = std::string(name) + '\0' + std::string(owner);
    LockGuard lk(delayed_mu_);
    if (on) {
      delayed_.insert(std::move(key));
    } else {
      delayed_.erase(key);
    }
  }
  bool is_delayed(std::string_view name, std::string_view owner) const {
    const std::string key = std::string(name) + '\0' + std::string(owner);
    LockGuard lk(delayed_mu_);
    return delayed_.contains(key);
  }

  Millis renew_budget(std::span<const RenewItem> items) const;
  void run_renewal_worker(Node& node);
  static void run_renewal(Node& node, RenewJob& job);

  const ConnectionOptions base_;  // its round_trips: every node's connections count there
  const std::map<std::string, std::pair<std::string, std::uint16_t>> nat_;  // "host:port" announced → reached
  const std::string prefix_;
  const std::string url_;
  Logger log_;
  std::atomic<ChangeListener*> listener_{nullptr};

  std::mutex refresh_mu_;  // one CLUSTER SLOTS at a time
  mutable AnnotatedMutex map_mu_;
  std::map<std::string, std::unique_ptr<Node>> nodes_ DISTLOCK_GUARDED_BY(map_mu_);  // never removed
  std::vector<Node*> slots_ DISTLOCK_GUARDED_BY(map_mu_);
  std::uint64_t map_version_ DISTLOCK_GUARDED_BY(map_mu_) = 0;
  std::chrono::steady_clock::time_point last_failure_refresh_ DISTLOCK_GUARDED_BY(map_mu_){};
  std::vector<Node*> seeds_;

  AnnotatedMutex watch_mu_;  // serialises watch, unwatch and moves
  std::map<std::string, Watch, std::less<>> watched_ DISTLOCK_GUARDED_BY(watch_mu_);
  AnnotatedMutex names_mu_;
  std::map<std::string, std::string, std::less<>> channel_names_ DISTLOCK_GUARDED_BY(names_mu_);

  AnnotatedMutex work_mu_;           // renewal jobs of every node
  std::condition_variable done_cv_;  // a renewal job is done
  bool work_stop_ DISTLOCK_GUARDED_BY(work_mu_) = false;

  mutable AnnotatedMutex delayed_mu_;
  std::set<std::string, std::less<>> delayed_ DISTLOCK_GUARDED_BY(delayed_mu_);

  // The client id of this client's owners ("<client id>:<thread>"), learnt from its first
  // queued wait: a grant on a name's channel is for this client when its owner has it.
  // The masters that failed a refresh of a queued wait in the last round (refresh_waits):
  // compared, never dereferenced.
  AnnotatedMutex wait_refresh_mu_;
  std::set<const Node*> refresh_failed_ DISTLOCK_GUARDED_BY(wait_refresh_mu_);
  mutable AnnotatedMutex client_mu_;
  std::string client_id_ DISTLOCK_GUARDED_BY(client_mu_);

  AnnotatedMutex move_mu_;
  std::condition_variable move_cv_;
  std::deque<std::pair<Node*, std::string>> moves_ DISTLOCK_GUARDED_BY(move_mu_);
  bool refresh_wanted_ DISTLOCK_GUARDED_BY(move_mu_) = false;  // read the slot map
  bool check_wanted_ DISTLOCK_GUARDED_BY(move_mu_) = false;    // check new nodes' config
  bool stop_ DISTLOCK_GUARDED_BY(move_mu_) = false;
  std::thread mover_;
  // This client's places in the names' queues; its refresher calls refresh_waits(). Reset
  // first in the destructor: its thread routes calls through everything above.
  std::unique_ptr<redis::WaitQueue> waits_;
};

}  // namespace distlock::detail::rediscluster
