// Watching every lock under a name prefix on redis+cluster:// (Backend::watch_prefix).
//
// The lock scripts of slot s SPUBLISH every change on the sharded channel
// "<prefix>:events:{<tag of s>}" (events_channel; redis/lock_scripts.hpp change_event_lua)
// while the node has a subscriber of that channel (PUBSUB SHARDNUMSUB in the script; this
// watch's confirmed subscriptions are what it counts: docs/redis-cluster.md "Watching
// locks"). The message is redis://'s: "<kind> <token> <owner length> <owner><lock
// key>". A name lives in one slot, a script runs atomically and a node delivers one
// connection's messages in the order it ran them, so per name the messages come in token
// order.
//
// A watch subscribes to all 16,384 channels: one subscriber connection of its own per
// master, the SSUBSCRIBEs of that master's slots pipelined on it. It returns once every
// subscription is confirmed.
//
// Gaps (the API layer re-lists after each, src/api/watch.cpp):
//   - a master's subscriber connection broke, or the master dropped a channel (its slot
//     migrated away, or the master became a replica): a gap at once;
//   - then the watch thread reads the slot map again and subscribes every slot's channel
//     on the master now serving it, retrying (50 ms doubling to 1 s) until every channel
//     is live again; then a second gap, so the re-list it causes reads a state after which
//     nothing can be missed. When a master's connection broke (it may have restarted
//     without persistence) or a slot's old master serves no slot any more (a failover),
//     that gap is on_source_replaced: the node now serving may lack changes already
//     delivered.
//   - every kMapCheckEvery (1 s) while all is live, the watch thread reads the slot map
//     (one CLUSTER SLOTS per watch): a slot whose master in the map is not the node its
//     channel is subscribed on is treated as dropped there (a gap, then as above). This
//     finds a failover or move the old master did not signal by dropping the channel (it
//     was cut off from the other nodes but not from this process).
// A change committed on a slot's importing node during a migration (a script sent there
// after ASK) goes to that node's subscribers only: this watch hears of it by the gap when
// the slot's migration ends (the old node drops the channel then), not sooner.
//
// `sync` publishes a marker "sync <n> <id>" on one subscribed channel of every master and
// waits until each came back: messages of one node reach one connection in order, so every
// change those masters committed before the markers has been delivered. It fails (no
// barrier) while any channel is not live.
#include <condition_variable>
#include <random>

#include "engine/watch_payload.hpp"
#include "rediscluster/cluster_backend_impl.hpp"

namespace distlock::detail::rediscluster {

namespace {

constexpr Millis kRetryFirst{50};
constexpr Millis kRetryMost{1000};
// The slot map is read this often while every channel is live: a master change the old master
// did not signal (it kept the channel: cut off from the other nodes, not from us) is a gap
// within this + one CLUSTER SLOTS.
constexpr Millis kMapCheckEvery{1000};

std::string random_id() {
  std::random_device rd;
  const std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return std::to_string(v);
}

}  // namespace

class ClusterPrefixWatch final : public PrefixWatch {
 public:
  ClusterPrefixWatch(ClusterBackend& backend, std::string name_prefix, LockEventSink& sink)
      : backend_(backend),
        timeout_(backend.base_.connect_timeout + backend.base_.command_timeout),
        channel_head_(backend.prefix_ + ":events:{"),
        name_prefix_(std::move(name_prefix)),
        sink_(sink),
        at_(kSlots, nullptr),
        dropped_(kSlots, false) {}

  ~ClusterPrefixWatch() override {
    {
      LockGuard lk(mu_);
      stop_ = true;
    }
    stopping_.store(true);
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    // Subscriber threads call back into this object (and lock mu_): stopped outside it.
    std::vector<std::unique_ptr<redis::Subscriber>> subs;
    {
      LockGuard lk(mu_);
      for (auto& [node, ns] : subs_) subs.push_back(std::move(ns.sub));
    }
    subs.clear();
  }

