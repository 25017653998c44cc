// Task sharding on the public API (include/distlock/shard_group.hpp, docs/sharding.md).
//
// One background thread per member runs the rebalance: it computes the assignment
// (shard_plan.hpp) from the live members and the shard owners, gives up the shards it must
// (stop token first, then release) and starts one waiting thread per shard it must take
// (Client::acquire with no wait limit, cancelled through LockOptions::cancel when the shard
// is no longer wanted). A waiter that gets its shard, and any loss of a lease, wake the
// background thread at once to publish the new assignment.
//
// Where the backend can watch (Client::watch), the members and owners are a view kept from
// two watches, of `<job>/members/` and `<job>/shard/`, each read by a thread of its own; an
// event wakes the background thread, which rebalances from the view without a round trip.
// After a gap the watch re-lists and reports a `state` per lock, which rebuilds the view. A
// safety re-list (two Client::list calls) runs every max(100 periods, 30 s). Elsewhere
// (errc::not_supported) the background thread lists both prefixes every period.
#include "distlock/shard_group.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "api/shard_plan.hpp"
#include "distlock/error.hpp"
#include "distlock/watch.hpp"
#include "engine/owner_id.hpp"

namespace distlock {

namespace detail {

// A held shard's lease, shared by the group and every OwnedShard of it (OwnedShard::held()).
// The lease is read and moved out under `mu` only: Lease's own reads are thread-safe, but a
// release or a move writes the Lease object. A forked child never owns its parent's shards and
// never takes `mu`: another thread of the parent may have held it at the fork, and no thread of
// the child would ever unlock it.
struct OwnedShardCheck {
  const std::uint64_t fork_gen = fork_generation();  // the process that holds the lease
  mutable std::mutex mu;
  Lease lease;
};

std::map<std::string, std::vector<std::uint32_t>> plan_shards(
    std::uint32_t shards, std::vector<std::string> members,
    const std::vector<std::optional<std::string>>& owners) {
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  std::map<std::string, std::vector<std::uint32_t>> out;
  if (members.empty()) return out;
  std::map<std::string, std::uint32_t> count;
  for (const auto& m : members) {
    out[m];
    count[m] = 0;
  }
  for (std::uint32_t i = 0; i < shards && i < owners.size(); ++i)
    if (owners[i] && count.contains(*owners[i])) ++count[*owners[i]];
  const auto w = static_cast<std::uint32_t>(members.size());
  const std::uint32_t base = shards / w, extra = shards % w;
  // Who may own ceil(M/W): members holding more than floor(M/W) first, then id order. The
  // count is clamped to [floor, ceil]: a ceil slot saves exactly one move for a member holding
  // more than floor and none for the others, and the clamp keeps the order (so the plan) the
  // same while members take their free shards one by one between two listings.
  const auto rank = [&](const std::string& m) {
    return std::clamp(count[m], base, base + (extra ? 1U : 0U));
  };
  std::vector<std::string> order = members;
  std::stable_sort(order.begin(), order.end(),
                   [&](const std::string& a, const std::string& b) { return rank(a) > rank(b); });
  std::map<std::string, std::uint32_t> quota;
  for (std::uint32_t r = 0; r < w; ++r) quota[order[r]] = base + (r < extra ? 1 : 0);
  std::vector<bool> placed(shards, false);
  for (std::uint32_t i = 0; i < shards && i < owners.size(); ++i) {
    if (!owners[i]) continue;
    auto it = out.find(*owners[i]);
    if (it == out.end() || it->second.size() >= quota[it->first]) continue;
    it->second.push_back(i);
    placed[i] = true;
  }
  auto next = members.begin();
  for (std::uint32_t i = 0; i < shards; ++i) {
    if (placed[i]) continue;
    while (next != members.end() && out[*next].size() >= quota[*next]) ++next;
    if (next == members.end()) break;  // cannot happen: the quotas add up to `shards`
    out[*next].push_back(i);
  }
  for (auto& [m, v] : out) std::sort(v.begin(), v.end());
  return out;
}

}  // namespace detail

namespace {

constexpr std::uint32_t kMaxShards = 65536;
constexpr std::size_t kMaxMemberId = 64;
constexpr std::size_t kListLimit = 100000;
// A watching member's safety re-list: every this many periods, and no more often than
// kMinSafetyRelist.
constexpr int kSafetyRelistPeriods = 100;
constexpr std::chrono::seconds kMinSafetyRelist{30};
const std::string kOwnerTag = "member=";
std::atomic<std::uint64_t> g_groups{0};

bool valid_member_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxMemberId) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::optional<std::uint32_t> parse_index(std::string_view s) {
  if (s.empty() || s.size() > 6) return std::nullopt;
  std::uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint32_t>(c - '0');
  }
  if (s.size() > 1 && s[0] == '0') return std::nullopt;
  return v;
}

