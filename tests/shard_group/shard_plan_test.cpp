// The shard group's assignment rule (src/api/shard_plan.hpp): balanced, sticky (moves
// exactly what balance requires), the same whatever order the members were listed in.
#include "api/shard_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "support/workload_size.hpp"

using distlock::detail::plan_shards;

namespace {

// Random histories per model test: 3,000, a quarter in a sanitized build
// (support/workload_size.hpp).
constexpr int kRandomRounds = distlock::testing::workload_size(3000);

using Owners = std::vector<std::optional<std::string>>;

std::vector<std::string> ids(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("m" + std::to_string(i));
  return v;
}

// Owners a plan describes.
Owners owners_of(std::uint32_t shards, const std::map<std::string, std::vector<std::uint32_t>>& plan) {
  Owners o(shards);
  for (const auto& [m, v] : plan)
    for (auto i : v) o[i] = m;
  return o;
}

}  // namespace

TEST(ShardPlan, OneMemberOwnsEverythingAndNoMemberNothing) {
  auto p = plan_shards(5, {"a"}, {});
  EXPECT_EQ(p.at("a"), (std::vector<std::uint32_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(plan_shards(5, {}, {}).empty());
}

TEST(ShardPlan, AJoinMovesOnlyWhatBalanceRequires) {
  // a owns all 12; b joins: a keeps 0..5, b takes 6..11.
  Owners all_a(12, std::string("a"));
  auto p = plan_shards(12, {"a", "b"}, all_a);
  EXPECT_EQ(p.at("a"), (std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(p.at("b"), (std::vector<std::uint32_t>{6, 7, 8, 9, 10, 11}));
  // c joins: 2 from each of a and b.
  auto p3 = plan_shards(12, {"c", "b", "a"}, owners_of(12, p));
  EXPECT_EQ(p3.at("a"), (std::vector<std::uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(p3.at("b"), (std::vector<std::uint32_t>{6, 7, 8, 9}));
  EXPECT_EQ(p3.at("c"), (std::vector<std::uint32_t>{4, 5, 10, 11}));
}

TEST(ShardPlan, TheExtraShardsStayWithTheMembersThatHoldThem) {
  // 7 shards over 2 members: b holds 4, a holds 3 -> b keeps its 4 (the ceil goes to it).
  Owners o = {"a", "a", "a", "b", "b", "b", "b"};
  auto p = plan_shards(7, {"a", "b"}, o);
  EXPECT_EQ(p.at("a").size(), 3u);
  EXPECT_EQ(p.at("b").size(), 4u);
  EXPECT_EQ(owners_of(7, p), o);
}

// A random state of a group: 1-70 shards over 1-12 live members (ids(w)), each shard unowned,
// owned by a member, or owned by a dead member ("dead").
struct RandomState {
  std::uint32_t m;
  int w;
  std::vector<std::string> members;
  Owners owners;
};
RandomState random_state(std::mt19937& rng) {
  const std::uint32_t m = 1 + rng() % 70;
  const int w = 1 + static_cast<int>(rng() % 12);
  auto members = ids(w);
  Owners owners(m);
  for (auto& o : owners) {
    const auto r = rng() % (w + 3);  // some unowned, some owned by a dead member
    if (r < static_cast<unsigned>(w))
      o = members[r];
    else if (r == static_cast<unsigned>(w))
      o = std::string("dead");
  }
  return {m, w, std::move(members), std::move(owners)};
}

TEST(ShardPlan, RandomStatesAreBalancedStickyAndOrderFree) {
  std::mt19937 rng(20261128);
  for (int round = 0; round < 2000; ++round) {  // bounded: 2000 random states
    const auto [m, w, members, owners] = random_state(rng);
    auto shuffled = members;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const auto p = plan_shards(m, shuffled, owners);
    ASSERT_EQ(p, plan_shards(m, members, owners)) << "round " << round;
    ASSERT_EQ(p.size(), static_cast<std::size_t>(w));
    std::set<std::uint32_t> seen;
    std::size_t moved = 0;
    std::map<std::string, std::size_t> had;
    for (std::uint32_t i = 0; i < m; ++i)
      if (owners[i] && *owners[i] != "dead") ++had[*owners[i]];
    std::size_t excess = 0;
    for (const auto& [id, v] : p) {
      ASSERT_TRUE(v.size() == m / w || v.size() == (m + w - 1) / w) << "round " << round << " " << id;
      for (auto i : v) {
        ASSERT_TRUE(seen.insert(i).second) << "shard " << i << " twice, round " << round;
        if (owners[i] && *owners[i] != "dead" && *owners[i] != id) ++moved;
      }
      if (had[id] > v.size()) excess += had[id] - v.size();
    }
    ASSERT_EQ(seen.size(), m);
    // Sticky: a live owner's shard moves only when that owner is over its quota.
    ASSERT_EQ(moved, excess) << "round " << round;
  }
}

// Members list at different moments, so each one carries its part of a plan out while the
// others have not yet: the plan computed from such a half-done state must be the same plan,
// or a member that listed later is sent after other shards and balance takes another period.
// Seen with a graceful leave of one of 4 members over 16 shards (bench/shards): the survivors
// each held 4 and 4 were free; the first survivor to list took its share (4 -> 5), which made it
// the member "holding the most", so the next one to list gave it the extra shard (6) that the
// first plan had given to another member: balanced only at the first survivor's next listing,
// two periods after the leave.
TEST(ShardPlan, ThePlanStaysTheSameWhileMembersCarryItOutOneByOne) {
  Owners o(16);
  for (std::uint32_t i = 0; i < 12; ++i) o[i] = "m" + std::to_string(1 + i / 4);  // m1..m3 hold 4 each
  const auto p = plan_shards(16, {"m1", "m2", "m3"}, o);
  for (const std::string first : {"m1", "m2", "m3"}) {
    Owners half = o;
    for (auto i : p.at(first)) half[i] = first;  // `first` took its share, the others not yet
    EXPECT_EQ(plan_shards(16, {"m1", "m2", "m3"}, half), p) << first << " carried its part out first";
  }
}

TEST(ShardPlan, RandomHalfDoneStatesPlanTheSame) {
  std::mt19937 rng(20261129);
  for (int round = 0; round < 2000; ++round) {  // bounded: 2000 random states
    const auto [m, w, members, owners] = random_state(rng);
    const auto p = plan_shards(m, members, owners);
    // A random subset of the members carries its part out: each releases what the plan takes
    // from it, then takes what the plan gives it that nobody live outside the subset holds.
    std::set<std::string> doing;
    for (const auto& id : members)
      if (rng() % 2) doing.insert(id);
    Owners half = owners;
    for (std::uint32_t i = 0; i < m; ++i)
      if (half[i] && doing.contains(*half[i])) half[i].reset();
    for (std::uint32_t i = 0; i < m; ++i)
      if (half[i] == std::string("dead")) half[i].reset();
    for (const auto& id : doing)
      for (auto i : p.at(id))
        if (!half[i]) half[i] = id;
    ASSERT_EQ(plan_shards(m, members, half), p)
        << "round " << round << ": " << m << " shards, " << w << " members";
  }
}

// ---- review: a model of the group's protocol on the plan (no servers) ----
// Members rebalance in turn, each from a listing that may be stale (taken before the previous
// members in the period acted); a release hands the shard to the first member waiting on it
// (FIFO, as the lock does). After a join (or leave), everyone rebalancing once should balance.
namespace {

struct Model {
  std::uint32_t m;
  std::vector<std::string> live;
  Owners owner;
  std::map<std::string, std::set<std::uint32_t>> wanted;
  std::map<std::uint32_t, std::vector<std::string>> queue;  // FIFO waiters per shard
  std::mt19937* slow = nullptr;  // when set: a release wakes its waiter only half the time at once

  void hand_out() {
    if (slow && (*slow)() % 2) return;  // the taker's acquisition is still on its way
    for (std::uint32_t i = 0; i < m; ++i) {
      if (owner[i]) continue;
      auto& q = queue[i];
      while (!q.empty()) {
        const auto who = q.front();
        q.erase(q.begin());
        if (std::find(live.begin(), live.end(), who) != live.end() && wanted[who].contains(i)) {
          owner[i] = who;
          break;
        }
      }
    }
  }
  // m rebalances from a listing (members, owners) it took earlier.
  void act(const std::string& me, const std::vector<std::string>& seen_live, const Owners& seen_owner) {
    if (std::find(live.begin(), live.end(), me) == live.end()) return;
    Owners view = seen_owner;
    for (auto& o : view)
      if (o == me) o.reset();
    for (std::uint32_t i = 0; i < m; ++i)
      if (owner[i] == me) view[i] = me;  // its own holdings are what it holds now
    auto lv = seen_live;
    lv.push_back(me);
    auto plan = plan_shards(m, lv, view);
    std::set<std::uint32_t> target(plan[me].begin(), plan[me].end());
    wanted[me] = target;
    for (auto& [i, q] : queue)
      std::erase_if(q, [&](const std::string& w) { return w == me && !target.contains(i); });
    for (std::uint32_t i = 0; i < m; ++i)
      if (owner[i] == me && !target.contains(i)) owner[i].reset();
    for (auto i : target)
      if (owner[i] != me && std::find(queue[i].begin(), queue[i].end(), me) == queue[i].end())
        queue[i].push_back(me);
    hand_out();
  }
  bool balanced() const {
    const auto w = live.size();
    std::map<std::string, std::size_t> c;
    for (auto& id : live) c[id] = 0;
    for (auto& o : owner) {
      if (!o) return false;
      if (!c.contains(*o)) return false;
      ++c[*o];
    }
    for (auto& [id, n] : c)
      if (n != m / w && n != (m + w - 1) / w) return false;
    return true;
  }
};

// One period: each live member rebalances once, in `order`; a member's listing is stale with
// probability 1/2 (taken at the start of the period, before the others in it acted).
void period(Model& md, std::vector<std::string> order, std::mt19937& rng, bool stale) {
  const auto live0 = md.live;
  const auto owner0 = md.owner;
  for (const auto& me : order) {
    if (stale && rng() % 2)
      md.act(me, live0, owner0);
    else
      md.act(me, md.live, md.owner);
  }
}

// A model of `m` shards among the members m0..m<w-1>, after up to six periods from fresh
// listings: balanced, unless the rule is wrong (the caller asserts it).
Model settled_model(std::uint32_t m, int w, std::mt19937& rng) {
  Model md{m, ids(w), Owners(m), {}, {}};
  for (int k = 0; k < 6 && !md.balanced(); ++k) period(md, md.live, rng, false);
  return md;
}

// `joiner` joins: it is live and makes its first rebalance at once.
void join(Model& md, const std::string& joiner) {
  md.live.push_back(joiner);
  md.act(joiner, md.live, md.owner);
}

// One round of the join cases: a group of 1-9 members over 1-64 shards (drawn from `rng`),
// settled, then joined by one more member, named to sort after the others or before them.
// `slow`: acquisitions lag behind releases (Model::slow) from the join on.
struct JoinRound {
  std::uint32_t m;
  int w;
  bool settled;  // balanced before the join
  Model md;
};
JoinRound settled_group_joined(std::mt19937& rng, bool slow) {
  const std::uint32_t m = 1 + rng() % 64;
  const int w = 1 + static_cast<int>(rng() % 9);
  Model md = settled_model(m, w, rng);
  const bool settled = md.balanced();
  if (slow) md.slow = &rng;
  const std::string joiner = rng() % 2 ? "m" + std::to_string(w) : std::string("a-joiner");
  join(md, joiner);
  return {m, w, settled, std::move(md)};
}

// Periods of every live member in a random order (listings `stale` or fresh), `after_each`
// run after each, until the group is balanced or `limit` periods passed: how many ran.
int periods_until_balanced(
    Model& md, std::mt19937& rng, bool stale, int limit, const std::function<void()>& after_each = [] {}) {
  int periods = 0;
  while (!md.balanced() && periods < limit) {
    auto order = md.live;
    std::shuffle(order.begin(), order.end(), rng);
    period(md, order, rng, stale);
    after_each();
    ++periods;
  }
  return periods;
}

}  // namespace

TEST(ShardPlanConvergence, AJoinIsBalancedAfterOnePeriodFromFreshListings) {
  std::mt19937 rng(7);
  int worst = 0;
  for (int round = 0; round < kRandomRounds; ++round) {
    const std::uint32_t m = 1 + rng() % 64;
    const int w = 1 + static_cast<int>(rng() % 9);
    Model md = settled_model(m, w, rng);
    ASSERT_TRUE(md.balanced()) << "round " << round << " never balanced before the join";
    // a joiner: its first rebalance at once, then one period of everyone in random order.
    const std::string j = "m" + std::to_string(rng() % 2 ? w : 100 + w);  // id sorts anywhere
    const std::string joiner = rng() % 3 ? j : std::string("a-joiner");
    join(md, joiner);
    const int periods = periods_until_balanced(md, rng, /*stale=*/false, 10);
    worst = std::max(worst, periods);
    ASSERT_LE(periods, 1) << "round " << round << ": " << m << " shards, " << w << "+1 members, joiner "
                          << joiner << ": balanced only after " << periods << " periods";
  }
  std::printf("worst: %d periods\n", worst);
}

TEST(ShardPlanConvergence, AJoinIsBalancedAfterOnePeriodFromStaleListings) {
  std::mt19937 rng(8);
  std::map<int, int> hist;
  for (int round = 0; round < kRandomRounds; ++round) {
    auto [m, w, settled, md] = settled_group_joined(rng, /*slow=*/false);
    ASSERT_TRUE(settled);
    const int periods = periods_until_balanced(md, rng, /*stale=*/true, 20);
    ++hist[periods];
    // Every listing in that period is a half-done state of the one plan made after the join.
    ASSERT_LE(periods, 1) << "round " << round << ": " << m << " shards, " << w
                          << "+1 members: balanced after " << periods << " periods";
  }
  for (auto [p, n] : hist) std::printf("%d periods: %d\n", p, n);
}

TEST(ShardPlanConvergence, ALeaveOrDeathIsBalancedAfterOnePeriod) {
  std::mt19937 rng(9);
  for (int round = 0; round < kRandomRounds; ++round) {
    const std::uint32_t m = 1 + rng() % 64;
    const int w = 2 + static_cast<int>(rng() % 9);
    Model md = settled_model(m, w, rng);
    ASSERT_TRUE(md.balanced());
    const auto gone = md.live[rng() % w];
    std::erase(md.live, gone);
    for (auto& o : md.owner)
      if (o == gone) o.reset();
    const int periods = periods_until_balanced(md, rng, /*stale=*/false, 10);
    ASSERT_LE(periods, 1) << "round " << round << ": " << m << " shards, " << w << "-1 members, " << gone
                          << " left: balanced after " << periods << " periods";
  }
}

// Random histories: joins, deaths and leaves while a rebalance is half done, listings stale
// (members and shards listed at different moments), stale waiters queued first. Once membership
// stops changing the group must converge, and then stay put.
TEST(ShardPlanConvergence, RandomHistoriesConvergeAndStayPut) {
  std::mt19937 rng(11);
  std::map<int, int> hist;
  for (int round = 0; round < kRandomRounds; ++round) {
    const std::uint32_t m = 1 + rng() % 40;
    int next_id = 0;
    Model md{m, {}, Owners(m), {}, {}};
    const int w0 = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < w0; ++k) md.live.push_back("m" + std::to_string(next_id++));
    for (auto& o : md.owner)
      if (rng() % 2) o = md.live[rng() % md.live.size()];
    for (int ev = 0; ev < 8; ++ev) {
      // a period with a membership change somewhere inside it
      auto order = md.live;
      std::shuffle(order.begin(), order.end(), rng);
      const auto live0 = md.live;
      const auto owner0 = md.owner;
      const std::size_t at = rng() % (order.size() + 1);
      for (std::size_t k = 0; k <= order.size(); ++k) {
        if (k == at) {
          const auto r = rng() % 3;
          if (r == 0 || md.live.size() <= 1) {
            const std::string j = "m" + std::to_string(next_id++);
            md.live.push_back(j);
            md.act(j, md.live, md.owner);
          } else {
            const auto gone = md.live[rng() % md.live.size()];
            std::erase(md.live, gone);
            md.wanted.erase(gone);
            for (auto& o : md.owner)
              if (o == gone) o.reset();  // leave, or death past its TTL
            md.hand_out();
          }
        }
        if (k == order.size()) break;
        const auto& me = order[k];
        const auto r = rng() % 3;
        if (r == 0)
          md.act(me, live0, owner0);  // listed at the period's start
        else if (r == 1)
          md.act(me, live0, md.owner);  // members early, shards now
        else
          md.act(me, md.live, md.owner);
      }
    }
    const int periods = periods_until_balanced(md, rng, /*stale=*/false, 20);  // fresh listings from here on
    ++hist[periods];
    ASSERT_LE(periods, 1) << "round " << round << ": " << m << " shards, " << md.live.size()
                          << " members: balanced after " << periods << " periods";
    const auto settled = md.owner;
    for (int k = 0; k < 3; ++k) {
      auto order = md.live;
      std::shuffle(order.begin(), order.end(), rng);
      period(md, order, rng, true);
      ASSERT_EQ(md.owner, settled) << "round " << round << ": moved after balancing";
    }
  }
  for (auto [p, n] : hist) std::printf("%d periods: %d\n", p, n);
}

// The same with acquisitions that lag behind the releases (another member lists while a
// released shard has no owner yet): at the end of each period every pending take completes.
TEST(ShardPlanConvergence, SlowTakesStillBalanceAJoinInOnePeriod) {
  std::mt19937 rng(12);
  for (int round = 0; round < kRandomRounds; ++round) {
    auto [m, w, settled, md] = settled_group_joined(rng, /*slow=*/true);
    ASSERT_TRUE(settled);
    const int periods = periods_until_balanced(md, rng, /*stale=*/true, 10, [&] {
      md.slow = nullptr;  // every pending take completes by the period's end
      md.hand_out();
      md.slow = &rng;
    });
    ASSERT_LE(periods, 1) << "round " << round << ": " << m << " shards, " << w
                          << "+1 members: balanced after " << periods << " periods";
  }
}