  // Subscribes every slot's channel on its master; live when it returns without error.
  void start(Error& ec) {
    if (!subscribe_all(ec)) return;
    thread_ = std::thread([this] { run(); });
  }

  bool sync(Error& ec) override {
    std::map<Node*, std::uint16_t> reps;  // one subscribed slot per master
    std::uint64_t n = 0;
    {
      LockGuard lk(mu_);
      for (std::size_t s = 0; s < kSlots; ++s) {
        if (at_[s] == nullptr || dropped_[s]) {
          ec.fail(errc::backend_unavailable, "watch of \"" + name_prefix_ +
                                                 "\": the events channel of slot " + std::to_string(s) +
                                                 " is not subscribed (being moved)");
          return false;
        }
        reps.emplace(at_[s], static_cast<std::uint16_t>(s));
      }
      for (auto& [node, ns] : subs_) {
        if (ns.sub->pending() != 0) {
          ec.fail(errc::backend_unavailable, "watch of \"" + name_prefix_ +
                                                 "\": the subscriber connection to " + node->opts.describe() +
                                                 " is not live: " + ns.sub->last_failure().detail());
          return false;
        }
      }
      n = ++sync_sent_;
      sync_seen_[n] = 0;
    }
    auto forget = [&] {
      LockGuard lk(mu_);
      sync_seen_.erase(n);
    };
    const std::string marker = "sync " + std::to_string(n) + " " + id_;
    for (auto& [node, slot] : reps) {
      auto conn = node->pool.checkout(ec);
      Reply r;
      if (!ec) r = conn->command({"SPUBLISH", events_channel(backend_.prefix_, slot), marker}, ec);
      if (!ec && (!r || r->type != REDIS_REPLY_INTEGER)) {
        ec.fail(errc::backend_unavailable, node->opts.describe() + " refused SPUBLISH " +
                                               events_channel(backend_.prefix_, slot) + ": " +
                                               std::string(r ? redis::reply_str(r.get()) : "no reply"));
        want_reconcile();  // e.g. MOVED: the map changed
      }
      if (ec) {
        forget();
        ec.set_detail("watch of \"" + name_prefix_ + "\": sync marker: " + ec.detail());
        return false;
      }
    }
    UniqueLock lk(mu_);
    // Bounded by timeout_ (connect + command timeout) on this process's steady clock.
    const auto until = std::chrono::steady_clock::now() + timeout_;
    while (sync_seen_[n] < reps.size() &&
           sync_cv_.wait_until(lk.native(), until) != std::cv_status::timeout) {
    }
    const bool seen = sync_seen_[n] >= reps.size();
    sync_seen_.erase(n);
    if (!seen) {
      ec.fail(errc::backend_unavailable,
              "watch of \"" + name_prefix_ + "\": the sync markers on " + std::to_string(reps.size()) +
                  " masters did not all come back within " + std::to_string(timeout_.count()) + " ms");
      return false;
    }
    return true;
  }

 private:
  struct NodeSub {
    std::unique_ptr<redis::Subscriber> sub;
    // A gap was reported for this master and the recovery gap (all live again) not yet.
    bool broken = false;
    // Its connection broke since the last recovery gap: the node may have restarted (without
    // persistence its state is older than what was delivered) or failed over.
    bool conn_broke = false;
    // Channels the node dropped whose on_message (which the subscriber sends right after
    // on_dropped) has not come yet: that on_message is the drop's, not a broken connection's.
    std::set<std::string, std::less<>> drop_notices;
  };

