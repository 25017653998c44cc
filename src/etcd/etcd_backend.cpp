#include "etcd/etcd_backend.hpp"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/log.hpp"
#include "etcd/etcd_keys.hpp"
#include "etcd/etcd_records.hpp"
#include "etcd/etcd_transport.hpp"
#include "etcd/etcd_url.hpp"

namespace distlock::detail {

namespace {

using SteadyClock = std::chrono::steady_clock;
using etcdserverpb::Compare;
using etcdserverpb::RangeRequest;

// ---- keys ------------------------------------------------------------------

// Key layout: etcd/etcd_keys.hpp.
using etcd::encode_name;
using etcd::prefix_end;

std::string hex(std::int64_t v) {
  return fmt::format("{:x}", static_cast<std::uint64_t>(v));
}

// etcd's largest lease TTL (lease.MaxLeaseTTL): LeaseGrant refuses anything longer.
constexpr std::int64_t kMaxLeaseTtlS = 9'000'000'000;
// etcd's default --max-txn-ops: renewal reads at most this many keys per Txn.
constexpr std::size_t kMaxTxnOps = 128;

// A lock TTL in whole seconds, rounded up, without overflow; 0 when beyond etcd's limit.
std::int64_t ttl_seconds(Millis ttl) {
  const std::int64_t ms = std::max<std::int64_t>(ttl.count(), 1);
  const std::int64_t s = ms / 1000 + (ms % 1000 != 0 ? 1 : 0);
  return s > kMaxLeaseTtlS ? 0 : s;
}

std::string entry_key(std::string_view name, std::string_view owner) {
  std::string k(name);
  k.push_back('\0');
  k.append(owner);
  return k;
}

// ---- sessions and queued keys ----------------------------------------------

struct Session {
  std::int64_t lease = 0;
  std::int64_t requested_s = 0;  // the TTL asked for (map key)
  Millis ttl{};                  // the TTL etcd granted
  // Guarded by EtcdBackend::mu_.
  bool alive = true;
  SteadyClock::time_point last_sent{};  // send time of the last successful grant/keepalive
  SteadyClock::time_point next_keepalive{};
};

// One owner thread's key in one lock's queue.
struct Entry {
  std::string name;
  std::string owner;
  std::string lock_prefix;  // <prefix>/<encoded name>/
  std::string key;
  std::shared_ptr<Session> session;
  // Guarded by EtcdBackend::mu_.
  std::int64_t create_rev = 0;  // 0: not created yet (as far as we know)
  bool held = false;
  SteadyClock::time_point renewed_at{};  // acquisition or last renewal by the engine
  std::int64_t watch_id = 0;             // live watch on the predecessor, 0 when none
  bool watch_fired = false;              // the predecessor was deleted (or the watch broke)
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

class EtcdBackend final : public Backend {
 public:
  EtcdBackend(etcd::TransportConfig config, std::string prefix, std::string redacted_url,
              const ClientOptions& opts)
      : transport_(std::move(config)),
        prefix_(std::move(prefix)),
        url_(std::move(redacted_url)),
        log_(opts.logger) {}

  ~EtcdBackend() override {
    keeper_.request_stop();
    {
      std::lock_guard lk(mu_);
      keeper_cv_.notify_all();
    }
    if (keeper_.joinable()) keeper_.join();
    std::vector<std::shared_ptr<WatchStream>> streams;
    {
      std::lock_guard lk(watch_mu_);
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
      std::lock_guard lk(mu_);
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

  std::error_code probe(std::string& why) {
    if (auto ec = transport_.authenticate(why)) {
      if (ec == errc::auth_failed) {
        why = "etcd rejected user \"" + transport_.config().user + "\": " + why;
      }
      return ec;
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
      auto ec = transport_.to_error(st, why);
      if (ec == errc::auth_failed && !transport_.has_auth()) {
        why += "; the cluster requires authentication: put user:password in the URL";
      }
      return ec;
    }
    return {};
  }

  void start() {
    keeper_ = std::jthread([this](std::stop_token st) { keeper_main(st); });
  }

  Capabilities capabilities() const noexcept override { return {true, true}; }
  void set_listener(ChangeListener* listener) override { listener_ = listener; }
  std::string url() const override { return url_; }

  // Watches are per queued key and set up by try_acquire (from the revision it
  // read, so nothing between the read and the watch is missed).
  void watch(std::string_view, std::error_code& ec) override { ec.clear(); }
  void unwatch(std::string_view) noexcept override {}

  AcquireResult try_acquire(const AcquireRequest& req, std::error_code& ec) override;
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override;
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) override;
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        std::error_code& ec) override;
  LockInfo status(std::string_view name, std::error_code& ec) override;

