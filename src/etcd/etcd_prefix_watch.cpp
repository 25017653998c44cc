// Watching every lock under a name prefix on etcd:// (Backend::watch_prefix, docs/etcd.md
// "Watching locks").
//
// Each watch reads the state once (the lock keys of the names under the prefix and their
// lock-delay markers, paged, every page pinned at the first page's revision R), then opens
// a Watch stream of its own on the backend's whole key prefix from R + 1: nothing committed
// between the read and the watch is missed. It keeps each name's queue (create_revision →
// key, value) and marker, and after each revision's events works out the holder the way the
// rest of the backend does (etcd_delay.cpp first_holds, etcd_backend.cpp status): the
// lowest key of the queue, unless its value is a revoke's "@revoked\n..." or a lost
// holder's lock-delay still runs. A change of holder is reported, in revision order:
//   - the old holder's end: `revoked` when its key now carries the revoke value, `released`
//     when its key was deleted in a revision that also put a release mark naming that key
//     (etcd_queue.cpp delete_place: only the release path writes one), `lost` otherwise (its
//     lease expired or was revoked, the engine's forget of a lost lease, an etcdctl del);
//   - the new holder's start: `acquired`, token = the key's create_revision (the backend's
//     fencing token).
// One watch over the whole prefix (not only the names under the name prefix) because the
// markers and the release marks live in namespaces of their own: a single etcd watch keeps
// every event in revision order, two would not. Events of other names are dropped here.
//
// A broken stream is a gap (LockEventSink::on_gap) at once; the watch then resumes from
// the revision after the last one it delivered (etcd replays every event since, so the
// state it keeps stays exact), on the next endpoint, retrying with a growing wait (100 ms
// .. 2 s). A watch the server cancels (its start revision was compacted meanwhile:
// ErrCompacted) is a gap too; the state is then read again, a new stream watches from the
// revision after that read, and a second gap after it makes the API's re-list read a state
// no older than the one this watch goes on from.
//
// sync writes a marker key (P/%sync/<session lease>-<watch>, on a session lease, so it goes
// with the client) and waits until the stream has delivered its revision: one watch
// delivers a revision only after every earlier one, so every event committed before the
// marker has been given to the sink. A progress request was not used: etcd 3.4 answers one
// only while every watcher of the stream is synced, and drops it otherwise.
#include <functional>
#include <set>

#include "etcd/etcd_backend_impl.hpp"

namespace distlock::detail::etcd {

namespace {

// Keys per page of the state read.
constexpr std::int64_t kWatchPage = 1000;
// Attempts of the state read when the revision it pinned was compacted meanwhile.
constexpr int kStateReadAttempts = 3;
// The session TTL of the sync markers' lease (kept alive by the backend's keeper).
constexpr std::int64_t kSyncLeaseTtlS = 10;
// Wait before opening a stream again after a break: doubles from the first to the last.
constexpr Millis kWatchRetryFirst{100};
constexpr Millis kWatchRetryMax{2000};

std::atomic<std::uint64_t> next_prefix_watch_seq{1};

}  // namespace

class EtcdPrefixWatch final : public PrefixWatch {
 public:
  EtcdPrefixWatch(EtcdBackend& backend, std::string name_prefix, LockEventSink& sink)
      : b_(backend),
        base_(backend.prefix_.empty() ? std::string() : backend.prefix_ + "/"),
        name_prefix_(std::move(name_prefix)),
        sink_(sink) {}

  ~EtcdPrefixWatch() override {
    {
      LockGuard lk(mu_);
      stopping_ = true;
      if (ctx_) ctx_->TryCancel();
    }
    cv_.notify_all();
    if (reader_.joinable()) reader_.join();
  }

  // Reads the state and opens the stream; returns once etcd confirmed the watch (a change
  // committed after this returns has a revision above the read's: it is delivered).
  void start(Error& ec) {
    reader_ = std::thread([this] { run(); });
    const Millis bound = 3 * b_.transport_.config().command_timeout + b_.transport_.config().connect_timeout;
    const auto until = std::chrono::steady_clock::now() + bound;
    UniqueLock lk(mu_);
    while (phase_ == Phase::starting && cv_.wait_until(lk.native(), until) != std::cv_status::timeout) {
    }
    if (phase_ == Phase::starting) {
      ec.fail(errc::backend_unavailable, "etcd did not confirm the Watch of the lock keys within " +
                                             std::to_string(bound.count()) + " ms");
      return;
    }
    if (phase_ == Phase::failed) ec = first_error_;
  }