struct Fire {
  std::stop_source source;
  void operator()() noexcept { source.request_stop(); }
};

}  // namespace

struct ShardGroup::Core : std::enable_shared_from_this<ShardGroup::Core> {
  using SteadyClock = std::chrono::steady_clock;

  struct Held {
    std::shared_ptr<detail::OwnedShardCheck> check;  // the lease, shared with OwnedShard::held()
    std::stop_source stop;
    std::unique_ptr<std::stop_callback<Fire>> forward;  // lease loss -> stop
    std::optional<std::uint64_t> token;
  };
  struct Waiter {
    std::jthread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  // One watch of the group and the thread that reads its events into the view.
  struct Feed {
    std::shared_ptr<Watch> watch;
    std::thread reader;
  };

  explicit Core(Client c) : client(std::move(c)) {}

  Client client;
  std::string job, member_id, member_name, members_prefix, shard_prefix, member_info;
  std::uint32_t shards = 0;
  ShardGroupOptions opts;
  LockOptions shard_opts;  // for acquiring shards (holder info, no wait limit)

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool stopping = false;                // leave() called
  bool left = false;                    // the first leave() has finished
  bool loop_ended = false;              // run() has returned (it may have been detached)
  std::thread::id loop_id, leaving_id;  // run()'s thread; the thread inside the first leave()
  bool dirty = false;                   // a waiter took a shard or a lease was lost: publish now
  std::optional<Lease> membership;
  std::map<std::uint32_t, Held> held;
  std::map<std::uint32_t, Waiter> waiters;
  std::set<std::uint32_t> wanted;
  ShardAssignment published;
  ShardGroupStats counters;
  std::optional<SteadyClock::time_point> target_changed_at;
  std::thread loop;
  // Watching (the backend watches): the group as its events tell it. view_members: live member
  // id -> its record's holder info (nullopt when the event carried none); view_owners: shard
  // index -> the owner's member id ("" when the holder info named none). view_events counts
  // every event applied: a safety re-list is applied only if none came while it was read.
  bool watching = false;
  bool watch_unsupported = false;  // errc::not_supported: polls for good
  std::vector<Feed> feeds;
  std::map<std::string, std::optional<std::string>> view_members;
  std::map<std::uint32_t, std::string> view_owners;
  std::uint64_t view_events = 0;
  // The background thread's last re-list while not a member (rebalance_from_view).
  std::optional<SteadyClock::time_point> last_outside_relist;
  // The process that runs the group: in a forked child the group is the parent's, and its
  // mutex may have been held by another thread of the parent at the fork (ShardGroup::leave).
  const std::uint64_t fork_gen = detail::fork_generation();
  bool forked() const noexcept { return fork_gen != detail::fork_generation(); }

  void start() {
    start_watches();
    loop = std::thread([self = shared_from_this()] { self->run(); });
  }

  // Caller holds mu. Whether a member record's holder info names this group's shard count
  // (an event without holder info is taken as this count: the join checked it).
  bool same_count(const std::optional<std::string>& info) const {
    if (!info) return true;
    const std::string tag = "shards=" + std::to_string(shards);
    return info->compare(0, tag.size(), tag) == 0 &&
           (info->size() == tag.size() || (*info)[tag.size()] == ' ');
  }

  // Caller holds mu. One lock's news into the view.
  void apply_view(const std::string& name, bool held, const std::optional<std::string>& info) {
    if (name.starts_with(members_prefix)) {
      const std::string id = name.substr(members_prefix.size());
      if (!valid_member_id(id)) return;
      if (held) {
        view_members[id] = info;
        return;
      }
      view_members.erase(id);
      // Its shards are nobody's in the plan from now on; forgetting them here also keeps a
      // record from outliving an unpublished expiry when the same id joins again.
      std::erase_if(view_owners, [&](const auto& p) { return p.second == id; });
      return;
    }
    if (!name.starts_with(shard_prefix)) return;
    const auto idx = parse_index(std::string_view(name).substr(shard_prefix.size()));
    if (!idx || *idx >= shards) return;
    if (!held) {
      view_owners.erase(*idx);
      return;
    }
    const std::string text = info.value_or("");
    view_owners[*idx] =
        text.compare(0, kOwnerTag.size(), kOwnerTag) == 0 ? text.substr(kOwnerTag.size()) : "";
  }