  // Records and listing: etcd_records.cpp.
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

 private:
  std::string lock_prefix(std::string_view name) const {
    return prefix_.empty() ? encode_name(name) + "/" : prefix_ + "/" + encode_name(name) + "/";
  }
  std::shared_ptr<Session> live_session(std::int64_t ttl_s, std::error_code& ec);
  std::error_code keepalive(const std::vector<std::shared_ptr<Session>>& sessions);
  void lose_session(const std::shared_ptr<Session>& session, const char* why) noexcept;
  bool delete_key(const std::string& key, std::int64_t create_rev, std::error_code& ec);
  void forget_entry(const std::shared_ptr<Entry>& entry);
  void add_watch(const std::shared_ptr<Entry>& entry, const std::string& key, std::int64_t start_rev);
  void cancel_watch(std::int64_t watch_id) noexcept;
  std::shared_ptr<WatchStream> open_stream_locked();
  void reader_main(std::shared_ptr<WatchStream> stream);
  void keeper_main(std::stop_token st);
  void set_error(const grpc::Status& st, std::error_code& ec, const char* what) {
    std::string why;
    ec = transport_.to_error(st, why);
    log_.log(LogLevel::debug, "etcd {} failed: {}", what, why);
  }

  etcd::Transport transport_;
  const std::string prefix_;
  const std::string url_;
  Logger log_;
  etcd::Records records_{transport_, prefix_};
  ChangeListener* listener_ = nullptr;

  std::mutex grant_mu_;  // one LeaseGrant at a time, so threads share the session
  std::mutex mu_;
  std::map<std::int64_t, std::shared_ptr<Session>> sessions_;           // by requested TTL s; guarded by mu_
  std::map<std::string, std::shared_ptr<Entry>, std::less<>> entries_;  // name\0owner; guarded by mu_
  // Keys to delete: (key, create_revision), 0 when the revision is unknown (a Txn
  // that may have created the key had no answer). Guarded by mu_.
  std::vector<std::pair<std::string, std::int64_t>> orphans_;
  std::uint64_t next_key_seq_ = 1;  // makes every queue key unique; guarded by mu_
  std::condition_variable_any keeper_cv_;
  std::uint64_t keeper_generation_ = 0;  // bumped when a session is added; guarded by mu_
  std::jthread keeper_;