  bool sync(Error& ec) override {
    std::uint64_t epoch = 0;
    {
      LockGuard lk(mu_);
      epoch = epoch_;
      if (!live_) {
        ec.fail(errc::backend_unavailable,
                "watch of \"" + name_prefix_ + "\": the etcd Watch stream is being established again");
        return false;
      }
    }
    std::int64_t rev = 0;
    for (int attempt = 1; attempt <= 2 && rev == 0; ++attempt) {
      auto session = b_.live_session(kSyncLeaseTtlS, ec);
      if (!session) return false;
      etcdserverpb::PutRequest put;
      put.set_key(base_ + std::string(kSyncDir) + hex(session->lease) + "-" +
                  hex(static_cast<std::int64_t>(seq_)));
      put.set_value(std::to_string(++sync_count_));
      put.set_lease(session->lease);
      etcdserverpb::PutResponse resp;
      const grpc::Status st = b_.transport_.call(
          [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Put(&ctx, put, &resp); });
      if (etcd::Transport::lease_not_found(st) && attempt == 1) {
        b_.lose_session(session, "etcd refused a watch's sync marker: lease not found");
        continue;
      }
      if (!st.ok()) {
        b_.set_error(st, ec, "watch sync marker Put");
        return false;
      }
      rev = resp.header().revision();
    }
    if (rev == 0) {
      ec.fail(errc::backend_unavailable, "watch of \"" + name_prefix_ + "\": no lease for the sync marker");
      return false;
    }
    const Millis bound = 2 * b_.transport_.config().command_timeout;
    const auto until = std::chrono::steady_clock::now() + bound;
    UniqueLock lk(mu_);
    while (!stopping_ && epoch_ == epoch && processed_rev_ < rev &&
           cv_.wait_until(lk.native(), until) != std::cv_status::timeout) {
    }
    if (!stopping_ && epoch_ == epoch && processed_rev_ < rev) {
      ec.fail(errc::backend_unavailable, "watch of \"" + name_prefix_ +
                                             "\": the etcd Watch stream did not deliver the sync marker's "
                                             "revision " +
                                             std::to_string(rev) + " within " +
                                             std::to_string(bound.count()) + " ms");
      return false;
    }
    if (epoch_ != epoch || stopping_) {
      ec.fail(errc::backend_unavailable,
              "watch of \"" + name_prefix_ + "\": the etcd Watch stream broke meanwhile (reported as a gap)");
      return false;
    }
    return true;
  }

 private:
  enum class Phase { starting, running, failed };
  struct QueuedKey {
    std::string key;
    std::string value;
  };
  struct Holder {
    std::int64_t token = 0;
    std::string owner;
    std::string key;
  };
  struct NameState {
    std::map<std::int64_t, QueuedKey> queue;   // create_revision → key
    std::map<std::string, std::int64_t> revs;  // key → create_revision
    std::optional<std::string> marker;         // the lock-delay marker's value
    std::optional<Holder> reported;            // the holder as last reported (or read)
  };
  using Names = std::map<std::string, NameState>;
  // What one revision did besides the queues.
  struct RevisionChanges {
    std::set<std::string> names;
    std::set<std::string> deleted;   // lock keys deleted
    std::set<std::string> released;  // keys named by a release mark put
  };

  // ---- keys

  enum class KeyKind { other, lock, marker, release_mark };
  // The kind of `key` and, for a lock key or a marker of a name under the prefix, the name.
  KeyKind classify(const std::string& key, std::string& name) const {
    if (!key.starts_with(base_)) return KeyKind::other;
    const std::string_view rest = std::string_view(key).substr(base_.size());
    if (rest.starts_with(kReleasedDir)) return KeyKind::release_mark;
    if (rest.starts_with(kDelayDir)) {
      auto n = decode_name(rest.substr(kDelayDir.size()));
      if (!n || !n->starts_with(name_prefix_)) return KeyKind::other;
      name = std::move(*n);
      return KeyKind::marker;
    }
    const auto slash = rest.find('/');
    if (slash == std::string_view::npos || slash == 0) return KeyKind::other;
    auto n = decode_name(rest.substr(0, slash));  // the other namespaces never decode
    if (!n || !n->starts_with(name_prefix_)) return KeyKind::other;
    name = std::move(*n);
    return KeyKind::lock;
  }