  // ---- subscriber threads
  void on_payload(std::string_view channel, std::string_view p) {
    if (stopping_.load() || channel.substr(0, channel_head_.size()) != channel_head_) return;
    const std::string_view kind = take_field(p);
    if (kind == "sync") {
      const std::string_view n = take_field(p);
      if (p != id_) return;  // another watch's marker
      std::uint64_t v = 0;
      std::from_chars(n.data(), n.data() + n.size(), v);
      {
        LockGuard lk(mu_);
        auto it = sync_seen_.find(v);
        if (it != sync_seen_.end()) ++it->second;
      }
      sync_cv_.notify_all();
      return;
    }
    LockEvent ev;
    if (const auto k = lock_event_kind(kind)) {
      ev.kind = *k;
    } else {
      return;  // a kind of a newer version: not ours to guess
    }
    const std::string_view token = take_field(p);
    std::from_chars(token.data(), token.data() + token.size(), ev.token);
    const std::string_view len_text = take_field(p);
    std::size_t len = 0;
    if (std::from_chars(len_text.data(), len_text.data() + len_text.size(), len).ec != std::errc{} ||
        len > p.size())
      return;
    ev.owner = std::string(p.substr(0, len));
    p.remove_prefix(len);
    if (!name_of_lock_key(backend_.prefix_, p, ev.name)) return;
    if (ev.name.compare(0, name_prefix_.size(), name_prefix_) != 0) return;
    sink_.on_event(std::move(ev));
  }

  // A watched channel of `node` broke, was subscribed again, or was dropped or refused.
  void on_notice(Node* node, std::string_view channel, bool dropped) {
    if (stopping_.load()) return;
    std::string why;
    {
      LockGuard lk(mu_);
      if (dropped) {
        const std::uint16_t s = key_slot(channel);
        if (at_[s] == node) dropped_[s] = true;
      }
      auto it = subs_.find(node);
      if (it != subs_.end()) {
        NodeSub& ns = it->second;
        if (dropped) {
          ns.drop_notices.emplace(channel);
        } else if (auto d = ns.drop_notices.find(channel); d != ns.drop_notices.end()) {
          ns.drop_notices.erase(d);
        } else {
          ns.conn_broke = true;
        }
      }
      if (it != subs_.end() && !it->second.broken) {
        it->second.broken = true;
        why = dropped ? node->opts.describe() + " dropped the events channel " + std::string(channel) +
                            " (its slot moved away, or the node is no master any more)"
                      : "the subscriber connection to " + node->opts.describe() +
                            " broke or was established again";
      }
      reconcile_wanted_ = true;
    }
    cv_.notify_all();
    if (!why.empty()) sink_.on_gap(why + ": events of its slots may have been missed");
  }

  void want_reconcile() {
    {
      LockGuard lk(mu_);
      reconcile_wanted_ = true;
    }
    cv_.notify_all();
  }

  redis::Subscriber& sub_of(Node* node) DISTLOCK_REQUIRES(mu_) {
    NodeSub& ns = subs_[node];
    if (!ns.sub) {
      ns.sub = std::make_unique<redis::Subscriber>(
          node->opts, [this, node](std::string_view ch) { on_notice(node, ch, false); },
          [this, node](std::string_view ch) { on_notice(node, ch, true); });
      ns.sub->set_payload_prefix_handler(
          channel_head_, [this](std::string_view ch, std::string_view p) { on_payload(ch, p); });
    }
    return *ns.sub;
  }