  // Lock order: mu_ before watch_mu_.
  std::mutex watch_mu_;
  std::shared_ptr<WatchStream> stream_;                // guarded by watch_mu_
  std::vector<std::shared_ptr<WatchStream>> retired_;  // broken streams to join; watch_mu_
  std::map<std::int64_t, std::string> watches_;        // watch id → entry key; watch_mu_
  std::int64_t next_watch_id_ = 1;                     // watch_mu_
  bool stopping_ = false;                              // watch_mu_
};

std::shared_ptr<Session> EtcdBackend::live_session(std::int64_t ttl_s, std::error_code& ec) {
  std::lock_guard grant(grant_mu_);
  {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(ttl_s);
    if (it != sessions_.end() && it->second->alive) return it->second;
  }
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  const auto sent = SteadyClock::now();
  const grpc::Status st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.lease->LeaseGrant(&ctx, req, &resp); });
  if (!st.ok()) {
    set_error(st, ec, "LeaseGrant");
    return nullptr;
  }
  if (!resp.error().empty() || resp.ttl() <= 0) {
    ec = make_error_code(errc::protocol_error);
    log_.log(LogLevel::warning, "etcd LeaseGrant({}) answered TTL {} error \"{}\"", ttl_s, resp.ttl(),
             resp.error());
    return nullptr;
  }
  auto s = std::make_shared<Session>();
  s->lease = resp.id();
  s->requested_s = ttl_s;
  s->ttl = std::chrono::seconds(resp.ttl());
  s->last_sent = sent;
  s->next_keepalive = sent + s->ttl / 3;
  log_.log(LogLevel::debug, "etcd session lease {:x} granted with TTL {}s", s->lease, resp.ttl());
  {
    std::lock_guard lk(mu_);
    sessions_[ttl_s] = s;
    ++keeper_generation_;
  }
  keeper_cv_.notify_all();
  return s;
}

// One LeaseKeepAlive stream, one request per session: one round trip for all.
std::error_code EtcdBackend::keepalive(const std::vector<std::shared_ptr<Session>>& sessions) {
  if (sessions.empty()) return {};
  std::map<std::int64_t, std::int64_t> ttl_by_lease;
  const auto sent = SteadyClock::now();
  const grpc::Status st = transport_.call([&](etcd::Stubs& s, grpc::ClientContext& ctx) {
    ttl_by_lease.clear();
    auto stream = s.lease->LeaseKeepAlive(&ctx);
    for (const auto& session : sessions) {
      etcdserverpb::LeaseKeepAliveRequest req;
      req.set_id(session->lease);
      if (!stream->Write(req)) break;
    }
    etcdserverpb::LeaseKeepAliveResponse resp;
    while (ttl_by_lease.size() < sessions.size() && stream->Read(&resp)) ttl_by_lease[resp.id()] = resp.ttl();
    stream->WritesDone();
    grpc::Status fin = stream->Finish();
    if (fin.ok() && ttl_by_lease.size() < sessions.size()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "keepalive stream ended early");
    }
    return fin;
  });
  if (!st.ok() && ttl_by_lease.size() < sessions.size()) {
    std::error_code ec;
    set_error(st, ec, "LeaseKeepAlive");
    std::vector<std::shared_ptr<Session>> expired;
    {
      std::lock_guard lk(mu_);
      for (const auto& session : sessions) {
        session->next_keepalive = SteadyClock::now() + std::min<Millis>(session->ttl / 6, Millis(500));
        if (SteadyClock::now() >= session->last_sent + session->ttl) expired.push_back(session);
      }
    }
    for (auto& s : expired) lose_session(s, "keepalives failed for a whole TTL");
    return ec;
  }
  std::vector<std::shared_ptr<Session>> gone;
  {
    std::lock_guard lk(mu_);
    for (const auto& session : sessions) {
      const auto it = ttl_by_lease.find(session->lease);
      if (it == ttl_by_lease.end() || it->second <= 0) {
        gone.push_back(session);
        continue;
      }
      session->last_sent = std::max(session->last_sent, sent);
      session->next_keepalive = session->last_sent + session->ttl / 3;
    }
  }
  for (auto& s : gone) lose_session(s, "etcd says the session lease is gone (expired or revoked)");
  return {};
}

void EtcdBackend::lose_session(const std::shared_ptr<Session>& session, const char* why) noexcept {
  std::vector<std::pair<std::string, std::string>> lost;  // held: name, owner
  std::set<std::string> queued;                           // names with a waiting key
  {
    std::lock_guard lk(mu_);
    if (!session->alive) return;
    session->alive = false;
    auto it = sessions_.find(session->requested_s);
    if (it != sessions_.end() && it->second == session) sessions_.erase(it);
    for (auto e = entries_.begin(); e != entries_.end();) {
      if (e->second->session != session) {
        ++e;
        continue;
      }
      if (e->second->held) {
        lost.emplace_back(e->second->name, e->second->owner);
        e = entries_.erase(e);
      } else {
        queued.insert(e->second->name);
        ++e;
      }
    }
  }
  log_.log(LogLevel::warning, "etcd session lease {:x} lost ({}): {} held lock(s) lost", session->lease, why,
           lost.size());
  if (!listener_) return;
  for (auto& [name, owner] : lost) listener_->on_lease_lost(name, owner);
  // Waiters re-check: their key went with the lease; they queue again under a new one.
  for (auto& name : queued) listener_->on_change(name);
}