  static std::optional<Holder> holder_of(const NameState& ns) {
    if (ns.queue.empty()) return std::nullopt;
    const auto& [rev, first] = *ns.queue.begin();
    if (std::string_view(first.value).starts_with(kRevokedValue)) return std::nullopt;
    if (ns.marker && !marker_lets_first_hold(*ns.marker, rev)) return std::nullopt;
    return Holder{rev, first.value, first.key};
  }

  static void put_key(NameState& ns, const mvccpb::KeyValue& kv) {
    auto it = ns.revs.find(kv.key());
    if (it != ns.revs.end() && it->second != kv.create_revision()) {
      ns.queue.erase(it->second);
      ns.revs.erase(it);
      it = ns.revs.end();
    }
    ns.revs[kv.key()] = kv.create_revision();
    ns.queue[kv.create_revision()] = QueuedKey{kv.key(), kv.value()};
  }

  // ---- the state read

  // Every key of [from, end) at revision `rev` (0: the current one, then set), in pages.
  grpc::Status read_range(const std::string& from, const std::string& end, std::int64_t& rev,
                          const std::function<void(const mvccpb::KeyValue&)>& each) {
    std::string cursor = from.empty() ? std::string(1, '\0') : from;
    while (true) {
      RangeRequest req;
      req.set_key(cursor);
      req.set_range_end(end);
      req.set_limit(kWatchPage);
      req.set_revision(rev);
      etcdserverpb::RangeResponse resp;
      const grpc::Status st = b_.transport_.call(
          [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, req, &resp); });
      if (!st.ok()) return st;
      if (rev == 0) rev = resp.header().revision();
      for (const auto& kv : resp.kvs()) each(kv);
      if (!resp.more() || resp.kvs_size() == 0) return st;
      cursor = resp.kvs(resp.kvs_size() - 1).key();
      cursor.push_back('\0');
    }
  }

  // The lock keys and markers of the names under the prefix, at one revision (returned).
  std::int64_t read_state(Names& names, Error& ec) {
    for (int attempt = 1;; ++attempt) {
      names.clear();
      std::int64_t rev = 0;
      std::string name;
      auto lock_key = [&](const mvccpb::KeyValue& kv) {
        if (classify(kv.key(), name) == KeyKind::lock) put_key(names[name], kv);
      };
      auto marker = [&](const mvccpb::KeyValue& kv) {
        if (classify(kv.key(), name) == KeyKind::marker) names[name].marker = kv.value();
      };
      grpc::Status st;
      if (name_prefix_.empty()) {
        // Every encoded name sorts below "%3" or above "%" ('%' is always followed by "2"
        // in one); the other namespaces ("%delay/", "%records/", ...) lie between.
        st = read_range(base_, base_ + "%3", rev, lock_key);
        if (st.ok()) st = read_range(base_ + "&", prefix_end(base_), rev, lock_key);
      } else {
        const std::string from = base_ + encode_name(name_prefix_);
        st = read_range(from, prefix_end(from), rev, lock_key);
      }
      const std::string mfrom = base_ + std::string(kDelayDir) + encode_name(name_prefix_);
      if (st.ok()) st = read_range(mfrom, prefix_end(mfrom), rev, marker);
      if (st.ok()) {
        for (auto& [n, ns] : names) ns.reported = holder_of(ns);
        return rev;
      }
      if (st.error_code() == grpc::StatusCode::OUT_OF_RANGE && attempt < kStateReadAttempts) continue;
      b_.set_error(st, ec, "watch state Range");
      return 0;
    }
  }

  // ---- the stream

  using Stream = grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>;

