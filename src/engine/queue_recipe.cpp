// The queue recipe's flows (queue_recipe.hpp says the rules).
#include "engine/queue_recipe.hpp"

#include <algorithm>

namespace distlock::detail {

namespace {

// Rounds one try_acquire may go through while places come and go under it (the
// predecessor vanished before its watch was set, the session ended, ...).
constexpr int kMaxRounds = 16;

}  // namespace

bool QueueRecipe::live_entry(const QueueEntryPtr& e) const {
  LockGuard lk(mu_);
  return store_.live(*e);
}

bool QueueRecipe::in_table(const std::string& key, const QueueEntryPtr& e) const {
  LockGuard lk(mu_);
  auto it = entries_.find(key);
  return it != entries_.end() && it->second == e;
}

void QueueRecipe::forget(const QueueEntryPtr& e) noexcept {
  {
    LockGuard lk(mu_);
    auto it = entries_.find(name_owner_key(e->name, e->owner));
    if (it != entries_.end() && it->second == e) entries_.erase(it);
  }
  store_.forgotten(*e);
}

void QueueRecipe::orphan(QueueEntryPtr e) noexcept {
  {
    LockGuard lk(mu_);
    orphans_.push_back(std::move(e));
  }
  store_.orphans_waiting();
}

void QueueRecipe::give_up(const QueueEntryPtr& e) noexcept {
  Error ec;
  if (store_.delete_place(*e, ec) == QueueStore::Deleted::retry) orphan(e);
}

void QueueRecipe::clear_orphans_of(std::string_view name) noexcept {
  std::vector<QueueEntryPtr> mine;
  {
    LockGuard lk(mu_);
    for (auto it = orphans_.begin(); it != orphans_.end();) {
      if ((*it)->name == name) {
        mine.push_back(std::move(*it));
        it = orphans_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (!mine.empty()) retry_orphans(std::move(mine));
}

std::size_t QueueRecipe::retry_orphans(std::vector<QueueEntryPtr> orphans) noexcept {
  std::size_t deleted = 0;
  bool kept = false;
  for (auto& e : orphans) {
    Error ec;
    switch (store_.delete_place(*e, ec)) {
      case QueueStore::Deleted::deleted:
        ++deleted;
        log_.log(LogLevel::info, "removed the queue place of an abandoned attempt on lock \"{}\"", e->name);
        break;
      case QueueStore::Deleted::retry: {
        LockGuard lk(mu_);
        orphans_.push_back(std::move(e));
        kept = true;
        break;
      }
      case QueueStore::Deleted::gone:
      case QueueStore::Deleted::failed: break;
    }
  }
  if (kept) store_.orphans_waiting();
  return deleted;
}

void QueueRecipe::end_session(const std::vector<QueueEntryPtr>& entries) noexcept {
  for (const auto& e : entries) store_.forgotten(*e);
  ChangeListener* l = listener();
  if (l == nullptr) return;
  for (const auto& e : entries) {
    if (e->held) l->on_lease_lost(e->name, e->owner);
  }
  // Waiters look again: their places went with the session; they queue anew.
  for (const auto& e : entries) {
    if (!e->held) l->on_change(e->name);
  }
}

void QueueRecipe::drop_stale(const std::vector<QueueEntryPtr>& entries) noexcept {
  ChangeListener* l = listener();
  for (const auto& e : entries) {
    store_.forgotten(*e);
    log_.log(LogLevel::info, "deleting the queue place of lost lock \"{}\"", e->name);
    if (l != nullptr) l->on_lease_lost(e->name, e->owner);
    give_up(e);
  }
}

QueueEntryPtr QueueRecipe::reusable_entry(const std::string& key, const AcquireRequest& req) {
  QueueEntryPtr e;
  QueueEntryPtr old;
  {
    LockGuard lk(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      if (!it->second->held && store_.reusable(*it->second, req)) {
        e = it->second;
      } else {
        // A held entry here means the engine declared that hold lost (its local
        // deadline passed): its place must not be reused, or the old token would be
        // handed out again.
        old = std::move(it->second);
        entries_.erase(it);
      }
    }
  }
  if (old) {
    store_.forgotten(*old);
    give_up(old);
  }
  return e;
}

bool QueueRecipe::add_entry(const std::string& key, const QueueEntryPtr& e) {
  LockGuard lk(mu_);
  // Its session may have ended since new_entry read it, before this entry was in the
  // table for that session's end to take: such an entry would outlive it.
  if (!store_.live(*e)) return false;
  entries_[key] = e;
  return true;
}

std::optional<AcquireResult> QueueRecipe::grant_first(const std::string& key, const QueueEntryPtr& e,
                                                      const QueuePosition& pos) {
  std::optional<Millis> validity;
  std::uint64_t token = 0;
  {
    LockGuard lk(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second == e) {
      validity = store_.grant(*e, pos);
      if (validity) {
        e->held = true;
        token = e->token;
      } else {
        entries_.erase(it);
      }
    }
  }
  if (!validity) {
    // The session that answered has ended (or ends now): its place goes with it, and
    // a place that somehow outlived it is deleted. Queue anew.
    store_.forgotten(*e);
    give_up(e);
    return std::nullopt;
  }
  return AcquireResult{true, token, std::max(*validity, Millis(1)), std::nullopt};
}

AcquireResult QueueRecipe::try_acquire(const AcquireRequest& req, Error& ec) {
  ec.clear();
  const Clock::time_point started = clock_->now();
  if (!store_.admit(req, started, ec)) return {};
  const std::string key = name_owner_key(req.name, req.owner);
  AcquireResult busy;
  QueueEntryPtr e;
  for (int round = 0; round < kMaxRounds; ++round) {
    e = reusable_entry(key, req);
    if (!e) {
      clear_orphans_of(req.name);
      e = store_.new_entry(req, ec);
      if (!e) return {};
      if (!add_entry(key, e)) continue;
    }

    const QueuePosition pos = store_.enqueue(*e, req, started, ec);
    if (pos.kind != QueuePosition::Kind::failed && !in_table(key, e)) {
      // A session's end took the entry while enqueue ran. Whatever place enqueue made
      // must not outlive the entry: nobody would delete it, and it would queue ahead of
      // everyone for as long as its session lives. (Gone already if it was made in the
      // ended session.)
      store_.forgotten(*e);
      give_up(e);
      continue;
    }
    switch (pos.kind) {
      case QueuePosition::Kind::first:
        if (auto granted = grant_first(key, e, pos)) return *granted;
        continue;
      case QueuePosition::Kind::behind:
        busy.holder_ttl = pos.holder_ttl;
        if (!req.keep_queued) {
          forget(e);
          give_up(e);
          return busy;
        }
        switch (store_.watch_predecessor(*e, started, ec)) {
          case QueueStore::Watch::watching:
            return busy;  // the watch calls on_change(name) when the predecessor goes
          case QueueStore::Watch::gone: continue;
          case QueueStore::Watch::failed:
            // The server just failed a call: the place goes later, not in this call.
            forget(e);
            orphan(e);
            return {};
        }
        break;
      case QueuePosition::Kind::again: continue;
      case QueuePosition::Kind::held_back:
        busy.holder_ttl = pos.holder_ttl;
        if (!req.keep_queued) {
          forget(e);
          give_up(e);
        }
        return busy;
      case QueuePosition::Kind::busy:
        busy.holder_ttl = pos.holder_ttl;
        forget(e);
        give_up(e);
        return busy;
      case QueuePosition::Kind::failed:
        // The place may exist (a create whose answer was lost): it goes, later.
        forget(e);
        orphan(e);
        return {};
    }
  }
  // The queue kept changing under us: busy, and the engine comes back. A waiter keeps
  // its place, if its session still lives (no session's end would take it otherwise).
  if (e && (!req.keep_queued || !live_entry(e))) {
    forget(e);
    give_up(e);
  }
  return busy;
}

void QueueRecipe::cancel_acquire(std::string_view name, std::string_view owner) noexcept {
  QueueEntryPtr e;
  try {
    LockGuard lk(mu_);
    auto it = entries_.find(name_owner_key(name, owner));
    if (it == entries_.end() || it->second->held) return;
    e = std::move(it->second);
    entries_.erase(it);
  } catch (...) {
    return;  // the key could not be built: nothing of ours can be found under it
  }
  store_.forgotten(*e);
  give_up(e);
}

ReleaseStatus QueueRecipe::release(std::string_view name, std::string_view owner, std::uint64_t token,
                                   Error& ec) {
  ec.clear();
  QueueEntryPtr e;
  bool live = false;
  {
    LockGuard lk(mu_);
    auto it = entries_.find(name_owner_key(name, owner));
    // A token that is not the entry's belongs to an earlier hold of the same owner id:
    // the entry (a later hold) is not touched.
    if (it == entries_.end() || !it->second->held || it->second->token != token) {
      return ReleaseStatus::not_owner;
    }
    e = std::move(it->second);
    entries_.erase(it);
    live = store_.live(*e);
  }
  store_.forgotten(*e);
  if (!live) return ReleaseStatus::not_owner;  // its session ended, and the place with it
  switch (store_.delete_place(*e, ec)) {
    case QueueStore::Deleted::deleted: return ReleaseStatus::released;
    case QueueStore::Deleted::gone: return ReleaseStatus::not_owner;
    case QueueStore::Deleted::retry:
      // Still ours while the session lives (and it lives as long as this client): the
      // keeper deletes it once the server answers again.
      orphan(e);
      return ReleaseStatus::released;
    case QueueStore::Deleted::failed: break;
  }
  return ReleaseStatus::released;
}

void QueueRecipe::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) {
  ec.clear();
  std::vector<QueueEntryPtr> entries;
  std::vector<QueueEntry*> batch;
  std::vector<std::size_t> index;
  {
    LockGuard lk(mu_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto it = entries_.find(name_owner_key(items[i].name, items[i].owner));
      // A token that is not the entry's is an earlier hold of the same owner id: not
      // ours any more, and the entry (a later hold) is left alone.
      if (it == entries_.end() || !it->second->held || it->second->token != items[i].token ||
          !store_.live(*it->second)) {
        out[i] = RenewStatus::not_owner;
        continue;
      }
      entries.push_back(it->second);
      batch.push_back(it->second.get());
      index.push_back(i);
    }
  }
  if (batch.empty()) return;
  const Clock::time_point sent = clock_->now();
  std::vector<RenewStatus> got(batch.size(), RenewStatus::failed);
  store_.confirm(batch, got, sent, ec);
  if (ec) {
    for (const std::size_t i : index) out[i] = RenewStatus::failed;
    return;
  }
  std::vector<QueueEntryPtr> lost;
  {
    LockGuard lk(mu_);
    for (std::size_t j = 0; j < batch.size(); ++j) {
      out[index[j]] = got[j];
      auto it = entries_.find(name_owner_key(entries[j]->name, entries[j]->owner));
      const bool still = it != entries_.end() && it->second == entries[j];
      if (got[j] == RenewStatus::renewed) {
        if (still) store_.confirmed(*entries[j], sent);
      } else if (got[j] == RenewStatus::not_owner && still) {
        // Nothing to delete: the place that backed this hold is gone (a place found
        // there now belongs to someone else).
        lost.push_back(entries[j]);
        entries_.erase(it);
      }
    }
  }
  for (const auto& e : lost) store_.forgotten(*e);
}

}  // namespace distlock::detail