AcquireResult EtcdBackend::try_acquire(const AcquireRequest& req, std::error_code& ec) {
  ec.clear();
  const std::int64_t ttl_s = ttl_seconds(req.ttl);
  if (ttl_s == 0) {
    // Refused before anything is sent: no lease, no key.
    ec = make_error_code(errc::invalid_argument);
    set_error_detail("ttl " + std::to_string(req.ttl.count()) +
                     "ms is beyond etcd's maximum lease TTL of 9000000000s");
    return {};
  }
  const std::string ekey = entry_key(req.name, req.owner);

  for (int attempt = 0; attempt < 4; ++attempt) {
    // My queue entry: reuse it while its session lives, else start a new one.
    std::shared_ptr<Entry> entry;
    std::int64_t known_rev = 0;
    bool keep_watch = false;
    {
      std::lock_guard lk(mu_);
      auto it = entries_.find(ekey);
      // A held entry here means the engine declared that hold lost (its local
      // deadline passed): its key must not be reused, or the old token would be
      // handed out again. It is deleted and this owner queues anew.
      if (it != entries_.end() && it->second->session->alive && it->second->session->requested_s == ttl_s &&
          !it->second->held) {
        entry = it->second;
        known_rev = entry->create_rev;
        keep_watch = entry->watch_id != 0 && !entry->watch_fired;
      } else if (it != entries_.end()) {
        const auto old = it->second;
        entries_.erase(it);
        if (old->session->alive && old->create_rev != 0) orphans_.emplace_back(old->key, old->create_rev);
        if (old->watch_id != 0) cancel_watch(old->watch_id);
      }
    }
    if (!entry) {
      auto session = live_session(ttl_s, ec);
      if (!session) return {};
      entry = std::make_shared<Entry>();
      entry->name = std::string(req.name);
      entry->owner = std::string(req.owner);
      entry->lock_prefix = lock_prefix(req.name);
      entry->session = session;
      std::vector<std::pair<std::string, std::int64_t>> stale;
      {
        std::lock_guard lk(mu_);
        // A key of its own per acquisition attempt, never used before by this
        // client (and the lease names the client): an existing key is never
        // adopted, so a token is never handed out twice.
        entry->key =
            entry->lock_prefix + hex(session->lease) + "-" + hex(static_cast<std::int64_t>(next_key_seq_++));
        // Our keys of this lock whose delete failed would queue ahead of the new
        // key: try them now rather than wait for the keeper.
        for (auto o = orphans_.begin(); o != orphans_.end();) {
          if (o->first.starts_with(entry->lock_prefix)) {
            stale.push_back(std::move(*o));
            o = orphans_.erase(o);
          } else {
            ++o;
          }
        }
      }
      for (auto& [key, rev] : stale) {
        std::error_code dec;
        delete_key(key, rev, dec);
        if (dec) {
          std::lock_guard lk(mu_);
          orphans_.emplace_back(key, rev);
        }
      }
      std::lock_guard lk(mu_);
      entries_[ekey] = entry;
    }
    const auto& session = entry->session;

    // The validity we report must not outlast the lease: it counts from the last
    // keepalive, so refresh a session that is half-way through its TTL first.
    Millis remaining{};
    {
      std::unique_lock lk(mu_);
      remaining = std::chrono::duration_cast<Millis>(session->last_sent + session->ttl - SteadyClock::now());
    }
    if (remaining < session->ttl / 2) {
      if (auto kec = keepalive({session}); kec) {
        ec = kec;
        return {};
      }
      std::lock_guard lk(mu_);
      if (!session->alive) continue;
      remaining = std::chrono::duration_cast<Millis>(session->last_sent + session->ttl - SteadyClock::now());
    }

    // One Txn: create my key if it is not there, and read the lowest key.
    etcdserverpb::TxnRequest txn;
    Compare* cmp = txn.add_compare();
    cmp->set_result(Compare::EQUAL);
    cmp->set_target(Compare::CREATE);
    cmp->set_key(entry->key);
    cmp->set_create_revision(0);
    auto lowest = [&](etcdserverpb::RequestOp* op) {
      RangeRequest* r = op->mutable_request_range();
      r->set_key(entry->lock_prefix);
      r->set_range_end(prefix_end(entry->lock_prefix));
      r->set_limit(1);
      r->set_sort_target(RangeRequest::CREATE);
      r->set_sort_order(RangeRequest::ASCEND);
    };
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(entry->key);
    put->set_value(entry->owner);
    put->set_lease(session->lease);
    lowest(txn.add_success());
    txn.add_failure()->mutable_request_range()->set_key(entry->key);
    lowest(txn.add_failure());

    etcdserverpb::TxnResponse resp;
    const grpc::Status st = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
    if (etcd::Transport::lease_not_found(st)) {
      // The lease ended before our keeper noticed (expired or revoked from outside).
      lose_session(session, "etcd refused a put: lease not found");
      continue;
    }
    if (!st.ok() || resp.responses_size() != 2) {
      if (!st.ok()) {
        set_error(st, ec, "acquire Txn");
      } else {
        ec = make_error_code(errc::protocol_error);
      }
      if (known_rev == 0) {
        // The Txn may have created our key (applied, its answer lost or late): a
        // key that would queue ahead of everybody for as long as this client keeps
        // the session alive. This acquisition is over: the key goes.
        forget_entry(entry);
        std::lock_guard lk(mu_);
        orphans_.emplace_back(entry->key, 0);  // the keeper deletes it within a second
      }
      return {};
    }
    std::int64_t my_rev = 0;
    if (resp.succeeded()) {
      my_rev = resp.header().revision();
      if (known_rev != 0) {
        // Our queued key vanished while its lease lived (deleted from outside):
        // we are back at the end of the queue.
        log_.log(LogLevel::warning, "etcd: queued key of lock \"{}\" was deleted from outside; queued again",
                 entry->name);
      }
    } else {
      // The key exists: only this entry can have created it (an earlier call of
      // the same acquisition, or a retried Txn that was applied), under our lease.
      const auto& mine = resp.responses(0).response_range();
      if (mine.kvs_size() != 1 || mine.kvs(0).lease() != session->lease) {
        ec = make_error_code(errc::protocol_error);
        log_.log(LogLevel::warning, "etcd: queue key of lock \"{}\" exists but is not ours", entry->name);
        return {};
      }
      my_rev = mine.kvs(0).create_revision();
    }
    const auto& low = resp.responses(1).response_range();
    if (low.kvs_size() != 1) {
      ec = make_error_code(errc::protocol_error);
      return {};
    }
    const std::int64_t low_rev = low.kvs(0).create_revision();
    std::int64_t old_watch = 0;
    {
      std::lock_guard lk(mu_);
      if (entry->create_rev != my_rev) keep_watch = false;
      entry->create_rev = my_rev;
      if (low_rev == my_rev) {
        entry->held = true;
        entry->renewed_at = SteadyClock::now();
        old_watch = std::exchange(entry->watch_id, 0);
      }
    }
    if (low_rev == my_rev) {
      if (old_watch != 0) cancel_watch(old_watch);
      return AcquireResult{true, static_cast<std::uint64_t>(my_rev), std::max(remaining, Millis(1)),
                           std::nullopt};
    }

    AcquireResult busy;
    busy.holder_ttl = session->ttl;  // the holder's lease is at most a TTL away
    if (!req.keep_queued) {
      std::error_code dec;
      delete_key(entry->key, my_rev, dec);
      forget_entry(entry);
      if (dec) {
        std::lock_guard lk(mu_);
        orphans_.emplace_back(entry->key, my_rev);
      }
      return busy;
    }
    // Still waiting on the same predecessor whose delete event has not come: no
    // need to look for it again.
    if (keep_watch) return busy;

    // Watch only the key just before mine, from the revision of this read.
    RangeRequest pred;
    pred.set_key(entry->lock_prefix);
    pred.set_range_end(prefix_end(entry->lock_prefix));
    pred.set_max_create_revision(my_rev - 1);
    pred.set_sort_target(RangeRequest::CREATE);
    pred.set_sort_order(RangeRequest::DESCEND);
    pred.set_limit(1);
    pred.set_keys_only(true);
    etcdserverpb::RangeResponse presp;
    const grpc::Status pst = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, pred, &presp); });
    if (!pst.ok()) {
      set_error(pst, ec, "predecessor Range");
      return {};
    }
    if (presp.kvs_size() == 0) continue;  // it went away meanwhile: look again
    add_watch(entry, presp.kvs(0).key(), presp.header().revision() + 1);
    return busy;
  }
  return AcquireResult{};  // busy; the engine re-checks
}