  // Reads the slot map and subscribes every slot's channel on the master serving it where it
  // is not live there yet. True when every channel is live (then, after a break or a move,
  // the recovery gap is reported); false with `ec` naming the first failure.
  bool subscribe_all(Error& ec) {
    ec.clear();
    std::vector<Node*> owners;
    {
      Error rec;
      backend_.refresh_map(backend_.map_version(), rec);
      LockGuard lk(backend_.map_mu_);
      owners = backend_.slots_;
    }
    std::map<Node*, std::vector<std::uint16_t>> plan;
    std::map<Node*, redis::Subscriber*> subs;
    {
      LockGuard lk(mu_);
      for (std::size_t s = 0; s < kSlots; ++s) {
        Node* want = owners[s];
        if (want == nullptr) {
          if (!ec)
            ec.fail(errc::backend_unavailable,
                    "slot " + std::to_string(s) + " is served by no node of the cluster " + backend_.url_);
          continue;
        }
        if (at_[s] != want || dropped_[s]) {
          plan[want].push_back(static_cast<std::uint16_t>(s));
          subs[want] = &sub_of(want);
        }
      }
    }
    bool moved = false, replaced = false;
    std::vector<std::pair<Node*, std::string>> unwatch;
    for (auto& [node, slots] : plan) {
      redis::Subscriber& sub = *subs[node];
      std::vector<redis::Subscriber::WatchStart> started;
      started.reserve(slots.size());
      for (std::uint16_t s : slots) started.push_back(sub.begin_watch(events_channel(backend_.prefix_, s)));
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      for (std::size_t i = 0; i < slots.size(); ++i) {
        const std::uint16_t s = slots[i];
        const std::string channel = events_channel(backend_.prefix_, s);
        Error wec;
        if (!sub.await_watch(channel, started[i], deadline, false, wec)) {
          if (!ec) ec = std::move(wec);
          continue;
        }
        LockGuard lk(mu_);
        Node* old = at_[s];
        if (old != nullptr) {
          unwatch.emplace_back(old, channel);
          moved = true;
          // The old master serves no slot any more: a failover (or a node emptied by resharding,
          // whose last changes the new owner has all the same: reported as a replacement, the
          // safe side).
          if (old != node && std::find(owners.begin(), owners.end(), old) == owners.end()) replaced = true;
        }
        at_[s] = node;
        dropped_[s] = false;
      }
    }
    std::vector<std::unique_ptr<redis::Subscriber>> gone;
    {
      LockGuard lk(mu_);
      for (auto& [old, channel] : unwatch) {
        auto it = subs_.find(old);
        if (it != subs_.end() && it->second.sub) it->second.sub->unwatch(channel);
      }
      // A node that serves none of our channels any more: its subscriber goes.
      std::set<Node*> used(at_.begin(), at_.end());
      for (auto it = subs_.begin(); it != subs_.end();) {
        if (!used.contains(it->first)) {
          gone.push_back(std::move(it->second.sub));
          if (it->second.broken) moved = true;  // its break is recovered by the move
          it = subs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    gone.clear();  // outside mu_: their threads may be waiting for it in a callback
    if (ec) return false;
    // Every channel subscribed where the map says; live on every connection?
    std::string why;
    {
      LockGuard lk(mu_);
      bool broken = moved;
      for (auto& [node, ns] : subs_) {
        if (ns.sub->pending() != 0) {
          ec.fail(errc::backend_unavailable,
                  "the events channels on " + node->opts.describe() +
                      " are not all subscribed yet: " + ns.sub->last_failure().detail());
          return false;
        }
        broken = broken || ns.broken;
        replaced = replaced || ns.conn_broke;
      }
      if (!broken || !started_) {
        started_ = true;
        return true;
      }
      for (auto& [node, ns] : subs_) ns.broken = ns.conn_broke = false;
      why = replaced
                ? "a master's connection broke or a master was replaced (a restart or a failover): every "
                  "slot's events channel is subscribed again on the node now serving it, whose state may "
                  "lack changes already delivered"
                : "every slot's events channel is subscribed again (after a moved slot): events may have "
                  "been missed meanwhile";
    }
    if (replaced) {
      sink_.on_source_replaced(why);
    } else {
      sink_.on_gap(why);
    }
    return true;
  }

  // The periodic slot-map check: one CLUSTER SLOTS (the backend's refresh_map, from the first
  // node that answers) and, for each slot whose channel is live on a node the map no longer
  // names as its master, the same as a dropped channel: that slot is marked dropped and a gap
  // reported (once per node until its recovery gap). True when a slot was marked.
  bool check_map() {
    Error ec;
    if (!backend_.refresh_map(backend_.map_version(), ec)) {
      // No node answered: the subscriber connections' own checks (PING) find a dead node.
      backend_.log_.log(LogLevel::debug, "watch of \"{}\": slot map check: {}", name_prefix_, ec.detail());
      return false;
    }
    std::vector<Node*> owners;
    {
      LockGuard lk(backend_.map_mu_);
      owners = backend_.slots_;
    }
    std::string why;
    std::size_t moved = 0;
    {
      LockGuard lk(mu_);
      for (std::size_t s = 0; s < kSlots; ++s) {
        Node* old = at_[s];
        // A slot served by nobody in the map (its master died) is left to the connection's checks.
        if (old == nullptr || owners[s] == nullptr || owners[s] == old || dropped_[s]) continue;
        dropped_[s] = true;
        ++moved;
        auto it = subs_.find(old);
        if (it != subs_.end() && !it->second.broken) {
          it->second.broken = true;
          if (why.empty())
            why = "the slot map names " + owners[s]->opts.describe() + " as the master of slot " +
                  std::to_string(s) + ", whose events channel is subscribed on " + old->opts.describe() +
                  " (a failover or move that node did not signal)";
        }
      }
      if (moved != 0) reconcile_wanted_ = true;
    }
    if (!why.empty()) sink_.on_gap(why + ": events of its slots may have been missed");
    return moved != 0;
  }

  // The watch thread: subscribes again after a break or a move, retrying until all is live,
  // and checks the slot map every kMapCheckEvery.
  void run() {
    Millis retry = kRetryFirst;
    bool complete = true;
    auto next_check = std::chrono::steady_clock::now() + kMapCheckEvery;
    UniqueLock lk(mu_);
    while (!stop_) {
      if (complete) {
        while (!stop_ && !reconcile_wanted_ &&
               cv_.wait_until(lk.native(), next_check) != std::cv_status::timeout) {
        }
      } else {
        const auto until = std::chrono::steady_clock::now() + retry;
        while (!stop_ && cv_.wait_until(lk.native(), until) != std::cv_status::timeout) {
        }
      }
      if (stop_) return;
      if (complete && !reconcile_wanted_ && std::chrono::steady_clock::now() >= next_check) {
        lk.unlock();
        const bool moved = check_map();
        lk.lock();
        next_check = std::chrono::steady_clock::now() + kMapCheckEvery;
        if (!moved) continue;
      }
      reconcile_wanted_ = false;
      lk.unlock();
      Error ec;
      complete = subscribe_all(ec);
      if (!complete)
        backend_.log_.log(LogLevel::debug, "watch of \"{}\": subscribing again: {}", name_prefix_,
                          ec.detail());
      lk.lock();
      retry = complete ? kRetryFirst : std::min(retry * 2, kRetryMost);
    }
  }

  ClusterBackend& backend_;
  const std::string id_ = random_id();
  const Millis timeout_;
  const std::string channel_head_;
  const std::string name_prefix_;
  LockEventSink& sink_;
  std::atomic<bool> stopping_{false};

  AnnotatedMutex mu_;
  std::condition_variable cv_;       // the watch thread: reconcile_wanted_, stop_
  std::condition_variable sync_cv_;  // a sync marker came back
  std::map<Node*, NodeSub> subs_ DISTLOCK_GUARDED_BY(mu_);
  std::vector<Node*> at_ DISTLOCK_GUARDED_BY(mu_);      // per slot: the master its channel is subscribed on
  std::vector<bool> dropped_ DISTLOCK_GUARDED_BY(mu_);  // per slot: that master dropped it
  bool reconcile_wanted_ DISTLOCK_GUARDED_BY(mu_) = false;
  bool started_ DISTLOCK_GUARDED_BY(mu_) = false;
  bool stop_ DISTLOCK_GUARDED_BY(mu_) = false;
  std::uint64_t sync_sent_ DISTLOCK_GUARDED_BY(mu_) = 0;
  std::map<std::uint64_t, std::size_t> sync_seen_ DISTLOCK_GUARDED_BY(mu_);
  std::thread thread_;
};

std::unique_ptr<PrefixWatch> ClusterBackend::watch_prefix(std::string_view prefix, LockEventSink& sink,
                                                          Error& ec) {
  auto w = std::make_unique<ClusterPrefixWatch>(*this, std::string(prefix), sink);
  w->start(ec);
  if (ec) {
    ec.set_detail("cannot watch \"" + std::string(prefix) + "\": " + ec.detail());
    return nullptr;
  }
  return w;
}

}  // namespace distlock::detail::rediscluster