  void on_watch_event(const WatchEvent& ev) {
    {
      std::lock_guard lk(mu);
      ++view_events;
      switch (ev.kind) {
        case WatchEventKind::gap:
          // The watch re-lists now and reports one `state` per lock (and a free `state` per
          // name it believed held): those rebuild the view.
          ++counters.watch_gaps;
          break;
        case WatchEventKind::acquired: apply_view(ev.name, true, ev.holder_info); break;
        case WatchEventKind::state: apply_view(ev.name, ev.held, ev.holder_info); break;
        case WatchEventKind::released:
        case WatchEventKind::lost:
        case WatchEventKind::revoked: apply_view(ev.name, false, std::nullopt); break;
      }
      dirty = true;
    }
    cv.notify_all();
  }

  // Starts the two watches; on success the background thread rebalances from their view.
  // The first events (the watches' initial `state`s, queued before watch() returns) are
  // applied here, so the first plan already sees the whole group. errc::not_supported: the
  // group polls for good; another failure: it polls and tries again at the next period.
  void start_watches() noexcept {
    std::vector<Feed> made;
    try {
      WatchOptions members_opts;  // expiry checks on: a dead member is seen within about its TTL
      WatchOptions shards_opts;
      // No status re-reads of M shards: a dead member's shards leave the plan with its
      // membership, and a shard's next owner reports its acquisition (after an inferred loss).
      shards_opts.expiry_checks = false;
      made.push_back({std::make_shared<Watch>(client.watch(members_prefix, members_opts)), {}});
      made.push_back({std::make_shared<Watch>(client.watch(shard_prefix, shards_opts)), {}});
    } catch (const std::system_error& e) {
      std::lock_guard lk(mu);
      if (e.code() == errc::not_supported) watch_unsupported = true;
      return;
    } catch (...) {
      return;
    }
    try {
      for (auto& f : made)
        while (auto ev = f.watch->next(Millis(0))) on_watch_event(*ev);
    } catch (...) {
      return;  // no memory for the view: polls this period, tries again at the next
    }
    try {
      for (auto& f : made)
        f.reader = std::thread([this, w = f.watch] {
          while (auto ev = w->next()) {
            try {
              on_watch_event(*ev);
            } catch (...) {  // no memory for the view: the safety re-list rebuilds it
            }
          }
        });
    } catch (...) {  // no thread: polls this period, tries again at the next
      stop_feeds(made);
      return;
    }
    {
      std::lock_guard lk(mu);
      if (!stopping) {
        feeds = std::move(made);
        watching = true;
        counters.watching = true;
        return;
      }
    }
    stop_feeds(made);  // raced leave()
  }

  static void stop_feeds(std::vector<Feed>& fs) noexcept {
    for (auto& f : fs) f.watch->stop();
    for (auto& f : fs)
      if (f.reader.joinable()) f.reader.join();
    fs.clear();
  }

  void wake() {
    {
      std::lock_guard lk(mu);
      dirty = true;
    }
    cv.notify_all();
  }

  void watch_loss(Lease& lease) {
    std::weak_ptr<Core> weak = weak_from_this();
    lease.on_lost([weak] {
      if (auto self = weak.lock()) self->wake();
    });
  }

  // The first live member (id, shard count) whose membership record names another shard
  // count than this member's, if any. A list that fails throws.
  std::optional<std::pair<std::string, std::uint32_t>> member_with_another_count() {
    static constexpr std::string_view kTag = "shards=";
    for (const auto& l : client.list(members_prefix, kListLimit)) {
      const std::string_view id = std::string_view(l.name).substr(members_prefix.size());
      const std::string info = l.info.holder_info.value_or("");
      if (!valid_member_id(id) || info.compare(0, kTag.size(), kTag) != 0) continue;
      std::uint32_t count = 0;
      const char* begin = info.data() + kTag.size();
      const char* end = info.data() + info.size();
      const auto [next, ec] = std::from_chars(begin, end, count);
      if (ec != std::errc{} || next == begin || (next != end && *next != ' ')) continue;
      if (count != shards) return std::make_pair(std::string(id), count);
    }
    return std::nullopt;
  }

  void join_membership() {
    LockOptions o = opts.lock;
    o.wait = Millis(0);
    o.cancel = {};
    o.holder_info = member_info;
    Lease lease = client.acquire(member_name, o);
    watch_loss(lease);
    {
      std::lock_guard lk(mu);
      if (!stopping) {
        membership = std::move(lease);
        return;
      }
    }
    std::error_code ec;
    lease.release(ec);  // a rejoin that raced leave(): do not stay a member
  }

  SteadyClock::duration safety_relist_period() const {
    return std::max<SteadyClock::duration>(opts.rebalance_period * kSafetyRelistPeriods, kMinSafetyRelist);
  }

