#include "redis/wait_queue.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>

#include "redis/lock_scripts.hpp"

namespace distlock::detail::redis {

namespace {

// Entry ids are unique in the process, not only per backend: a redis+sentinel://
// client makes a new backend after a failover, and the new master may still queue
// entries of the old one under the same client id.
std::string new_entry_id() {
  static std::atomic<std::uint64_t> next{1};
  return std::to_string(next.fetch_add(1, std::memory_order_relaxed));
}

// A queued entry lives min(ttl, kEntryLife) on the server after each refresh; it is
// refreshed four times per life (at least every 5 ms): at most every 500 ms.
std::chrono::milliseconds refresh_period(Millis ttl) {
  return std::clamp(Millis(std::min(ttl, Millis(kEntryLife)).count() / 4), Millis(5), Millis(kEntryLife / 4));
}

}  // namespace

WaitQueue::WaitQueue(std::shared_ptr<Clock> clock, Refresh refresh, Wake wake, Cancel cancel)
    : clock_(std::move(clock)),
      refresh_(std::move(refresh)),
      wake_(std::move(wake)),
      cancel_(std::move(cancel)) {}

WaitQueue::~WaitQueue() {
  {
    LockGuard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

WaitQueue::Begun WaitQueue::begin(std::string_view name, std::string_view owner, Millis ttl) {
  LockGuard lk(mu_);
  auto it = waits_.find(NameOwner(name, owner));
  if (it == waits_.end()) {
    Wait w;
    w.name = std::string(name);
    w.owner = std::string(owner);
    w.entry = new_entry_id();
    w.ttl = ttl;
    // Inserted under the caller's views, then re-keyed by views of the wait's own
    // strings: the node (and the strings in it) stays where it is, and its key compares
    // equal, so its place in the order does not change.
    it = waits_.emplace(NameOwner(name, owner), std::move(w)).first;
    auto node = waits_.extract(it);
    node.key() = NameOwner(node.mapped().name, node.mapped().owner);
    it = waits_.insert(std::move(node)).position;
    try {
      by_entry_.emplace(it->second.entry, it);
    } catch (...) {
      waits_.erase(it);
      throw;
    }
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  const Wait& w = it->second;
  return Begun{w.entry, w.queued, w.granted, w.token};
}

std::optional<WaitQueue::Wait> WaitQueue::find(std::string_view name, std::string_view owner) const {
  LockGuard lk(mu_);
  auto it = waits_.find(NameOwner(name, owner));
  if (it == waits_.end()) return std::nullopt;
  return it->second;
}

void WaitQueue::queued(std::string_view name, std::string_view owner, std::string_view entry) {
  {
    LockGuard lk(mu_);
    auto it = waits_.find(NameOwner(name, owner));
    if (it == waits_.end() || it->second.entry != entry) return;
    Wait& w = it->second;
    if (!w.queued) {
      w.queued = true;
      changed_ = true;  // the refresher learns of it: its ttl may shorten the period
      cv_.notify_all();
    }
  }
}

void WaitQueue::forget(std::string_view name, std::string_view owner, std::string_view entry) {
  LockGuard lk(mu_);
  auto it = waits_.find(NameOwner(name, owner));
  if (it == waits_.end() || it->second.entry != entry) return;
  by_entry_.erase(it->second.entry);
  waits_.erase(it);
}

void WaitQueue::abandon(Wait wait) {
  LockGuard lk(mu_);
  const TimePoint until = clock_->now() + 2 * wait.ttl;
  std::string entry = wait.entry;
  abandoned_.insert_or_assign(std::move(entry), std::make_pair(std::move(wait), until));
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  changed_ = true;
  cv_.notify_all();
}

void WaitQueue::hand_on(Wait wait, Millis retry_for) {
  LockGuard lk(mu_);
  const TimePoint until = clock_->now() + retry_for;
  std::string entry = wait.entry;
  abandoned_.insert_or_assign(std::move(entry), std::make_pair(std::move(wait), until));
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  kick_ = true;
  cv_.notify_all();
}

void WaitQueue::flush_abandoned(std::optional<std::string_view> name) {
  std::vector<Wait> todo;
  {
    LockGuard lk(mu_);
    const TimePoint now = clock_->now();
    for (auto it = abandoned_.begin(); it != abandoned_.end();) {
      if (it->second.second <= now) {
        it = abandoned_.erase(it);
      } else {
        if (!name || it->second.first.name == *name) todo.push_back(it->second.first);
        ++it;
      }
    }
  }
  for (const Wait& w : todo) {
    if (!cancel_(w)) return;  // the server is still unreachable: the rest waits too
    LockGuard lk(mu_);
    abandoned_.erase(w.entry);
  }
}

std::optional<WaitQueue::Unknown> WaitQueue::on_grant(std::string_view message) {
  // "<entry> <token> <n> <lock key of n bytes><owner>"
  auto word = [&](std::string_view& out) {
    const std::size_t sp = message.find(' ');
    if (sp == std::string_view::npos) return false;
    out = message.substr(0, sp);
    message.remove_prefix(sp + 1);
    return true;
  };
  std::string_view entry, token_text, length_text;
  if (!word(entry) || !word(token_text) || !word(length_text)) return std::nullopt;
  std::uint64_t token = 0;
  std::size_t length = 0;
  auto [p, e] = std::from_chars(token_text.data(), token_text.data() + token_text.size(), token);
  if (e != std::errc{} || p != token_text.data() + token_text.size()) return std::nullopt;
  auto [p2, e2] = std::from_chars(length_text.data(), length_text.data() + length_text.size(), length);
  if (e2 != std::errc{} || p2 != length_text.data() + length_text.size() || length > message.size()) {
    return std::nullopt;
  }
  std::string name;
  {
    LockGuard lk(mu_);
    ++grants_;
    if (abandoned_.find(entry) != abandoned_.end()) {
      kick_ = true;  // granted to a wait given up: the refresher hands it on now
      cv_.notify_all();
      return std::nullopt;
    }
    auto b = by_entry_.find(entry);
    if (b == by_entry_.end()) {
      return Unknown{std::string(entry), std::string(message.substr(0, length)),
                     std::string(message.substr(length))};
    }
    Wait& w = b->second->second;
    if (w.granted) return std::nullopt;
    w.granted = true;  // the waiter claims it from the server
    w.token = token;
    name = w.name;
  }
  wake_(name);
  return std::nullopt;
}

void WaitQueue::wake_all() {
  std::vector<std::string> names;
  {
    LockGuard lk(mu_);
    for (const auto& [key, w] : waits_) names.push_back(w.name);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (const auto& n : names) wake_(n);
}

std::size_t WaitQueue::size() const {
  LockGuard lk(mu_);
  return waits_.size();
}

std::uint64_t WaitQueue::grants_received() const {
  LockGuard lk(mu_);
  return grants_;
}

void WaitQueue::run() {
  UniqueLock lk(mu_);
  // Each entry is refreshed within its period of its last refresh: the next pass is
  // due one period (the shortest among the entries now) after the last pass, and a
  // newly queued entry with a shorter ttl brings the pass forward rather than
  // waiting out the period chosen before it came (it would expire on the server).
  TimePoint last_pass = clock_->now();
  while (!stop_) {
    changed_ = false;
    // A kick asks to retry the give-ups now; with none left (a waiting thread's
    // flush_abandoned() took them first) there is nothing to do. Left set, it would
    // make every wait below return at once: a spin holding mu_ that hung all lock
    // calls of the client (SharedConnectionFaults.WaitQueueRefresherKeepsItsLockFree...).
    if (abandoned_.empty()) kick_ = false;
    // The shortest period among the queued entries and pending cancels; none: sleep
    // until there is one.
    std::optional<Millis> period;
    for (const auto& [key, w] : waits_) {
      if (w.queued && !w.granted) period = std::min(period.value_or(Millis::max()), refresh_period(w.ttl));
    }
    for (const auto& [entry, a] : abandoned_) {
      period = std::min(period.value_or(Millis::max()), refresh_period(a.first.ttl));
    }
    if (!period) {
      while (!(stop_ || kick_ || changed_)) cv_.wait(lk.native());
      continue;
    }
    const TimePoint due = last_pass + *period;
    // The injected clock's wait may return early: loop on its reading.
    bool flagged = false;
    while (!(flagged = stop_ || kick_ || changed_) && clock_->now() < due)
      clock_->wait_until(cv_, lk.native(), due);
    if (flagged) {
      if (stop_) break;
      if (!kick_ && clock_->now() < due) continue;  // a new entry: recompute the period
    }
    if (kick_ || !abandoned_.empty()) {
      kick_ = false;
      lk.unlock();
      flush_abandoned();
      lk.lock();
    }
    std::vector<Wait> batch;
    for (const auto& [key, w] : waits_) {
      if (w.queued && !w.granted) batch.push_back(w);
    }
    const TimePoint sent = clock_->now();
    last_pass = sent;
    if (batch.empty()) continue;
    lk.unlock();
    std::vector<Answer> answers = refresh_(batch);
    std::vector<std::string> woken;
    lk.lock();
    for (std::size_t i = 0; i < batch.size() && i < answers.size(); ++i) {
      auto it = waits_.find(NameOwner(batch[i].name, batch[i].owner));
      if (it == waits_.end() || it->second.entry != batch[i].entry) continue;  // ended meanwhile
      Wait& w = it->second;
      switch (answers[i].kind) {
        case Answer::failed: break;
        case Answer::queued: break;
        case Answer::granted:
          if (!w.granted) {
            w.granted = true;
            w.token = answers[i].token;  // found by the refresh; the waiter claims it
            woken.push_back(w.name);
          }
          break;
        case Answer::gone:
          // Expired (this process was paused or cut off longer than its ttl) or
          // granted and lost: never queued again under this id; the waiter's
          // next attempt queues a new entry.
          woken.push_back(w.name);
          by_entry_.erase(w.entry);
          waits_.erase(it);
          break;
      }
    }
    lk.unlock();
    for (const auto& n : woken) wake_(n);
    lk.lock();
  }
}

}  // namespace distlock::detail::redis
