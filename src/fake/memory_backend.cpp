#include "fake/memory_backend.hpp"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <thread>

namespace distlock::detail {

class MemoryBackend final : public Backend {
 public:
  MemoryBackend(std::shared_ptr<MemoryStore> store, std::shared_ptr<Clock> clock, std::string url)
      : store_(std::move(store)), clock_(std::move(clock)), url_(std::move(url)) {
    std::lock_guard lk(store_->mu_);
    store_->backends_.push_back(this);
  }
  ~MemoryBackend() override {
    {
      std::lock_guard lk(store_->mu_);
      auto& v = store_->backends_;
      v.erase(std::remove(v.begin(), v.end(), this), v.end());
    }
    // A release in another client may still be notifying us outside the store lock.
    while (notifying_.load() != 0) std::this_thread::yield();
  }

  Capabilities capabilities() const noexcept override { return {store_->fencing_, store_->needs_renewal_}; }
  std::uint64_t notification_channel_drops() const noexcept override { return store_->channel_drops_.load(); }
  void set_listener(ChangeListener* l) override { listener_.store(l, std::memory_order_release); }

  AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override {
    std::lock_guard lk(store_->mu_);
    ++store_->n_try_;
    if (store_->throw_acquires_ > 0 && store_->throw_after_-- <= 0) {
      --store_->throw_acquires_;
      throw std::runtime_error("memory://: injected exception in try_acquire");
    }
    if (store_->take_failure(ec)) return {};
    const auto now = clock_->now();
    const std::string name(req.name);
    auto it = store_->locks_.find(name);
    if (it != store_->locks_.end() && it->second.expires <= now && store_->needs_renewal_) {
      store_->locks_.erase(it);
      it = store_->locks_.end();
    }
    if (it != store_->locks_.end() && it->second.owner != req.owner) {
      AcquireResult r;
      if (store_->needs_renewal_) {
        r.holder_ttl = std::chrono::duration_cast<Millis>(it->second.expires - now);
      }
      return r;
    }
    auto& e = store_->locks_[name];
    if (e.owner != req.owner) e.token = ++store_->fences_[name];
    e.owner = std::string(req.owner);
    const long cap = store_->max_validity_ms_.load();
    const Millis validity = cap > 0 ? std::min(req.ttl, Millis(cap)) : req.ttl;
    e.expires = now + validity;
    return AcquireResult{true, e.token, validity, std::nullopt};
  }

  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) override {
    if (const long d = store_->renew_delay_ms_.load(); d > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(d));
    }
    std::lock_guard lk(store_->mu_);
    ++store_->n_renew_;
    store_->last_batch_ = items.size();
    if (store_->take_failure(ec)) return;
    const auto now = clock_->now();
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto it = store_->locks_.find(std::string(items[i].name));
      if (it == store_->locks_.end() || it->second.owner != items[i].owner || it->second.expires <= now) {
        out[i] = RenewStatus::not_owner;
        continue;
      }
      const long cap = store_->max_validity_ms_.load();
      it->second.expires = now + (cap > 0 ? std::min(items[i].ttl, Millis(cap)) : items[i].ttl);
      out[i] = RenewStatus::renewed;
    }
  }

  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t, Error& ec) override {
    std::vector<MemoryBackend*> notify;
    {
      std::lock_guard lk(store_->mu_);
      ++store_->n_release_;
      if (store_->take_failure(ec)) return ReleaseStatus::released;
      auto it = store_->locks_.find(std::string(name));
      if (it == store_->locks_.end() || it->second.owner != owner ||
          (store_->needs_renewal_ && it->second.expires <= clock_->now())) {
        return ReleaseStatus::not_owner;
      }
      store_->locks_.erase(it);
      notify = store_->backends_;
      for (auto* b : notify) b->notifying_.fetch_add(1);
    }
    for (auto* b : notify) {
      auto* listener = b->listener_.load(std::memory_order_acquire);
      if (listener && b->watching(name)) listener->on_change(name);
      b->notifying_.fetch_sub(1);
    }
    return ReleaseStatus::released;
  }

  void watch(std::string_view name, Error& ec) override {
    std::lock_guard lk(store_->mu_);
    if (store_->fail_watches_ > 0) {
      --store_->fail_watches_;
      ec = make_error_code(store_->fail_watch_code_);
      return;
    }
    if (store_->take_failure(ec)) return;
    std::lock_guard wl(watch_mu_);
    ++watched_[std::string(name)];
    ++store_->live_watches_;
  }
  void unwatch(std::string_view name) noexcept override {
    std::lock_guard lk(store_->mu_);
    std::lock_guard wl(watch_mu_);
    auto it = watched_.find(std::string(name));
    if (it == watched_.end()) return;
    --store_->live_watches_;
    if (--it->second == 0) watched_.erase(it);
  }
  void cancel_acquire(std::string_view, std::string_view) noexcept override {
    std::lock_guard lk(store_->mu_);
    ++store_->n_cancel_;
  }

  LockInfo status(std::string_view name, Error& ec) override {
    std::lock_guard lk(store_->mu_);
    if (store_->take_failure(ec)) return {};
    LockInfo info;
    auto f = store_->fences_.find(std::string(name));
    if (f != store_->fences_.end()) info.token = f->second;
    auto it = store_->locks_.find(std::string(name));
    const auto now = clock_->now();
    if (it != store_->locks_.end() && (!store_->needs_renewal_ || it->second.expires > now)) {
      info.held = true;
      info.holder = it->second.owner;
      info.ttl_remaining = std::chrono::duration_cast<Millis>(it->second.expires - now);
    }
    return info;
  }

  std::string put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) override {
    std::lock_guard lk(store_->mu_);
    if (store_->take_failure(ec)) return {};
    auto [it, inserted] = store_->records_.try_emplace(std::string(key), value);
    if (!inserted &&
        (mode == PutMode::always || (mode == PutMode::fenced && fenced_put_allowed(it->second, value)))) {
      it->second = std::string(value);
    }
    return it->second;
  }
  std::optional<std::string> get_record(std::string_view key, Error& ec) override {
    std::lock_guard lk(store_->mu_);
    if (store_->take_failure(ec)) return std::nullopt;
    auto it = store_->records_.find(std::string(key));
    if (it == store_->records_.end()) return std::nullopt;
    return it->second;
  }
  bool erase_record(std::string_view key, Error& ec) override {
    std::lock_guard lk(store_->mu_);
    if (store_->take_failure(ec)) return false;
    return store_->records_.erase(std::string(key)) > 0;
  }
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    Error& ec) override {
    truncated = false;
    std::lock_guard lk(store_->mu_);
    if (store_->take_failure(ec)) return {};
    std::vector<ListedLock> out;
    const auto now = clock_->now();
    for (auto it = store_->locks_.lower_bound(std::string(prefix));
         it != store_->locks_.end() && it->first.starts_with(prefix); ++it) {
      if (store_->needs_renewal_ && it->second.expires <= now) continue;
      if (out.size() == limit) {
        truncated = true;
        break;
      }
      ListedLock l;
      l.name = it->first;
      l.info.held = true;
      l.info.holder = it->second.owner;
      l.info.token = store_->fences_[it->first];
      if (store_->needs_renewal_) {
        l.info.ttl_remaining = std::chrono::duration_cast<Millis>(it->second.expires - now);
      }
      out.push_back(std::move(l));
    }
    return out;
  }

  std::string url() const override { return url_; }

  bool watching(std::string_view name) {
    std::lock_guard wl(watch_mu_);
    return watched_.count(std::string(name)) > 0;
  }
  std::atomic<int> notifying_{0};

 private:
  std::shared_ptr<MemoryStore> store_;
  std::shared_ptr<Clock> clock_;
  std::string url_;
  // Set by set_listener() after the constructor has made this backend visible to other
  // clients of the store, whose releases read it: atomic.
  std::atomic<ChangeListener*> listener_{nullptr};
  std::mutex watch_mu_;
  std::map<std::string, int> watched_;
};