  // Polling: a full rebalance (two lists) every period, a settle on each wake-up between.
  // Watching: a rebalance from the view on each wake-up (an event, a waiter, a loss) and at
  // least once per period (retries: a failed rejoin, a waiter the backend failed), no round
  // trip unless something moves; a safety re-list every safety_relist_period().
  void run() {
    std::unique_lock lk(mu);
    loop_id = std::this_thread::get_id();
    auto next_full = SteadyClock::now() + (watching ? safety_relist_period() : SteadyClock::duration{0});
    while (!stopping) {
      const bool full = SteadyClock::now() >= next_full;
      dirty = false;
      bool watch = watching;
      const bool retry_watch = !watch && !watch_unsupported;
      lk.unlock();
      if (full && retry_watch) {
        start_watches();
        lk.lock();
        watch = watching;
        lk.unlock();
      }
      if (watch) {
        if (full) {
          next_full = SteadyClock::now() + safety_relist_period();
          if (!relist_view()) next_full = SteadyClock::now() + opts.rebalance_period;
        }
        rebalance_from_view();
      } else if (full) {
        next_full = SteadyClock::now() + opts.rebalance_period;
        rebalance();
      } else {
        settle();
      }
      lk.lock();
      const auto until = watch ? std::min(next_full, SteadyClock::now() + opts.rebalance_period) : next_full;
      cv.wait_until(lk, until, [&] { return stopping || dirty; });
    }
    loop_ended = true;
    lk.unlock();
    cv.notify_all();
  }

  static bool lease_owns(const Held& h) noexcept {
    std::lock_guard lk(h.check->mu);
    return h.check->lease.owns();
  }

  // Fires the shard's stop token, then releases it (outside the lock: a round trip). The
  // lease leaves the shared check first: OwnedShard::held() is false from the stop on.
  void give_up(std::vector<Held>& out) noexcept {
    for (auto& h : out) {
      h.stop.request_stop();
      Lease lease;
      {
        std::lock_guard lk(h.check->mu);
        lease = std::move(h.check->lease);
      }
      if (lease.owns()) {
        std::error_code ec;
        lease.release(ec);
      }
    }
    out.clear();
  }

