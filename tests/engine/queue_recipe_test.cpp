// The queue recipe (engine/queue_recipe.hpp) over a fake store with sessions: a session
// that ends while an acquisition's enqueue runs must leave no place behind.
//
// The store below is the worst a store may do: its enqueue, finding a newer session
// than the entry's (an expiry replaced it while it waited for a connection), moves the
// entry to it and makes the place there (ZooKeeper's enqueue did so in the first version
// of the recipe); its keeper takes every entry when a session ends and calls
// end_session. The hook runs that keeper step while enqueue waits for the session, so
// the entry is in the recipe's table when the session ends. Both tests failed against
// that first version: the place was left first in the queue, with no entry and no
// orphan standing for it, blocking the lock for as long as the session lived.
#include "engine/queue_recipe.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace distlock::detail {
namespace {

struct FakeEntry final : QueueEntry {
  using QueueEntry::QueueEntry;
  std::uint64_t generation = 0;
  std::uint64_t place = 0;  // 0: none
};

// The server: one queue (lock "L"), places ordered by id (czxid), each owned by a session.
struct Server {
  std::map<std::uint64_t, std::uint64_t> places;  // id -> session generation
  std::uint64_t next_id = 100;
};

class FakeZkStore : public QueueStore {
 public:
  explicit FakeZkStore(Server& srv) : srv_(srv) {}
  QueueRecipe* recipe = nullptr;
  std::uint64_t current_gen = 1;
  std::function<void()> while_waiting_for_session;  // runs once, inside enqueue
  std::vector<std::uint64_t> deleted;

  void expire_and_replace() {  // the keeper (replace_expired_session)
    std::vector<QueueEntryPtr> lost;
    {
      std::lock_guard lk(recipe->mutex());
      lost = recipe->take_locked([](const QueueEntry&) { return true; });
      recipe->drop_orphans_locked([](const QueueEntry&) { return true; });
      // the old session's ephemeral places go with it
      std::erase_if(srv_.places, [&](const auto& kv) { return kv.second == current_gen; });
      ++current_gen;
    }
    recipe->end_session(lost);
  }

  bool admit(const AcquireRequest&, Clock::time_point, Error&) override { return true; }
  QueueEntryPtr new_entry(const AcquireRequest& req, Error&) override {
    auto e = std::make_shared<FakeEntry>(req.name, req.owner);
    std::lock_guard lk(recipe->mutex());
    e->generation = current_gen;
    return e;
  }
  bool live(const QueueEntry& e) const override {
    return static_cast<const FakeEntry&>(e).generation == current_gen;
  }
  QueuePosition enqueue(QueueEntry& qe, const AcquireRequest&, Clock::time_point, Error&) override {
    auto& e = static_cast<FakeEntry&>(qe);
    // usable_session(): the hook models the wait during which the keeper replaced it.
    if (while_waiting_for_session) std::exchange(while_waiting_for_session, nullptr)();
    std::lock_guard lk(recipe->mutex());
    if (e.generation != current_gen) {  // fresh_in(s)
      e.generation = current_gen;
      e.place = 0;
    }
    if (e.place == 0 || !srv_.places.count(e.place)) {
      e.place = srv_.next_id++;
      srv_.places[e.place] = current_gen;
    }
    e.token = e.place;
    QueuePosition pos;
    pos.kind =
        srv_.places.begin()->first == e.place ? QueuePosition::Kind::first : QueuePosition::Kind::behind;
    pos.validity = Millis(1000);
    return pos;
  }
  std::optional<Millis> grant(QueueEntry& qe, const QueuePosition& pos) override {
    auto& e = static_cast<FakeEntry&>(qe);
    if (e.generation != current_gen) return std::nullopt;
    return pos.validity;
  }
  Watch watch_predecessor(QueueEntry&, Clock::time_point, Error&) override { return Watch::watching; }
  Deleted delete_place(QueueEntry& qe, Error&) override {
    auto& e = static_cast<FakeEntry&>(qe);
    std::lock_guard lk(recipe->mutex());
    if (e.generation != current_gen || e.place == 0) return Deleted::gone;
    if (srv_.places.erase(e.place) == 0) return Deleted::gone;
    deleted.push_back(e.place);
    return Deleted::deleted;
  }
  void confirm(std::span<QueueEntry* const>, std::span<RenewStatus> out, Clock::time_point, Error&) override {
    std::fill(out.begin(), out.end(), RenewStatus::renewed);
  }
  void confirmed(QueueEntry&, Clock::time_point) override {}