std::shared_ptr<MemoryStore> MemoryStore::named(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<MemoryStore>> stores;
  std::lock_guard lk(mu);
  auto& w = stores[name];
  auto s = w.lock();
  if (!s) {
    s = std::make_shared<MemoryStore>();
    w = s;
  }
  return s;
}

bool MemoryStore::take_failure(Error& ec) {
  if (fail_calls_ <= 0) return false;
  --fail_calls_;
  ec = make_error_code(fail_code_);
  return true;
}

void MemoryStore::fail_next(int calls, errc code) {
  std::lock_guard lk(mu_);
  fail_calls_ = calls;
  fail_code_ = code;
}
void MemoryStore::fail_next_watches(int calls, errc code) {
  std::lock_guard lk(mu_);
  fail_watches_ = calls;
  fail_watch_code_ = code;
}
void MemoryStore::throw_next_acquires(int calls, int after) {
  std::lock_guard lk(mu_);
  throw_acquires_ = calls;
  throw_after_ = after;
}
int MemoryStore::live_watches() const {
  std::lock_guard lk(mu_);
  return live_watches_;
}
int MemoryStore::cancel_calls() const {
  std::lock_guard lk(mu_);
  return n_cancel_;
}
void MemoryStore::steal(const std::string& lock, const std::string& new_owner) {
  std::lock_guard lk(mu_);
  auto& e = locks_[lock];
  e.owner = new_owner;
  e.expires = Clock::time_point::max();
  e.token = ++fences_[lock];
}
void MemoryStore::drop(const std::string& lock) {
  std::lock_guard lk(mu_);
  locks_.erase(lock);
}
int MemoryStore::try_acquire_calls() const {
  std::lock_guard lk(mu_);
  return n_try_;
}
int MemoryStore::renew_calls() const {
  std::lock_guard lk(mu_);
  return n_renew_;
}
int MemoryStore::release_calls() const {
  std::lock_guard lk(mu_);
  return n_release_;
}
std::size_t MemoryStore::last_renew_batch() const {
  std::lock_guard lk(mu_);
  return last_batch_;
}
bool MemoryStore::held(const std::string& lock, Clock::time_point now) const {
  std::lock_guard lk(mu_);
  auto it = locks_.find(lock);
  return it != locks_.end() && (!needs_renewal_ || it->second.expires > now);
}
std::string MemoryStore::holder(const std::string& lock) const {
  std::lock_guard lk(mu_);
  auto it = locks_.find(lock);
  return it == locks_.end() ? std::string() : it->second.owner;
}

std::unique_ptr<Backend> make_memory_backend(const Url& url, const ClientOptions& opts, Error& err) {
  if (!url.hosts.empty() && url.hosts.size() != 1) {
    err.fail(errc::invalid_url, "memory:// takes one store name, e.g. memory://test");
    return nullptr;
  }
  const std::string name = url.hosts.empty() ? std::string("default") : url.hosts[0].host;
  auto clock = opts.clock ? opts.clock : system_steady_clock();
  return std::make_unique<MemoryBackend>(MemoryStore::named(name), clock, url.redacted());
}

}  // namespace distlock::detail