  // Drops lost leases, reaps finished waiters, rejoins after a lost membership, publishes.
  void settle() {
    std::vector<Held> drop;
    std::vector<Waiter> finished;
    bool rejoin = false;
    {
      std::lock_guard lk(mu);
      if (stopping) return;
      if (!membership || !membership->owns()) {
        if (membership) ++counters.membership_lost;
        membership.reset();
        rejoin = true;
        // Nobody counts this member any more: its shards go (stop first, in give_up).
        for (auto& [i, h] : held) drop.push_back(std::move(h));
        held.clear();
        wanted.clear();
        for (auto& [i, w] : waiters) w.thread.request_stop();
      }
      for (auto it = held.begin(); it != held.end();) {
        if (!lease_owns(it->second)) {
          ++counters.shards_lost;
          // Its stop fires in give_up, outside the group's lock: a user's stop callback may
          // call assigned() or stats(), which take that lock.
          drop.push_back(std::move(it->second));
          it = held.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = waiters.begin(); it != waiters.end();) {
        if (it->second.done->load()) {
          finished.push_back(std::move(it->second));
          it = waiters.erase(it);
        } else {
          ++it;
        }
      }
    }
    give_up(drop);
    finished.clear();  // joins
    if (rejoin) {
      try {
        join_membership();
      } catch (const std::system_error& e) {
        // Retried at the next rebalance. A refusal (busy) is counted: past one TTL it means
        // another live process holds this member id (docs/sharding.md, "Member ids"). Not an
        // unreachable server: that is no sign of a twin, and its lists fail too (list_failures).
        if (e.code() == errc::busy) {
          std::lock_guard lk(mu);
          ++counters.rejoin_failures;
        }
      } catch (...) {
        // Retried at the next rebalance.
      }
    }
    publish();
  }

  void publish() {
    ShardAssignment snap;
    {
      std::lock_guard lk(mu);
      std::vector<OwnedShard> now;
      for (const auto& [i, h] : held) now.push_back({i, h.token, h.stop.get_token(), h.check});
      bool same = now.size() == published.shards.size();
      for (std::size_t k = 0; same && k < now.size(); ++k)
        same = now[k].index == published.shards[k].index && now[k].token == published.shards[k].token;
      counters.shards_owned = held.size();
      if (target_changed_at && held.size() == wanted.size() &&
          std::all_of(held.begin(), held.end(), [&](const auto& p) { return wanted.contains(p.first); })) {
        counters.last_rebalance_time =
            std::chrono::duration_cast<Millis>(SteadyClock::now() - *target_changed_at);
        target_changed_at.reset();
      }
      if (same) return;
      published.shards = std::move(now);
      ++published.version;
      snap = published;
    }
    cv.notify_all();
    if (opts.on_change) {
      try {
        opts.on_change(snap);
      } catch (...) {
      }
    }
  }

  // Polling: lists the members and the shard owners, then plans.
  void rebalance() {
    settle();
    std::vector<ListedLock> members_listed, shards_listed;
    try {
      members_listed = client.list(members_prefix, kListLimit);
      shards_listed = client.list(shard_prefix, kListLimit);
    } catch (...) {
      std::lock_guard lk(mu);
      ++counters.list_failures;
      return;
    }
    const std::string tag = "shards=" + std::to_string(shards);
    std::vector<std::string> live;
    for (const auto& l : members_listed) {
      std::string_view id = std::string_view(l.name).substr(members_prefix.size());
      if (!valid_member_id(id)) continue;
      // A member of another shard count (a misconfigured peer) is left out of the plan; the
      // shard locks still keep every shard to one owner.
      const std::string info = l.info.holder_info.value_or("");
      if (info.compare(0, tag.size(), tag) != 0 || (info.size() > tag.size() && info[tag.size()] != ' '))
        continue;
      live.emplace_back(id);
    }
    std::vector<std::optional<std::string>> owners(shards);
    for (const auto& l : shards_listed) {
      auto idx = parse_index(std::string_view(l.name).substr(shard_prefix.size()));
      if (!idx || *idx >= shards) continue;
      const std::string info = l.info.holder_info.value_or("");
      if (info.compare(0, kOwnerTag.size(), kOwnerTag) == 0) owners[*idx] = info.substr(kOwnerTag.size());
    }
    plan_and_apply(std::move(live), std::move(owners), false);
  }

  // Watching: the safety re-list. Lists both prefixes and replaces the view with what they
  // show, unless an event came while they were read (it may be newer than the listing): then
  // false, and the re-list is tried again a period later.
  bool relist_view() {
    std::uint64_t before = 0;
    {
      std::lock_guard lk(mu);
      before = view_events;
    }
    std::vector<ListedLock> members_listed, shards_listed;
    try {
      members_listed = client.list(members_prefix, kListLimit);
      shards_listed = client.list(shard_prefix, kListLimit);
    } catch (...) {
      std::lock_guard lk(mu);
      ++counters.list_failures;
      return false;
    }
    std::lock_guard lk(mu);
    if (view_events != before) return false;
    view_members.clear();
    view_owners.clear();
    for (const auto& l : members_listed) apply_view(l.name, true, l.info.holder_info);
    for (const auto& l : shards_listed) apply_view(l.name, true, l.info.holder_info);
    ++counters.safety_relists;
    return true;
  }

  // Watching: plans from the view (no round trip). A member that is not a member now (its
  // membership was lost and the rejoin failed) re-lists instead, as a polling member would:
  // an unreachable server shows as list_failures, and the view is fresh once it rejoins.
  void rebalance_from_view() {
    settle();
    bool member = false;
    {
      std::lock_guard lk(mu);
      member = membership.has_value();
    }
    if (!member) {
      // At most once a period, however many events wake the thread meanwhile.
      const auto now = SteadyClock::now();
      if (!last_outside_relist || now - *last_outside_relist >= opts.rebalance_period) {
        last_outside_relist = now;
        relist_view();
      }
      return;
    }
    std::vector<std::string> live;
    std::vector<std::optional<std::string>> owners(shards);
    {
      std::lock_guard lk(mu);
      // A member of another shard count (a misconfigured peer) is left out of the plan; the
      // shard locks still keep every shard to one owner.
      for (const auto& [id, info] : view_members)
        if (same_count(info)) live.push_back(id);
      for (const auto& [i, owner] : view_owners)
        if (!owner.empty()) owners[i] = owner;
    }
    plan_and_apply(std::move(live), std::move(owners), true);
  }

  // Computes this member's target from the live members and the owners, gives up what it
  // must and starts a waiter per shard it must take. `own_from_view`: the owners are the
  // watches' view, which names this member where its peers' views do; a shard it lost
  // without a published end (an expiry, an eviction) is still its own to them, so it stays
  // its own in this plan too: the plans agree and it takes the shard again (else its plan
  // could hand the shard to a peer whose plan leaves it to this member: nobody takes it
  // until a re-list). Listed owners (polling) are fresher than what this member held a
  // moment ago only where they name others.
  void plan_and_apply(std::vector<std::string> live, std::vector<std::optional<std::string>> owners,
                      bool own_from_view) {
    std::vector<Held> drop;
    std::vector<std::uint32_t> start;
    {
      std::lock_guard lk(mu);
      if (stopping || !membership) return;
      live.push_back(member_id);  // this member holds its membership (checked in settle)
      // Polling: this member's own shards are what it holds, whatever the list said a moment ago.
      if (!own_from_view)
        for (auto& o : owners)
          if (o == member_id) o.reset();
      for (const auto& [i, h] : held) owners[i] = member_id;
      auto plan = detail::plan_shards(shards, live, owners);
      std::set<std::uint32_t> target(plan[member_id].begin(), plan[member_id].end());
      published.members = plan.size();
      if (target != wanted) {
        ++counters.rebalances;
        target_changed_at = SteadyClock::now();
        wanted = target;
      }
      for (auto it = held.begin(); it != held.end();) {
        if (!wanted.contains(it->first)) {
          ++counters.shards_given_up;
          drop.push_back(std::move(it->second));
          it = held.erase(it);
        } else {
          ++it;
        }
      }
      for (auto& [i, w] : waiters)
        if (!wanted.contains(i)) w.thread.request_stop();
      for (std::uint32_t i : wanted)
        if (!held.contains(i) && !waiters.contains(i)) start.push_back(i);
      for (std::uint32_t i : start) {
        auto done = std::make_shared<std::atomic<bool>>(false);
        std::weak_ptr<Core> weak = weak_from_this();
        waiters[i] = Waiter{std::jthread([weak, i, done](std::stop_token cancel) {
                              if (auto self = weak.lock()) self->take(i, cancel);
                              done->store(true);
                              if (auto self = weak.lock()) self->wake();
                            }),
                            done};
      }
    }
    give_up(drop);
    publish();
  }

  // A waiting thread: acquires shard i (woken by its release), installs it if still wanted.
  void take(std::uint32_t i, std::stop_token cancel) {
    LockOptions o = shard_opts;
    o.cancel = cancel;
    std::optional<Lease> lease;
    try {
      lease.emplace(client.acquire(ShardGroup::shard_lock_name(job, i), o));
    } catch (...) {
      return;  // cancelled, or the backend failed: the next rebalance starts a new waiter
    }
    Held h;
    h.token = lease->has_token() ? std::optional<std::uint64_t>(lease->token()) : std::nullopt;
    watch_loss(*lease);
    {
      std::lock_guard lk(mu);
      if (!stopping && membership && wanted.contains(i) && !held.contains(i) && !cancel.stop_requested()) {
        h.forward = std::make_unique<std::stop_callback<Fire>>(lease->stop_token(), Fire{h.stop});
        h.check = std::make_shared<detail::OwnedShardCheck>();
        h.check->lease = std::move(*lease);
        ++counters.shards_taken;
        held.emplace(i, std::move(h));
        return;
      }
    }
    std::error_code ec;
    lease->release(ec);  // no longer this member's: hand it on at once
  }

  void leave() noexcept {
    std::vector<Held> drop;
    std::map<std::uint32_t, Waiter> stop_waiters;
    std::optional<Lease> member;
    std::vector<Feed> stop_feeds_later;
    {
      std::unique_lock lk(mu);
      if (stopping) {
        // A second leave() (the destructor after a leave() from on_change, or another
        // thread) returns once the first one has finished and the loop, detached or not,
        // has ended: after it, no callback of this group runs. Not on the loop's own
        // thread, nor on the thread inside the first leave() (a stop callback of its own):
        // those would wait for themselves.
        const auto me = std::this_thread::get_id();
        if (me != loop_id && me != leaving_id) cv.wait(lk, [&] { return left && loop_ended; });
        return;
      }
      stopping = true;
      leaving_id = std::this_thread::get_id();
      for (auto& [i, h] : held) drop.push_back(std::move(h));
      counters.shards_given_up += held.size();
      held.clear();
      wanted.clear();
      for (auto& [i, w] : waiters) w.thread.request_stop();
      stop_waiters = std::move(waiters);
      waiters.clear();
      member = std::move(membership);
      membership.reset();
      stop_feeds_later = std::move(feeds);
      feeds.clear();
      watching = false;
      counters.watching = false;
    }
    cv.notify_all();
    stop_feeds(stop_feeds_later);  // their readers only update the view
    if (loop.joinable()) {
      if (loop.get_id() == std::this_thread::get_id())
        loop.detach();  // leave() from on_change: the loop ends after the callback
      else
        loop.join();
    }
    // Local users first; then the membership, so that peers listing now already count this
    // member out and wait on its shards; then the shards, whose releases wake those peers.
    for (auto& h : drop) h.stop.request_stop();
    if (member && member->owns()) {
      std::error_code ec;
      member->release(ec);
    }
    give_up(drop);
    stop_waiters.clear();  // joins: each ends within one wake-up of its cancellation
    {
      std::lock_guard lk(mu);
      if (!published.shards.empty()) {
        published.shards.clear();
        ++published.version;
      }
      counters.shards_owned = 0;
      left = true;
    }
    cv.notify_all();
  }
};

ShardGroup::ShardGroup(Client client, std::string job, std::uint32_t shards, ShardGroupOptions opts) {
  if (job.empty()) throw_error(make_error_code(errc::invalid_argument), "shard group: the job name is empty");
  if (shards < 1 || shards > kMaxShards)
    throw_error(make_error_code(errc::invalid_argument), "shard group: shards " + std::to_string(shards) +
                                                             " is outside 1.." + std::to_string(kMaxShards));
  if (opts.rebalance_period < Millis(10) || opts.rebalance_period > std::chrono::hours(1))
    throw_error(make_error_code(errc::invalid_argument), "shard group: rebalance_period " +
                                                             std::to_string(opts.rebalance_period.count()) +
                                                             "ms is outside [10ms, 1h]");
  if (opts.member_id.empty()) opts.member_id = client.id() + "-" + std::to_string(g_groups.fetch_add(1) + 1);
  if (!valid_member_id(opts.member_id))
    throw_error(make_error_code(errc::invalid_argument), "shard group: member_id \"" +
                                                             opts.member_id.substr(0, 80) +
                                                             "\" must be 1..64 bytes of [A-Za-z0-9_.-]");
  std::string info = "shards=" + std::to_string(shards);
  if (!opts.info.empty()) info += " " + opts.info;
  info = info.substr(0, LockOptions::max_holder_info);
  {
    LockOptions check = opts.lock;
    check.holder_info = info;
    std::string why;
    if (check.validate_and_fill(why))
      throw_error(make_error_code(errc::invalid_argument), "shard group: " + why);
  }
  auto core = std::make_shared<Core>(std::move(client));
  core->job = std::move(job);
  core->shards = shards;
  core->member_id = opts.member_id;
  core->member_name = member_lock_name(core->job, opts.member_id);
  core->members_prefix = core->job + "/members/";
  core->shard_prefix = core->job + "/shard/";
  core->member_info = std::move(info);
  core->shard_opts = opts.lock;
  core->shard_opts.wait = std::nullopt;
  core->shard_opts.holder_info = kOwnerTag + opts.member_id;
  core->opts = std::move(opts);
  core->client.list(core->members_prefix, 1);  // errc::not_supported where it cannot list
  try {
    core->join_membership();
  } catch (const std::system_error& e) {
    if (e.code() != errc::busy) throw;
    // Another live member (another process, or another group object in this one) holds this
    // id: say so, rather than the engine's "lock is busy" (or, from this thread, its words
    // about a Mutex or another Lease).
    throw_error(e.code(),
                "member id \"" + core->member_id + "\" of shard group \"" + core->job +
                    "\" is in use by a live member (member ids must be unique in a group; the id of "
                    "a member that died is free again once its membership lease expires, within one "
                    "TTL)");
  }
  // One job name, one shard count. Checked after this member's own record is on the server,
  // so of two members that join at once with different counts at least one sees the other
  // (each lists after its own record is written) and refuses: never both in, stalling each
  // other's shards (the plan leaves a member of another count out).
  std::optional<std::pair<std::string, std::uint32_t>> other;
  try {
    other = core->member_with_another_count();
  } catch (...) {
    core->leave();
    throw;
  }
  if (other) {
    core->leave();
    throw_error(make_error_code(errc::invalid_argument),
                "shard group \"" + core->job + "\": live member \"" + other->first + "\" runs it with " +
                    std::to_string(other->second) + " shards, this member asked for " +
                    std::to_string(shards) +
                    " (all members of a group use one shard count: to change it, use a new job name)");
  }
  core->start();
  core_ = std::move(core);
}

bool OwnedShard::held() const noexcept {
  // The stop first: a shard given up (rebalance, leave) is not held from its stop on, while
  // its release is still under way. Then the lease's own deadline, read now.
  if (check == nullptr || stop.stop_requested()) return false;
  if (check->fork_gen != detail::fork_generation()) return false;  // a forked child: never its shard
  std::lock_guard lk(check->mu);
  return check->lease.owns();
}

Millis OwnedShard::remaining() const noexcept {
  if (check == nullptr || stop.stop_requested()) return Millis{0};
  if (check->fork_gen != detail::fork_generation()) return Millis{0};
  std::lock_guard lk(check->mu);
  return check->lease.owns() ? check->lease.remaining() : Millis{0};
}

ShardGroup::ShardGroup(ShardGroup&&) noexcept = default;
ShardGroup& ShardGroup::operator=(ShardGroup&& o) noexcept {
  if (this != &o) {
    leave();
    core_ = std::move(o.core_);
  }
  return *this;
}
ShardGroup::~ShardGroup() {
  leave();
}

void ShardGroup::leave() noexcept {
  if (!core_) return;
  if (core_->forked()) {
    // In a forked child: the group, its thread, its leases and its mutex are the parent's.
    // Nothing here may release them (the engine refuses a forked child's releases anyway)
    // or wait for the mutex, which another thread of the parent may have held at the fork
    // and no thread of the child will ever unlock. The child's group is kept, never
    // destroyed (its std::thread and mutex cannot be torn down here), and owns nothing.
    auto* kept = new std::shared_ptr<Core>(std::move(core_));  // never read, never freed
    static_cast<void>(kept);
    return;
  }
  core_->leave();
}

ShardAssignment ShardGroup::assigned() const {
  if (!core_ || core_->forked()) return {};
  std::lock_guard lk(core_->mu);
  return core_->published;
}

ShardAssignment ShardGroup::wait_change(std::uint64_t after_version, Millis timeout) const {
  if (!core_ || core_->forked()) return {};
  std::unique_lock lk(core_->mu);
  auto ready = [&] { return core_->stopping || core_->published.version > after_version; };
  // LockOptions::max_wait (100 years) or more is no limit: wait_for would overflow the clock's
  // nanoseconds and return at once.
  if (timeout >= LockOptions::max_wait) {
    core_->cv.wait(lk, ready);
  } else {
    core_->cv.wait_for(lk, timeout, ready);
  }
  return core_->published;
}

const std::string& ShardGroup::member_id() const noexcept {
  static const std::string none;
  return core_ ? core_->member_id : none;
}
const std::string& ShardGroup::job() const noexcept {
  static const std::string none;
  return core_ ? core_->job : none;
}
std::uint32_t ShardGroup::shards() const noexcept {
  return core_ ? core_->shards : 0;
}
ShardGroupStats ShardGroup::stats() const {
  if (!core_ || core_->forked()) return {};
  std::lock_guard lk(core_->mu);
  return core_->counters;
}

std::string ShardGroup::metrics() const {
  if (!core_) return {};
  const ShardGroupStats st = stats();
  std::string job_label;
  for (char c : core_->job) {  // the exposition format's label value escapes
    if (c == '\\')
      job_label += "\\\\";
    else if (c == '"')
      job_label += "\\\"";
    else if (c == '\n')
      job_label += "\\n";
    else
      job_label += c;
  }
  const std::string label = "{job=\"" + job_label + "\"} ";
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, const std::string& value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name +
           label + value + "\n";
  };
  family("distlock_shard_owned", "gauge", "Shards this member owns now.", std::to_string(st.shards_owned));
  family("distlock_shard_rebalances_total", "counter", "Rebalances that changed this member's target.",
         std::to_string(st.rebalances));
  family("distlock_shard_taken_total", "counter", "Shards this member acquired.",
         std::to_string(st.shards_taken));
  family("distlock_shard_given_up_total", "counter", "Shards this member released for a rebalance or leave.",
         std::to_string(st.shards_given_up));
  family("distlock_shard_lost_total", "counter", "Shard leases this member lost.",
         std::to_string(st.shards_lost));
  family("distlock_shard_membership_lost_total", "counter", "Membership leases this member lost.",
         std::to_string(st.membership_lost));
  family("distlock_shard_list_failures_total", "counter", "Rebalances skipped because a list failed.",
         std::to_string(st.list_failures));
  family("distlock_shard_rejoin_failures_total", "counter",
         "Attempts to rejoin after a lost membership refused because the member id is held (rising past one "
         "TTL: another process uses this member id).",
         std::to_string(st.rejoin_failures));
  family("distlock_shard_watching", "gauge",
         "1 if this member follows the group by watching it, 0 if it lists the group every period.",
         st.watching ? "1" : "0");
  family("distlock_shard_watch_gaps_total", "counter",
         "Gaps this member's watches reported (each followed by a re-list of the group).",
         std::to_string(st.watch_gaps));
  family("distlock_shard_safety_relists_total", "counter",
         "Safety re-lists of a watching member applied to its view.", std::to_string(st.safety_relists));
  if (st.last_rebalance_time) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(st.last_rebalance_time->count()) / 1000.0);
    family("distlock_shard_last_rebalance_seconds", "gauge",
           "From this member's last change of target until it owned exactly that target.", buf);
  }
  return out;
}

std::string ShardGroup::member_lock_name(std::string_view job, std::string_view member_id) {
  return std::string(job) + "/members/" + std::string(member_id);
}
std::string ShardGroup::shard_lock_name(std::string_view job, std::uint32_t index) {
  return std::string(job) + "/shard/" + std::to_string(index);
}

ShardGroup Client::shard_group(std::string_view job, std::uint32_t shards, const ShardGroupOptions& opts) {
  return ShardGroup(*this, std::string(job), shards, opts);
}
ShardGroup Client::shard_group(std::string_view job, std::uint32_t shards) {
  return ShardGroup(*this, std::string(job), shards, ShardGroupOptions{});
}

}  // namespace distlock