bool EtcdBackend::delete_key(const std::string& key, std::int64_t create_rev, std::error_code& ec) {
  etcdserverpb::TxnRequest txn;
  // create_rev 0: the key's revision is unknown (its creating Txn had no answer).
  // The key is ours alone (session lease + a sequence never reused), so it is
  // deleted as it is.
  if (create_rev != 0) {
    Compare* cmp = txn.add_compare();
    cmp->set_result(Compare::EQUAL);
    cmp->set_target(Compare::CREATE);
    cmp->set_key(key);
    cmp->set_create_revision(create_rev);
  }
  txn.add_success()->mutable_request_delete_range()->set_key(key);
  etcdserverpb::TxnResponse resp;
  etcd::CallInfo info;
  const grpc::Status st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); }, &info);
  if (!st.ok()) {
    set_error(st, ec, "guarded delete Txn");
    return false;
  }
  // A retry after an attempt that may have been applied finds the key gone: that
  // was our own delete.
  return resp.succeeded() || info.maybe_applied;
}

void EtcdBackend::forget_entry(const std::shared_ptr<Entry>& entry) {
  std::int64_t watch_id = 0;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(entry_key(entry->name, entry->owner));
    if (it != entries_.end() && it->second == entry) entries_.erase(it);
    watch_id = std::exchange(entry->watch_id, 0);
  }
  if (watch_id != 0) cancel_watch(watch_id);
}