 private:
  Server& srv_;
};

struct CountingListener : ChangeListener {
  int changes = 0, lost = 0;
  void on_change(std::string_view) noexcept override { ++changes; }
  void on_lease_lost(std::string_view, std::string_view) noexcept override { ++lost; }
  void on_session_lost() noexcept override {}
  void on_validity_changed(Millis) noexcept override {}
};

// Places of the live session that no entry and no orphan of the recipe stands for:
// nobody will ever delete them while the session lives.
std::vector<std::uint64_t> unaccounted(Server& srv, FakeZkStore& store, QueueRecipe& recipe) {
  std::vector<std::uint64_t> known;
  std::lock_guard lk(recipe.mutex());
  recipe.for_each_locked([&](QueueEntry& e) { known.push_back(static_cast<FakeEntry&>(e).place); });
  auto orphans = recipe.take_orphans_locked();
  for (auto& o : orphans) known.push_back(static_cast<FakeEntry&>(*o).place);
  std::vector<std::uint64_t> out;
  for (auto& [id, gen] : srv.places) {
    if (gen == store.current_gen && std::find(known.begin(), known.end(), id) == known.end())
      out.push_back(id);
  }
  return out;
}

// Session replaced while the first try's enqueue waits for it: the place enqueue then
// makes in the new session is first, but its entry is no longer in the table.
TEST(QueueRecipe, ASessionEndDuringEnqueueLeavesNoPlaceAheadOfEveryone) {
  Server srv;
  FakeZkStore store(srv);
  QueueRecipe recipe(store, system_steady_clock(), Logger{});
  store.recipe = &recipe;
  CountingListener listener;
  recipe.set_listener(&listener);
  store.while_waiting_for_session = [&] { store.expire_and_replace(); };

  Error ec;
  const AcquireResult r = recipe.try_acquire({"L", "owner.1", Millis(1000), true}, ec);
  EXPECT_FALSE(ec);
  // Unfixed, the engine gets busy: its second place queues behind the first.
  if (!r.acquired) recipe.cancel_acquire("L", "owner.1");  // the engine gives up
  const auto leaked = unaccounted(srv, store, recipe);
  EXPECT_TRUE(leaked.empty()) << leaked.size() << " place(s) of the live session left on the server, "
                              << "first in the queue: lock L is blocked for as long as the session lives";
  // Any later acquisition, by anyone, is behind it.
  if (!r.acquired) {
    const AcquireResult r2 = recipe.try_acquire({"L", "owner.2", Millis(1000), false}, ec);
    EXPECT_TRUE(r2.acquired) << "lock L stays busy behind the leaked place";
  } else {
    EXPECT_EQ(srv.places.size(), 1u);  // only the granted place
  }
}

// Same with a waiter (keep_queued, behind a holder of another client): the entry's place
// is made in the new session, watched, and the entry is no longer in the table.
TEST(QueueRecipe, ASessionEndDuringAWaitersEnqueueLeavesNoPlaceAfterCancel) {
  Server srv;
  srv.places[1] = 999;  // another client's holder, its own session
  FakeZkStore store(srv);
  QueueRecipe recipe(store, system_steady_clock(), Logger{});
  store.recipe = &recipe;
  store.while_waiting_for_session = [&] { store.expire_and_replace(); };

  Error ec;
  const AcquireResult r = recipe.try_acquire({"L", "owner.1", Millis(1000), true}, ec);
  EXPECT_FALSE(r.acquired);
  recipe.cancel_acquire("L", "owner.1");  // the engine gives up: must delete our place
  srv.places.erase(1);                    // the other client releases
  const auto leaked = unaccounted(srv, store, recipe);
  EXPECT_TRUE(leaked.empty()) << leaked.size() << " place(s) of the live session left after cancel_acquire";
}

}  // namespace
}  // namespace distlock::detail