  // Opens a stream watching from revision `from` and waits for etcd to confirm the watch;
  // `from` 0: reads the state first and watches from the revision after it. On success
  // `stream` and `ctx` are live (and names_ is the state read).
  bool establish(std::int64_t from, std::shared_ptr<grpc::ClientContext>& ctx,
                 std::unique_ptr<Stream>& stream, std::size_t& endpoint, Error& ec) {
    Names names;
    std::int64_t rev = from - 1;
    if (from == 0) {
      rev = read_state(names, ec);
      if (rev == 0) return false;
    } else if (!still_ahead(rev, ec)) {
      return false;
    }
    ctx = std::make_shared<grpc::ClientContext>();
    b_.transport_.prepare(*ctx, std::chrono::hours(24 * 365));  // lives as long as the watch
    // A member cut off from its peers keeps the stream open but commits nothing more: without
    // this, etcd leaves the stream silent for as long as the partition lasts. With it, etcd
    // refuses the stream on a member without a leader and cancels a live one once the member
    // has had none for 3 election timeouts ("etcdserver: no leader"): a break, so a gap and a
    // resume on the next endpoint.
    ctx->AddMetadata("hasleader", "true");
    {
      LockGuard lk(mu_);
      if (stopping_) return false;
      ctx_ = ctx;
    }
    endpoint = b_.transport_.current();
    stream = b_.transport_.stubs(endpoint).watch->Watch(ctx.get());
    etcdserverpb::WatchRequest req;
    auto* create = req.mutable_create_request();
    create->set_key(base_.empty() ? std::string(1, '\0') : base_);
    create->set_range_end(prefix_end(base_));
    create->set_start_revision(rev + 1);
    etcdserverpb::WatchResponse resp;
    b_.transport_.count_exchange();
    if (!stream->Write(req) || !stream->Read(&resp)) {
      const grpc::Status st = stream->Finish();
      stream.reset();
      b_.set_error(st.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended") : st, ec,
                   "Watch of the lock keys");
      return false;
    }
    if (resp.canceled() && resp.compact_revision() > 0 && from != 0) {
      compacted_ = resp.compact_revision();  // the resume revision is gone: read the state again
      ctx->TryCancel();
      (void)stream->Finish();
      stream.reset();
      ec.fail(errc::backend_unavailable,
              "etcd compacted the revisions up to " + std::to_string(resp.compact_revision()));
      return false;
    }
    if (!resp.created() || resp.canceled()) {
      ec.fail(errc::backend_unavailable,
              "etcd refused the Watch of the lock keys from revision " + std::to_string(rev + 1) + ": " +
                  (resp.compact_revision() > 0
                       ? "compacted up to revision " + std::to_string(resp.compact_revision())
                       : resp.cancel_reason()));
      ctx->TryCancel();
      (void)stream->Finish();
      stream.reset();
      return false;
    }
    if (from == 0) names_ = std::move(names);
    LockGuard lk(mu_);
    if (from == 0) processed_rev_ = rev;
    live_ = true;
    return true;
  }

  // True when the cluster has reached revision `seen` (a linearizable read: a lagging member
  // does not count). A cluster behind it was wiped or replaced (its revisions started again):
  // a watch from `seen` + 1 would wait, silently, for revisions that are not the ones missed,
  // so went_back_ is set and the state is read again, like after a compaction.
  bool still_ahead(std::int64_t seen, Error& ec) {
    RangeRequest req;
    req.set_key(base_ + std::string(kSyncDir));  // one key: only the header's revision matters
    req.set_count_only(true);
    etcdserverpb::RangeResponse resp;
    const grpc::Status st = b_.transport_.call(
        [&](etcd::Stubs& s, grpc::ClientContext& ctx) { return s.kv->Range(&ctx, req, &resp); });
    if (!st.ok()) {
      b_.set_error(st, ec, "watch revision Range");
      return false;
    }
    if (resp.header().revision() >= seen) return true;
    went_back_ = resp.header().revision();
    ec.fail(errc::backend_unavailable,
            "etcd's revision went back from " + std::to_string(seen) + " to " + std::to_string(went_back_));
    return false;
  }