void EtcdBackend::cancel_acquire(std::string_view name, std::string_view owner) noexcept {
  try {
    std::shared_ptr<Entry> entry;
    std::int64_t rev = 0;
    {
      std::lock_guard lk(mu_);
      auto it = entries_.find(entry_key(name, owner));
      if (it == entries_.end() || it->second->held) return;
      entry = it->second;
      rev = entry->create_rev;
    }
    forget_entry(entry);
    if (rev == 0) return;
    std::error_code ec;
    delete_key(entry->key, rev, ec);
    if (ec) {
      std::lock_guard lk(mu_);
      orphans_.emplace_back(entry->key, rev);
    }
  } catch (...) {
  }
}

ReleaseStatus EtcdBackend::release(std::string_view name, std::string_view owner, std::uint64_t token,
                                   std::error_code& ec) {
  ec.clear();
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(entry_key(name, owner));
    // A token that is not the entry's belongs to an earlier hold of the same owner
    // id: the entry (a later hold) is not touched.
    if (it == entries_.end() || !it->second->held || !it->second->session->alive ||
        it->second->create_rev != static_cast<std::int64_t>(token))
      return ReleaseStatus::not_owner;
    entry = it->second;
  }
  const bool deleted = delete_key(entry->key, static_cast<std::int64_t>(token), ec);
  if (ec) {
    // The key stays until its session ends, and the session lives as long as this
    // client: the keeper retries the delete.
    std::lock_guard lk(mu_);
    orphans_.emplace_back(entry->key, static_cast<std::int64_t>(token));
  }
  forget_entry(entry);
  if (ec) return ReleaseStatus::released;
  return deleted ? ReleaseStatus::released : ReleaseStatus::not_owner;
}

void EtcdBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) {
  ec.clear();
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::shared_ptr<Session>> item_session(items.size());
  {
    std::lock_guard lk(mu_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto it = entries_.find(entry_key(items[i].name, items[i].owner));
      if (it == entries_.end() || !it->second->held || !it->second->session->alive) {
        out[i] = RenewStatus::not_owner;
        continue;
      }
      item_session[i] = it->second->session;
      if (std::find(sessions.begin(), sessions.end(), item_session[i]) == sessions.end()) {
        sessions.push_back(item_session[i]);
      }
    }
  }
  if (sessions.empty()) return;
  const auto sent = SteadyClock::now();
  if ((ec = keepalive(sessions))) return;

  // The lease alone does not prove the hold: the key may have been deleted from
  // outside (etcdctl del) while the lease lives. Read every held key, up to
  // kMaxTxnOps per Txn (one round trip for a usual batch), and compare its
  // create_revision with the token: a missing or re-created key is a loss.
  std::vector<std::size_t> check;
  std::vector<std::shared_ptr<Entry>> entry_of(items.size());
  {
    std::lock_guard lk(mu_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!item_session[i]) continue;
      auto it = entries_.find(entry_key(items[i].name, items[i].owner));
      // A token that is not the entry's is an earlier hold of the same owner id:
      // not ours any more, and the entry (a later hold) is left alone.
      if (!item_session[i]->alive || it == entries_.end() || !it->second->held ||
          it->second->create_rev != static_cast<std::int64_t>(items[i].token)) {
        out[i] = RenewStatus::not_owner;
        item_session[i].reset();
        continue;
      }
      entry_of[i] = it->second;
      check.push_back(i);
    }
  }
  std::vector<std::size_t> gone;
  for (std::size_t from = 0; from < check.size(); from += kMaxTxnOps) {
    const std::size_t to = std::min(check.size(), from + kMaxTxnOps);
    etcdserverpb::TxnRequest txn;
    for (std::size_t j = from; j < to; ++j) {
      RangeRequest* r = txn.add_success()->mutable_request_range();
      r->set_key(entry_of[check[j]]->key);
      r->set_keys_only(true);
    }
    etcdserverpb::TxnResponse resp;
    const grpc::Status st = transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Txn(&ctx, txn, &resp); });
    if (!st.ok()) {
      set_error(st, ec, "renewal key check Txn");
      return;
    }
    if (resp.responses_size() != static_cast<int>(to - from)) {
      ec = make_error_code(errc::protocol_error);
      return;
    }
    for (std::size_t j = from; j < to; ++j) {
      const std::size_t i = check[j];
      const auto& r = resp.responses(static_cast<int>(j - from)).response_range();
      const bool ours = r.kvs_size() == 1 &&
                        r.kvs(0).create_revision() == static_cast<std::int64_t>(items[i].token) &&
                        r.kvs(0).lease() == entry_of[i]->session->lease;
      if (!ours) gone.push_back(i);
    }
  }
  std::lock_guard lk(mu_);
  for (const std::size_t i : gone) {
    out[i] = RenewStatus::not_owner;
    item_session[i].reset();
    // Nothing to delete: the key that backed this hold is gone (a key found there
    // now belongs to someone else).
    auto it = entries_.find(entry_key(items[i].name, items[i].owner));
    if (it != entries_.end() && it->second == entry_of[i]) entries_.erase(it);
    log_.log(LogLevel::warning, "etcd: the key of held lock \"{}\" was deleted from outside: lost",
             items[i].name);
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!item_session[i]) continue;
    out[i] = item_session[i]->alive ? RenewStatus::renewed : RenewStatus::not_owner;
    if (out[i] != RenewStatus::renewed) continue;
    entry_of[i]->renewed_at = sent;
  }
}

