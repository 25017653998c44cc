// The etcd backend's private declarations, shared by its files: etcd_session.cpp
// (session leases, keepalives, the keeper), etcd_queue.cpp (the queue recipe:
// acquire, cancel, release, renew), etcd_watch.cpp (the shared Watch stream) and
// etcd_backend.cpp (status, factory). Not for use outside src/etcd.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend.hpp"
#include "engine/log.hpp"
#include "engine/queue_recipe.hpp"
#include "engine/thread_annotations.hpp"
#include "etcd/etcd_keys.hpp"
#include "etcd/etcd_records.hpp"
#include "etcd/etcd_transport.hpp"

namespace distlock::detail::etcd {

// Every time point is read from the client's injected clock (ClientOptions::clock),
// the one the engine counts lease validity on; tests run it on a manual clock.
using SteadyTime = Clock::time_point;
using etcdserverpb::Compare;
using etcdserverpb::RangeRequest;

// ---- keys ------------------------------------------------------------------

// Key layout: etcd/etcd_keys.hpp.

inline std::string hex(std::int64_t v) {
  return fmt::format("{:x}", static_cast<std::uint64_t>(v));
}

// etcd's largest lease TTL (lease.MaxLeaseTTL): LeaseGrant refuses anything longer.
inline constexpr std::int64_t kMaxLeaseTtlS = 9'000'000'000;
// How long an orphan key whose creating Txn had no answer is looked for: etcd applies
// a proposal within its request timeout (5 s + 2 election timeouts by default) or, after
// a leader change, soon after a new leader is elected; later than this is assumed never.
inline constexpr Millis kLateApplyWindow{30'000};
// etcd's default --max-txn-ops: renewal reads at most this many keys per Txn.
inline constexpr std::size_t kMaxTxnOps = 128;

// A lock TTL in whole seconds, rounded up, without overflow; 0 when beyond etcd's limit.
inline std::int64_t ttl_seconds(Millis ttl) {
  const std::int64_t ms = std::max<std::int64_t>(ttl.count(), 1);
  const std::int64_t s = ms / 1000 + (ms % 1000 != 0 ? 1 : 0);
  return s > kMaxLeaseTtlS ? 0 : s;
}

// ---- sessions and queued keys ----------------------------------------------

struct Session {
  std::int64_t lease = 0;
  std::int64_t requested_s = 0;  // the TTL asked for (map key)
  Millis ttl{};                  // the TTL etcd granted
  // Guarded by the backend's recipe_.mutex() (not annotated: a Session holds no path to its
  // backend, so the analysis cannot name that mutex from here).
  bool alive = true;
  SteadyTime last_sent{};  // send time of the last successful grant/keepalive
  SteadyTime next_keepalive{};
};

// One acquisition's key in one lock's queue (the recipe's entry; token is the key's
// create_revision, confirmed the acquisition or the last renewal).
struct Entry final : QueueEntry {
  using QueueEntry::QueueEntry;
  std::string lock_prefix;  // <prefix>/<encoded name>/
  std::string key;
  std::shared_ptr<Session> session;
  SteadyTime made{};  // before its first Txn was sent
  // Guarded by the recipe's mutex (not annotated: the entry holds no path to its recipe, so
  // the analysis cannot name QueueRecipe::mutex() from here).
  std::int64_t watch_id = 0;  // live watch on the predecessor, 0 when none
  bool watch_fired = false;   // the predecessor was deleted (or the watch broke)
  // Lock-delay (etcd_delay.cpp). The marker value this entry's hold wrote (empty: none).
  std::string delay_marker;
  // Set by release() (not by forget): its delete takes the marker with it.
  bool releasing = false;
  // A lost holder's delay this entry is waiting out: the marker's mod_revision it timed,
  // and when (on clock_) the delay ends. Only the thread running enqueue touches them.
  std::int64_t held_back_rev = 0;
  SteadyTime held_back_until{};
};

// A Watch stream shared by every waiter of the client, read by one thread.
struct WatchStream {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>> rw;
  std::thread reader;
  std::mutex write_mu;
  std::atomic<bool> broken{false};
  std::atomic<bool> done{false};  // the reader thread has nothing left to do
};

// ---- the backend -----------------------------------------------------------

class EtcdBackend final : public QueueBackend<RecordsBackend<etcd::Records>>, private QueueStore {
 public:
  EtcdBackend(etcd::TransportConfig config, std::string prefix, std::string redacted_url,
              const ClientOptions& opts)
      : transport_(std::move(config)),
        prefix_(std::move(prefix)),
        url_(std::move(redacted_url)),
        log_(opts.logger),
        clock_(opts.clock ? opts.clock : system_steady_clock()),
        recipe_(*this, clock_, log_) {}

  ~EtcdBackend() override {
    keeper_.request_stop();
    {
      LockGuard lk(recipe_.mutex());
      keeper_cv_.notify_all();
    }
    if (keeper_.joinable()) keeper_.join();
    std::vector<std::shared_ptr<WatchStream>> streams;
    {
      LockGuard lk(watch_mu_);
      stopping_ = true;
      if (stream_) streams.push_back(stream_);
      for (auto& s : retired_) streams.push_back(s);
      stream_.reset();
      retired_.clear();
    }
    for (auto& s : streams) {
      s->ctx.TryCancel();
      if (s->reader.joinable()) s->reader.join();
    }
    // Revoking the sessions deletes every key this client still has (queued keys,
    // keys whose release failed) at once, so other clients need not wait a TTL.
    std::vector<std::int64_t> leases;
    {
      LockGuard lk(recipe_.mutex());
      for (auto& [ttl, s] : sessions_) {
        if (s->alive) leases.push_back(s->lease);
      }
    }
    for (const auto id : leases) {
      etcdserverpb::LeaseRevokeRequest req;
      req.set_id(id);
      etcdserverpb::LeaseRevokeResponse resp;
      grpc::ClientContext ctx;
      transport_.prepare(ctx, std::min(transport_.config().command_timeout, Millis(500)));
      (void)transport_.stubs(transport_.current()).lease->LeaseRevoke(&ctx, req, &resp);
    }
  }

  Error probe() {
    if (Error err = transport_.authenticate()) {
      if (err == errc::auth_failed) {
        err.set_detail("etcd rejected user \"" + transport_.config().user + "\": " + err.detail());
      }
      return err;
    }
    // A serializable read answers even without a leader; it proves the endpoint
    // is etcd and that our credentials (or lack of them) are accepted.
    RangeRequest req;
    req.set_key(prefix_ + "/");
    req.set_range_end(prefix_end(prefix_ + "/"));
    req.set_count_only(true);
    req.set_serializable(true);
    etcdserverpb::RangeResponse resp;
    const grpc::Status st = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, req, &resp); });
    if (!st.ok()) {
      Error err = transport_.to_error(st);
      if (err == errc::auth_failed && !transport_.has_auth()) {
        err.set_detail(err.detail() + "; the cluster requires authentication: put user:password in the URL");
      }
      return err;
    }
    return {};
  }

  void start() {
    keeper_ = std::jthread([this](std::stop_token st) { keeper_main(st); });
  }

  Capabilities capabilities() const noexcept override { return {true, true, true}; }

  // release marks the entry so its delete takes its lock-delay marker too; forget (a lost
  // lease) deletes the key alone, so the marker holds the name back (etcd_delay.cpp).
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        Error& ec) override;
  void forget(std::string_view name, std::string_view owner, std::uint64_t token) noexcept override;
  std::string url() const override { return url_; }
  std::uint64_t round_trips() const noexcept override { return transport_.round_trips(); }

  // Watches are per queued key and set up by try_acquire (from the revision it
  // read, so nothing between the read and the watch is missed).
  void watch(std::string_view, Error& ec) override { ec.clear(); }
  void unwatch(std::string_view) noexcept override {}

  LockInfo status(std::string_view name, Error& ec) override;

  // Revoke (etcd_revoke.cpp).
  Revoked revoke(std::string_view name, std::string_view note, Millis note_life, Error& ec) override;
  std::optional<std::string> revoke_note(std::string_view name, Error& ec) override;

  // Test hook (tests/etcd/etcd_revoke_fault_test.cpp, tests/tools/etcd_revoke_tool.cpp): revoke()
  // calls it with kGranted once the revoke's leases are granted (before its Txn is sent),
  // with kApplied once its Txn was answered as applied (before the keepalive of the revoked
  // key's lease), and with kKeepAlive in each transport attempt of a keepalive of that lease
  // (the channel connected, before the request is written), on the revoking thread, so a
  // test can delay or cut the connection (or kill the process) at exactly that point. Unset
  // (the default): nothing is called. Set it before the client revokes; not part of the
  // public API.
  enum class RevokeStep { kGranted, kApplied, kKeepAlive };
  void set_revoke_hook_for_test(std::function<void(RevokeStep)> hook) {
    LockGuard lk(revoke_hook_mu_);
    revoke_hook_ = std::move(hook);
  }

  // Test hook (tests/etcd/etcd_waiter_watch_compaction_test.cpp): a waiter calls it once it
  // has read its predecessor, with the revision of that read, before it asks for the watch
  // from the next revision, on the waiting thread, so a test can compact that revision away
  // first. Unset (the default): nothing is called. Set it before the client waits; not part
  // of the public API.
  void set_predecessor_watch_hook_for_test(std::function<void(std::int64_t read_revision)> hook) {
    LockGuard lk(revoke_hook_mu_);
    predecessor_watch_hook_ = std::move(hook);
  }

  // Client::watch (etcd_prefix_watch.cpp): one Watch stream of its own per call.
  std::unique_ptr<PrefixWatch> watch_prefix(std::string_view prefix, LockEventSink& sink, Error& ec) override;

  // Records and listing (RecordsBackend forwards them): etcd_records.cpp.
  etcd::Records& records() noexcept override { return records_; }
  // The lock calls run the queue recipe (engine/queue_recipe.hpp) over this store
  // (etcd_queue.cpp).
  QueueRecipe& recipe() noexcept override { return recipe_; }

 private:
  std::string lock_prefix(std::string_view name) const {
    return prefix_.empty() ? encode_name(name) + "/" : prefix_ + "/" + encode_name(name) + "/";
  }
  // QueueStore (etcd_queue.cpp).
  bool admit(const AcquireRequest& req, Clock::time_point started, Error& ec) override;
  QueueEntryPtr new_entry(const AcquireRequest& req, Error& ec) override;
  bool live(const QueueEntry& e) const override DISTLOCK_REQUIRES(recipe_.mutex());
  bool reusable(const QueueEntry& e, const AcquireRequest& req) const override;
  QueuePosition enqueue(QueueEntry& e, const AcquireRequest& req, Clock::time_point started,
                        Error& ec) override;
  std::optional<Millis> grant(QueueEntry& e, const QueuePosition& pos) override
      DISTLOCK_REQUIRES(recipe_.mutex());
  Watch watch_predecessor(QueueEntry& e, Clock::time_point started, Error& ec) override;
  Deleted delete_place(QueueEntry& e, Error& ec) override;
  void confirm(std::span<QueueEntry* const> entries, std::span<RenewStatus> out, Clock::time_point sent,
               Error& ec) override;
  void confirmed(QueueEntry& e, Clock::time_point sent) override DISTLOCK_REQUIRES(recipe_.mutex());
  void forgotten(QueueEntry& e) noexcept override;

  std::shared_ptr<Session> live_session(std::int64_t ttl_s, Error& ec);
  Error keepalive(const std::vector<std::shared_ptr<Session>>& sessions);
  void lose_session(const std::shared_ptr<Session>& session, const char* why) noexcept;
  void add_watch(Entry& entry, const std::string& key, std::int64_t start_rev);
  void cancel_watch(std::int64_t watch_id) noexcept;
  std::shared_ptr<WatchStream> open_stream_locked() DISTLOCK_REQUIRES(watch_mu_);
  void reader_main(std::shared_ptr<WatchStream> stream);
  void keeper_main(std::stop_token st);
  std::string revoke_note_key(std::string_view name) const;
  // The release mark of a session (etcd_keys.hpp): the key its last release deleted.
  std::string release_mark_key(std::int64_t lease) const {
    return (prefix_.empty() ? std::string() : prefix_ + "/") + std::string(kReleasedDir) + hex(lease);
  }
  friend class EtcdPrefixWatch;
  std::string delay_key(std::string_view name) const;
  // The entry is first in its queue (its key's create_revision my_rev); `marker` is the
  // lock-delay marker read in the same Txn (nullptr: none). kind first: it may be granted
  // (its own marker written when req.lock_delay > 0); held_back: a lost holder's delay
  // runs (pos.holder_ttl: the time left); again / failed.
  QueuePosition::Kind settle_delay(Entry& entry, const AcquireRequest& req, std::int64_t my_rev,
                                   const mvccpb::KeyValue* marker, QueuePosition& pos, Error& ec);
  // Whether the first key of a queue holds the lock, given the lock-delay marker read at the
  // same revision (nullptr: none). Not while a lost holder's delay runs (a lost marker, or an
  // armed one naming another key): the first key is then a waiter waiting it out, not granted.
  static bool first_holds(const mvccpb::KeyValue& first, const mvccpb::KeyValue* marker);
  // The lowest key under `lock_prefix` and the lock-delay marker of `name`, at one revision.
  grpc::Status read_first(std::string_view name, const std::string& lock_prefix, bool whole_queue,
                          etcdserverpb::RangeResponse& queue, etcdserverpb::RangeResponse& marker);
  // A lease of `ttl_s` outside every session (nobody keeps it alive); 0 with ec on error.
  std::int64_t grant_free_lease(std::int64_t ttl_s, Error& ec);
  void revoke_step(RevokeStep step) {
    std::function<void(RevokeStep)> hook;
    {
      LockGuard lk(revoke_hook_mu_);
      hook = revoke_hook_;
    }
    if (hook) hook(step);
  }
  void predecessor_watch_step(std::int64_t read_revision) {
    std::function<void(std::int64_t)> hook;
    {
      LockGuard lk(revoke_hook_mu_);
      hook = predecessor_watch_hook_;
    }
    if (hook) hook(read_revision);
  }
  void revoke_lease(std::int64_t id) noexcept;
  // One keepalive of `first`, then one of `id`, on one stream (in each transport attempt,
  // after the revoke hook's kKeepAlive): whether etcd renewed `id` (both answers read).
  bool keep_alive_behind(std::int64_t first, std::int64_t id) noexcept;
  // After a confirmed revoke: puts the lock-delay marker of `name` back to `prior` (nullopt:
  // deletes it) if it is still the one the revoke's Txn (revision `revoke_rev`) wrote.
  // False when etcd gave no answer (the revoke's marker may still be there).
  bool restore_marker(std::string_view name, const std::optional<mvccpb::KeyValue>& prior,
                      std::int64_t revoke_rev) noexcept;
  void set_error(const grpc::Status& st, Error& ec, const char* what) {
    const Error err = transport_.to_error(st);
    log_.log(LogLevel::debug, "etcd {} failed: {}", what, err.detail());
    // The error the caller sees names the endpoint and gRPC's reason (err's detail does).
    ec.fail(err, std::string(what) + ": " + err.detail());
  }

  etcd::Transport transport_;
  const std::string prefix_;
  const std::string url_;
  Logger log_;
  const std::shared_ptr<Clock> clock_;
  etcd::Records records_{transport_, prefix_};
  // The entries (one per acquisition key) and the orphans (keys whose delete had no
  // answer) live in the recipe; its mutex guards the sessions as well.
  QueueRecipe recipe_;

  std::mutex grant_mu_;  // one LeaseGrant at a time, so threads share the session
  std::map<std::int64_t, std::shared_ptr<Session>> sessions_
      DISTLOCK_GUARDED_BY(recipe_.mutex());                              // by TTL s
  std::uint64_t next_key_seq_ DISTLOCK_GUARDED_BY(recipe_.mutex()) = 1;  // makes every queue key unique
  std::condition_variable keeper_cv_;  // waited on through clock_ (notified under mu_ to stop)
  std::uint64_t keeper_generation_ DISTLOCK_GUARDED_BY(recipe_.mutex()) =
      0;  // bumped when a session is added
  std::jthread keeper_;

  AnnotatedMutex revoke_hook_mu_;  // guards both test hooks
  std::function<void(RevokeStep)> revoke_hook_ DISTLOCK_GUARDED_BY(revoke_hook_mu_);
  std::function<void(std::int64_t)> predecessor_watch_hook_ DISTLOCK_GUARDED_BY(revoke_hook_mu_);

  // Lock order: mu_ before watch_mu_.
  AnnotatedMutex watch_mu_;
  std::shared_ptr<WatchStream> stream_ DISTLOCK_GUARDED_BY(watch_mu_);
  std::vector<std::shared_ptr<WatchStream>> retired_;     // broken streams to join; watch_mu_
  std::map<std::int64_t, std::weak_ptr<Entry>> watches_;  // watch id → its entry; watch_mu_
  std::int64_t next_watch_id_ = 1;                        // watch_mu_
  bool stopping_ = false;                                 // watch_mu_
};

}  // namespace distlock::detail::etcd