  // Applies one revision's events (all of one revision) and reports the changes of holder.
  void apply_revision(const std::vector<const mvccpb::Event*>& events) {
    RevisionChanges ch;
    std::string name;
    for (const mvccpb::Event* ev : events) {
      const auto& kv = ev->kv();
      const bool put = ev->type() == mvccpb::Event::PUT;
      switch (classify(kv.key(), name)) {
        case KeyKind::other: break;
        case KeyKind::release_mark:
          if (put) ch.released.insert(kv.value());
          break;
        case KeyKind::marker: {
          NameState& ns = names_[name];
          if (put) {
            ns.marker = kv.value();
          } else {
            ns.marker.reset();
          }
          ch.names.insert(name);
          break;
        }
        case KeyKind::lock: {
          NameState& ns = names_[name];
          if (put) {
            put_key(ns, kv);
          } else if (auto it = ns.revs.find(kv.key()); it != ns.revs.end()) {
            ns.queue.erase(it->second);
            ns.revs.erase(it);
            ch.deleted.insert(kv.key());
          }
          ch.names.insert(name);
          break;
        }
      }
    }
    for (const std::string& n : ch.names) {
      auto it = names_.find(n);
      if (it == names_.end()) continue;
      NameState& ns = it->second;
      const std::optional<Holder> now = holder_of(ns);
      const std::optional<Holder>& was = ns.reported;
      if (was && (!now || now->token != was->token)) {
        LockEvent end;
        end.kind = LockEvent::Kind::lost;
        auto q = ns.queue.find(was->token);
        if (q != ns.queue.end() && std::string_view(q->second.value).starts_with(kRevokedValue)) {
          end.kind = LockEvent::Kind::revoked;
        } else if (q == ns.queue.end() && ch.deleted.count(was->key) != 0 &&
                   ch.released.count(was->key) != 0) {
          end.kind = LockEvent::Kind::released;
        }
        if (end.kind == LockEvent::Kind::lost)
          end.detail =
              "its key was deleted without a release (its lease expired or was revoked, its client declared "
              "it "
              "lost, or it was deleted from outside)";
        end.name = n;
        end.token = static_cast<std::uint64_t>(was->token);
        end.owner = was->owner;
        sink_.on_event(std::move(end));
      }
      if (now && (!was || now->token != was->token)) {
        LockEvent acq;
        acq.kind = LockEvent::Kind::acquired;
        acq.name = n;
        acq.token = static_cast<std::uint64_t>(now->token);
        acq.owner = now->owner;
        sink_.on_event(std::move(acq));
      }
      ns.reported = now;
      if (ns.queue.empty() && !ns.marker) names_.erase(it);
    }
  }

  // Applies a response's events revision by revision (etcd never splits a revision across
  // responses of an unfragmented watch).
  void apply_response(const etcdserverpb::WatchResponse& resp) {
    std::vector<const mvccpb::Event*> group;
    std::int64_t rev = 0;
    for (const auto& ev : resp.events()) {
      if (!group.empty() && ev.kv().mod_revision() != rev) {
        apply_revision(group);
        group.clear();
      }
      rev = ev.kv().mod_revision();
      group.push_back(&ev);
    }
    if (!group.empty()) apply_revision(group);
    if (rev != 0) {
      {
        LockGuard lk(mu_);
        processed_rev_ = std::max(processed_rev_, rev);
      }
      cv_.notify_all();
    }
  }

  // Marks the watch broken (a sync in flight fails) and reports the gap.
  void interrupted(const std::string& reason) {
    {
      LockGuard lk(mu_);
      live_ = false;
      ++epoch_;
      ctx_.reset();
      if (stopping_) return;
    }
    cv_.notify_all();
    b_.log_.log(LogLevel::info, "etcd watch of \"{}\": {}", name_prefix_, reason);
    sink_.on_gap(reason);
  }

  // Waits `d` unless stopped; false when stopped.
  bool pause(Millis d) {
    const auto until = std::chrono::steady_clock::now() + d;
    UniqueLock lk(mu_);
    while (!stopping_ && cv_.wait_until(lk.native(), until) != std::cv_status::timeout) {
    }
    return !stopping_;
  }