LockInfo EtcdBackend::status(std::string_view name, std::error_code& ec) {
  ec.clear();
  const std::string lp = lock_prefix(name);
  RangeRequest req;
  req.set_key(lp);
  req.set_range_end(prefix_end(lp));
  req.set_limit(1);
  req.set_sort_target(RangeRequest::CREATE);
  req.set_sort_order(RangeRequest::ASCEND);
  etcdserverpb::RangeResponse resp;
  grpc::Status st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, req, &resp); });
  if (!st.ok()) {
    set_error(st, ec, "status Range");
    return {};
  }
  LockInfo info;
  info.waiters = resp.count() > 0 ? static_cast<std::uint64_t>(resp.count() - 1) : 0;
  if (resp.kvs_size() == 0) return info;
  const auto& kv = resp.kvs(0);
  info.held = true;
  info.token = static_cast<std::uint64_t>(kv.create_revision());
  info.holder = kv.value();
  etcdserverpb::LeaseTimeToLiveRequest treq;
  treq.set_id(kv.lease());
  etcdserverpb::LeaseTimeToLiveResponse tresp;
  st = transport_.call(
      [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.lease->LeaseTimeToLive(&ctx, treq, &tresp); });
  if (st.ok() && tresp.ttl() > 0) info.ttl_remaining = std::chrono::seconds(tresp.ttl());
  return info;
}

// ---- watches ---------------------------------------------------------------