  void run() {
    std::shared_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<Stream> stream;
    std::size_t endpoint = 0;
    {
      Error ec;
      const bool ok = establish(0, ctx, stream, endpoint, ec);
      {
        LockGuard lk(mu_);
        phase_ = ok ? Phase::running : Phase::failed;
        if (!ok) first_error_ = ec;
      }
      cv_.notify_all();
      if (!ok) return;
    }
    Millis retry = kWatchRetryFirst;
    while (true) {
      etcdserverpb::WatchResponse resp;
      std::string why;
      bool reread = false;  // the watch cannot go on from where it was: read the state again
      while (stream->Read(&resp)) {
        if (resp.canceled()) {
          reread = true;
          why = resp.compact_revision() > 0
                    ? "etcd compacted the revisions up to " + std::to_string(resp.compact_revision()) +
                          " before the watch delivered them: events were missed; the state is read again"
                    : "etcd cancelled the watch (" + resp.cancel_reason() + "): the state is read again";
          ctx->TryCancel();
          break;
        }
        apply_response(resp);
        retry = kWatchRetryFirst;
      }
      const grpc::Status st = stream->Finish();
      stream.reset();
      std::int64_t seen = 0;
      {
        LockGuard lk(mu_);
        if (stopping_) return;
        seen = processed_rev_;
      }
      if (!reread) {
        why = "the etcd Watch stream broke (" + st.error_message() + "): resuming from revision " +
              std::to_string(seen + 1);
        b_.transport_.advance(endpoint);
        if (etcd::Transport::invalid_token(st) && b_.transport_.has_auth()) {
          (void)b_.transport_.authenticate();
        }
      }
      interrupted(why);
      // Resume from the revision after the last one delivered (etcd replays every event
      // since, unless compacted: then the server cancels the watch, and the state is read
      // again); each failed attempt waits longer (bounded).
      while (true) {
        if (!pause(retry)) return;
        retry = std::min(retry * 2, kWatchRetryMax);
        Error ec;
        if (establish(reread ? 0 : seen + 1, ctx, stream, endpoint, ec)) break;
        if (went_back_ != 0) {
          reread = true;
          sink_.on_gap("etcd's revision went back from " + std::to_string(seen) + " to " +
                       std::to_string(std::exchange(went_back_, 0)) +
                       " (a server wiped or replaced): events were missed; the state is read again");
          continue;
        }
        if (compacted_ != 0) {
          reread = true;
          sink_.on_gap("etcd compacted the revisions up to " + std::to_string(std::exchange(compacted_, 0)) +
                       " before the watch delivered them: events were missed; the state is read again");
          continue;
        }
        {
          LockGuard lk(mu_);
          if (stopping_) return;
        }
        b_.transport_.advance(endpoint);
        b_.log_.log(LogLevel::debug, "etcd watch of \"{}\" not established again: {}", name_prefix_,
                    ec.detail());
      }
      if (reread) {
        // After the read, so that the API's re-list reads a state no older than this one.
        std::int64_t rev = 0;
        {
          LockGuard lk(mu_);
          rev = processed_rev_;
        }
        sink_.on_gap("the etcd watch read the state again at revision " + std::to_string(rev) +
                     " and watches from revision " + std::to_string(rev + 1));
      }
    }
  }

  EtcdBackend& b_;
  const std::string base_;  // "<URL prefix>/" (empty without one)
  const std::string name_prefix_;
  LockEventSink& sink_;
  const std::uint64_t seq_ = next_prefix_watch_seq.fetch_add(1);
  std::atomic<std::uint64_t> sync_count_{0};
  std::int64_t compacted_ = 0;  // the reader thread's: establish found its resume revision compacted
  std::int64_t went_back_ = 0;  // the reader thread's: establish found the cluster behind it (its revision)
  Names names_;                 // the reader thread's (start() waits for its first read)

  AnnotatedMutex mu_;
  std::condition_variable cv_;  // waited on through mu_.native()
  Phase phase_ DISTLOCK_GUARDED_BY(mu_) = Phase::starting;
  Error first_error_ DISTLOCK_GUARDED_BY(mu_);
  bool stopping_ DISTLOCK_GUARDED_BY(mu_) = false;
  bool live_ DISTLOCK_GUARDED_BY(mu_) = false;
  std::uint64_t epoch_ DISTLOCK_GUARDED_BY(mu_) = 0;                   // bumped at every interruption
  std::int64_t processed_rev_ DISTLOCK_GUARDED_BY(mu_) = 0;            // every event up to it delivered
  std::shared_ptr<grpc::ClientContext> ctx_ DISTLOCK_GUARDED_BY(mu_);  // the live stream's
  std::thread reader_;
};

std::unique_ptr<PrefixWatch> EtcdBackend::watch_prefix(std::string_view prefix, LockEventSink& sink,
                                                       Error& ec) {
  auto w = std::make_unique<EtcdPrefixWatch>(*this, std::string(prefix), sink);
  w->start(ec);
  if (ec) {
    ec.set_detail("cannot watch \"" + std::string(prefix) + "\": " + ec.detail());
    return nullptr;
  }
  return w;
}

}  // namespace distlock::detail::etcd