std::shared_ptr<WatchStream> EtcdBackend::open_stream_locked() {
  if (stream_ && !stream_->broken) return stream_;
  if (stream_) {
    retired_.push_back(std::move(stream_));
  }
  // Join readers that have finished.
  for (auto it = retired_.begin(); it != retired_.end();) {
    if ((*it)->done) {
      (*it)->reader.join();
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
  auto s = std::make_shared<WatchStream>();
  // No real deadline: the stream lives as long as the client.
  transport_.prepare(s->ctx, std::chrono::hours(24 * 365));
  s->rw = transport_.stubs(transport_.current()).watch->Watch(&s->ctx);
  s->reader = std::thread([this, s] { reader_main(s); });
  stream_ = s;
  return s;
}

void EtcdBackend::add_watch(const std::shared_ptr<Entry>& entry, const std::string& key,
                            std::int64_t start_rev) {
  std::int64_t old_id = 0;
  std::int64_t id = 0;
  std::shared_ptr<WatchStream> stream;
  {
    std::lock_guard lk(mu_);
    std::lock_guard wl(watch_mu_);
    if (stopping_) return;
    stream = open_stream_locked();
    id = next_watch_id_++;
    watches_[id] = entry_key(entry->name, entry->owner);
    old_id = std::exchange(entry->watch_id, id);
    entry->watch_fired = false;
  }
  if (old_id != 0) cancel_watch(old_id);
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(key);
  create->set_start_revision(start_rev);
  create->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  create->set_watch_id(id);
  std::lock_guard wl(stream->write_mu);
  if (!stream->rw->Write(req)) {
    // The reader sees the break and wakes every waiter, this one included.
    log_.log(LogLevel::debug, "etcd watch stream write failed");
  }
}

void EtcdBackend::cancel_watch(std::int64_t watch_id) noexcept {
  std::shared_ptr<WatchStream> stream;
  {
    std::lock_guard wl(watch_mu_);
    if (watches_.erase(watch_id) == 0) return;
    stream = stream_;
  }
  if (!stream || stream->broken) return;
  try {
    etcdserverpb::WatchRequest req;
    req.mutable_cancel_request()->set_watch_id(watch_id);
    std::lock_guard wl(stream->write_mu);
    stream->rw->Write(req);
  } catch (...) {
  }
}

void EtcdBackend::reader_main(std::shared_ptr<WatchStream> stream) {
  etcdserverpb::WatchResponse resp;
  auto fire = [&](std::int64_t watch_id) {
    std::string ekey;
    {
      std::lock_guard wl(watch_mu_);
      auto it = watches_.find(watch_id);
      if (it == watches_.end()) return;
      ekey = it->second;
      watches_.erase(it);
    }
    std::string name;
    {
      std::lock_guard lk(mu_);
      auto it = entries_.find(ekey);
      if (it == entries_.end() || it->second->watch_id != watch_id) return;
      it->second->watch_fired = true;
      it->second->watch_id = 0;
      name = it->second->name;
    }
    if (listener_) listener_->on_change(name);
  };
  while (stream->rw->Read(&resp)) {
    if (resp.canceled()) {
      fire(resp.watch_id());  // compacted, or cancelled by the server: re-check
      continue;
    }
    for (const auto& ev : resp.events()) {
      if (ev.type() == mvccpb::Event::DELETE) {
        fire(resp.watch_id());
        std::lock_guard wl(stream->write_mu);
        etcdserverpb::WatchRequest cancel;
        cancel.mutable_cancel_request()->set_watch_id(resp.watch_id());
        stream->rw->Write(cancel);
        break;
      }
    }
  }
  const grpc::Status st = stream->rw->Finish();
  std::vector<std::int64_t> ids;
  {
    std::lock_guard wl(watch_mu_);
    stream->broken = true;
    if (stopping_) {
      stream->done = true;
      return;
    }
    if (stream_ == stream) transport_.advance(transport_.current());
    for (auto& [id, k] : watches_) ids.push_back(id);
  }
  log_.log(LogLevel::info, "etcd watch stream ended ({}); waiters re-check", st.error_message());
  if (etcd::Transport::invalid_token(st) && transport_.has_auth()) {
    std::string why;
    (void)transport_.authenticate(why);
  }
  // Do not spin if the stream breaks at once again.
  std::this_thread::sleep_for(Millis(50));
  for (auto id : ids) fire(id);
  stream->done = true;
}

// ---- keeper ----------------------------------------------------------------

// Keeps sessions alive while nothing is held (waiters' keys hang on them too) and
// retries deletes that failed.
void EtcdBackend::keeper_main(std::stop_token st) {
  while (!st.stop_requested()) {
    std::vector<std::shared_ptr<Session>> due;
    std::vector<std::pair<std::string, std::int64_t>> orphans;
    {
      std::unique_lock lk(mu_);
      auto wake = SteadyClock::now() + std::chrono::seconds(1);
      for (auto& [ttl, s] : sessions_) {
        if (s->alive) wake = std::min(wake, s->next_keepalive);
      }
      const std::uint64_t seen = keeper_generation_;
      keeper_cv_.wait_until(lk, st, wake, [&] { return keeper_generation_ != seen; });
      if (st.stop_requested()) return;
      const auto now = SteadyClock::now();
      for (auto& [ttl, s] : sessions_) {
        if (s->alive && s->next_keepalive <= now) due.push_back(s);
      }
      // A hold the engine stopped renewing for a whole session TTL was declared
      // lost by the engine (its local deadline is shorter): its key would block
      // the lock for as long as this client keeps the session alive.
      for (auto it = entries_.begin(); it != entries_.end();) {
        const auto& e = it->second;
        if (e->held && e->session->alive && now - e->renewed_at > e->session->ttl) {
          log_.log(LogLevel::info, "etcd: deleting the key of lost lock \"{}\"", e->name);
          orphans_.emplace_back(e->key, e->create_rev);
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
      orphans.swap(orphans_);
    }
    keepalive(due);
    for (auto& [key, rev] : orphans) {
      std::error_code ec;
      delete_key(key, rev, ec);
      if (ec) {
        std::lock_guard lk(mu_);
        orphans_.emplace_back(key, rev);
      }
    }
  }
}

}  // namespace

// ---- factory ---------------------------------------------------------------

std::unique_ptr<Backend> make_etcd_backend(const Url& url, const ClientOptions& opts, std::error_code& ec,
                                           std::string& why) {
  etcd::UrlConfig parsed;
  if ((ec = etcd::parse_url(url, opts, parsed, why))) return nullptr;
  auto backend = std::make_unique<EtcdBackend>(std::move(parsed.transport), std::move(parsed.prefix),
                                               url.redacted(), opts);
  if ((ec = backend->probe(why))) {
    why = "cannot use etcd at " + url.redacted() + ": " + why;
    return nullptr;
  }
  backend->start();
  return backend;
}

}  // namespace distlock::detail
