// Client::watch (distlock/watch.hpp): a backend's prefix watch (Backend::watch_prefix)
// turned into an ordered event stream with gaps, re-lists and expiry checks.
//
// Per name the Impl keeps what it last reported (token, held, holder) and a change
// counter. It reports an event only if it moves that name forward: an `acquired` of a
// token above the last one (after an inferred `lost` if the previous lease never ended
// in the stream) or an end of the current lease. Anything older is stale and dropped; the
// end of a lease whose start was not reported (it fell in a gap) is dropped too. So per
// name tokens never go backwards and every `acquired` is closed before the next one.
//
// The watcher thread does the reads that need a round trip, outside the lock: the
// re-list after a gap (retried on the fallback re-check rule until it succeeds) and the
// expiry check of held names. A re-read result is applied only to names whose change
// counter did not move while it was read, so a fresh event always wins over a snapshot.
#include "distlock/watch.hpp"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "api/client_access.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "engine/lease.hpp"
#include "engine/wait_registry.hpp"

namespace distlock {

namespace {

// A held name is first checked for expiry this long after it was taken; later at its
// remaining TTL as the status read reports it (recheck_delay: 5 ms .. 5 s).
constexpr Millis kFirstCheck{1000};
// Names re-read per round of expiry checks, at most (the rest wait for the next round).
constexpr std::size_t kChecksPerRound = 64;
// Locks read by one re-list at most.
constexpr std::size_t kRelistLimit = 100000;

std::chrono::steady_clock::time_point steady_now() {
  return std::chrono::steady_clock::now();
}

}  // namespace

std::string_view to_string(WatchEventKind kind) noexcept {
  switch (kind) {
    case WatchEventKind::acquired: return "acquired";
    case WatchEventKind::released: return "released";
    case WatchEventKind::lost: return "lost";
    case WatchEventKind::revoked: return "revoked";
    case WatchEventKind::gap: return "gap";
    case WatchEventKind::state: return "state";
  }
  return "unknown";
}

struct Watch::Impl final : detail::LockEventSink {
  struct Known {
    std::uint64_t token = 0;  // last token reported
    bool held = false;
    std::string holder;
    std::optional<std::string> holder_info;
    std::uint64_t changes = 0;  // bumped on each reported change
    // The source was replaced since this name's last change (on_source_replaced): its
    // next event or listing is the new server's truth, whatever its token.
    bool restarted = false;
    // A gap came since this name's last reported change: its lease may have ended among the
    // missed events, so an end inferred before the re-list says so (not "it expired").
    bool gap_since_report = false;
    std::chrono::steady_clock::time_point check_at{};
  };

  Impl(std::shared_ptr<detail::Engine> engine, std::string prefix, WatchOptions opts)
      : engine_(std::move(engine)), prefix_(std::move(prefix)), opts_(opts) {}

  ~Impl() override { shutdown(); }

  void start() {
    detail::Error ec;
    source_ = engine_->backend().watch_prefix(prefix_, *this, ec);
    if (ec || !source_) {
      if (!ec) ec = make_error_code(errc::not_supported);
      std::string what = "watch of \"" + prefix_ + "\"";
      if (ec == make_error_code(errc::not_supported))
        throw_error(ec, what + ": backend " + engine_->backend().url() + " publishes no lock changes");
      throw_error(ec, what + ec.suffix());
    }
    {
      std::lock_guard lk(mu_);
      last_event_at_ = std::chrono::system_clock::now();
      // A backend that publishes every expiry (zk://) needs no re-reads to find them.
      if (source_->publishes_expiries()) expiry_checks_ = false;
    }
    if (opts_.initial_state) {
      // The subscription is live: a change from now on is delivered, and the listing
      // below only fills in what was held before.
      if (!relist(ec)) {
        source_.reset();
        throw_error(ec, "watch of \"" + prefix_ + "\": the first listing failed" + ec.suffix());
      }
    }
    thread_ = std::thread([this] { run(); });
  }

  void shutdown() noexcept {
    std::lock_guard once(shutdown_mu_);  // two stop() calls at once: the second waits for the first
    {
      std::lock_guard lk(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    work_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    source_.reset();  // no callback runs after this
  }

  // ---- from the backend's notification thread
  void on_event(detail::LockEvent&& ev) noexcept override {
    try {
      auto [id, desc] = detail::split_owner(ev.owner);
      if (desc && !ev.holder_info) ev.holder_info = std::string(*desc);
      ev.owner = std::string(id);
      std::lock_guard lk(mu_);
      if (stopped_) return;
      apply(ev);
    } catch (...) {  // no memory: the event is lost; say so
      note_gap("an event could not be stored (out of memory)", {});
    }
  }

  void on_gap(std::string why) noexcept override {
    try {
      std::lock_guard lk(mu_);
      if (stopped_) return;
      push_gap(std::move(why), {});
    } catch (...) {
    }
  }

  void on_names_gap(std::string why, std::vector<std::string> names) noexcept override {
    try {
      std::lock_guard lk(mu_);
      if (stopped_) return;
      push_gap(std::move(why), std::move(names));
    } catch (...) {
    }
  }

  // The backend moved to another server (a failover) that may lack changes already
  // reported: a gap, and every name's next change is taken even below its last token.
  void on_source_replaced(std::string why) noexcept override {
    try {
      std::lock_guard lk(mu_);
      if (stopped_) return;
      for (auto& [name, k] : known_) k.restarted = true;
      replacements_ += 1;
      push_gap(std::move(why), {});
    } catch (...) {
    }
  }

  // ---- consumer side
  std::optional<WatchEvent> next(std::optional<Millis> timeout) {
    std::unique_lock lk(mu_);
    auto ready = [&] { return stopped_ || !queue_.empty(); };
    if (timeout) {
      if (!cv_.wait_for(lk, *timeout, ready)) return std::nullopt;
    } else {
      cv_.wait(lk, ready);
    }
    if (queue_.empty()) return std::nullopt;  // stopped
    WatchEvent ev = std::move(queue_.front());
    queue_.pop_front();
    if (overflowed_ && room()) work_cv_.notify_all();  // the watcher reports the gap and re-lists
    return ev;
  }

  // Caller holds mu_. After an overflow: whether the consumer has emptied the queue to
  // half the bound, so the gap and the re-list can go in.
  bool room() const { return queue_.size() <= opts_.max_queued / 2; }

  // Caller holds mu_. Room for `n` more events of a change? If not, the change is
  // dropped, and so is every change until the consumer made room: then a gap and a
  // re-list (known_ keeps only what the consumer was told).
  bool reserve(std::size_t n) {
    if (overflowed_) return false;
    if (queue_.size() + n > opts_.max_queued) {
      overflowed_ = true;
      return false;
    }
    return true;
  }

  // Caller holds mu_. A change calls reserve() first; a re-list's `state` events are
  // queued whatever the bound (one per held lock).
  void push(WatchEvent ev) {
    ev.at = std::chrono::system_clock::now();
    last_event_at_ = ev.at;
    queue_.push_back(std::move(ev));
    cv_.notify_one();
  }

  // Caller holds mu_.
  void push_gap(std::string why, std::vector<std::string> names) {
    WatchEvent g;
    g.kind = WatchEventKind::gap;
    g.detail = std::move(why);
    g.gap_since = last_event_at_;
    g.gap_names = std::move(names);
    g.at = std::chrono::system_clock::now();
    // A gap is always queued (it may pass the bound by the few gaps in a row).
    queue_.push_back(std::move(g));
    for (auto& [name, k] : known_)
      if (k.held) k.gap_since_report = true;
    cv_.notify_one();
    resync_ = true;
    work_cv_.notify_all();
  }

  void note_gap(const char* why, std::vector<std::string> names) noexcept {
    try {
      std::lock_guard lk(mu_);
      push_gap(why, std::move(names));
    } catch (...) {
    }
  }

  static WatchEvent make(WatchEventKind kind, const std::string& name, std::uint64_t token, const Known& k) {
    WatchEvent e;
    e.kind = kind;
    e.name = name;
    e.token = token;
    e.holder = k.holder;
    e.holder_info = k.holder_info;
    return e;
  }

  // Caller holds mu_.
  void apply(const detail::LockEvent& ev) {
    if (overflowed_) return;  // reported as a gap, then re-listed
    auto found = known_.find(ev.name);
    const Known none;
    const Known& seen = found == known_.end() ? none : found->second;
    const bool fresh = found == known_.end() || (seen.token == 0 && !seen.held && seen.changes == 0);
    const bool acquire = ev.kind == detail::LockEvent::Kind::acquired;
    const bool current = !acquire && seen.held && ev.token == seen.token;
    if (!fresh && !current && !seen.restarted && ev.token <= seen.token) return;  // stale
    // Room for the event, and for an inferred loss of the lease before it.
    if (!reserve(seen.held && !current ? 2 : 1)) return;  // reported as a gap, then re-listed
    Known& k = found == known_.end() ? known_[ev.name] : found->second;
    if (acquire) {
      if (k.held) {
        WatchEvent lost = make(WatchEventKind::lost, ev.name, k.token, k);
        lost.inferred = true;
        const std::string by = "token " + std::to_string(ev.token);
        if (k.restarted)
          lost.detail = by +
                        " was issued by the server that replaced the one this lease was reported from: "
                        "the lease ended there or never reached it";
        else if (k.gap_since_report)
          lost.detail = by +
                        " was issued after a gap: this lease ended while events were missed "
                        "(released, lost or expired)";
        else
          lost.detail = by + " was issued with no end of this lease published: it expired";
        push(std::move(lost));
      }
      k.restarted = false;
      k.gap_since_report = false;
      k.token = ev.token;
      k.held = true;
      k.holder = ev.owner;
      k.holder_info = ev.holder_info;
      k.changes += 1;
      k.check_at = steady_now() + kFirstCheck;
      if (expiry_checks_ && k.check_at < sleep_until_) {  // the watcher thread sleeps past it: wake it
        recheck_sooner_ = true;
        work_cv_.notify_all();
      }
      WatchEvent a = make(WatchEventKind::acquired, ev.name, ev.token, k);
      a.held = true;
      push(std::move(a));
      return;
    }
    // An end: of the current lease, or of a later one whose start was not reported (it
    // began in a gap and ended before the re-list read it): that end is not reported
    // either, so every end follows its `acquired` or `state`; an older lease believed
    // held ended unseen before it.
    if (!current && k.held) {
      WatchEvent lost = make(WatchEventKind::lost, ev.name, k.token, k);
      lost.inferred = true;
      lost.detail = "a later lease (token " + std::to_string(ev.token) + ") ended: this one ended unseen" +
                    (k.gap_since_report ? std::string(" while events were missed (released, lost or expired)")
                                        : std::string(" (it expired)"));
      push(std::move(lost));
    }
    if (!current) {
      k.restarted = false;
      k.gap_since_report = false;
      k.token = ev.token;
      k.held = false;
      k.changes += 1;
      return;
    }
    WatchEventKind kind = WatchEventKind::released;
    if (ev.kind == detail::LockEvent::Kind::lost) kind = WatchEventKind::lost;
    if (ev.kind == detail::LockEvent::Kind::revoked) kind = WatchEventKind::revoked;
    WatchEvent e = make(kind, ev.name, ev.token, k);
    if (!ev.detail.empty()) {
      e.detail = ev.detail;
    } else if (kind == WatchEventKind::lost) {
      e.detail = "the holder's client declared the lease lost";
    }
    k.restarted = false;
    k.gap_since_report = false;
    k.token = ev.token;
    k.held = false;
    k.changes += 1;
    push(std::move(e));
  }

  // Reads every held lock under the prefix and reports one `state` each (and a free
  // `state` for names believed held that are not any more). False with `ec` when the
  // read failed.
  bool relist(detail::Error& ec) {
    std::map<std::string, std::uint64_t> before;
    std::uint64_t replacements = 0;
    {
      std::lock_guard lk(mu_);
      for (auto& [name, k] : known_) before[name] = k.changes;
      replacements = replacements_;
      resync_ = false;
    }
    bool truncated = false;
    std::vector<detail::ListedLock> held = engine_->list_held(prefix_, kRelistLimit, truncated, ec);
    if (ec) return false;
    std::lock_guard lk(mu_);
    if (overflowed_) return true;  // the consumer is behind: the re-list waits for room
    // The source was replaced while this listing was read: it may come from the old server,
    // whose state must neither show after the replacement's gap nor take the exception for
    // older tokens meant for the new server's state. The replacement's gap asked for another
    // re-list (resync_), which reads the new server.
    if (replacements != replacements_) return true;
    auto unchanged = [&](const std::string& name) {
      auto b = before.find(name);
      auto k = known_.find(name);
      if (k == known_.end()) return true;
      return b != before.end() && b->second == k->second.changes;
    };
    std::map<std::string, bool> listed;
    for (auto& l : held) {
      listed[l.name] = true;
      if (!unchanged(l.name)) continue;
      Known& k = known_[l.name];
      const std::uint64_t token = l.info.token.value_or(0);
      // An older token than the last reported is a stale snapshot, unless the source was
      // replaced since: then it is the new server's state (it lacks the later writes).
      if (k.changes > 0 && token != 0 && token < k.token && !k.restarted) continue;
      k.restarted = false;
      k.gap_since_report = false;
      k.token = token;
      k.held = true;
      k.holder = l.info.holder.value_or("");
      k.holder_info = l.info.holder_info;
      k.changes += 1;
      k.check_at = steady_now() + kFirstCheck;
      WatchEvent s = make(WatchEventKind::state, l.name, token, k);
      s.held = true;
      push(std::move(s));
    }
    for (auto& [name, k] : known_) {
      if (!k.held || listed.count(name) || !unchanged(name) || truncated) continue;
      k.held = false;
      k.restarted = false;
      k.gap_since_report = false;
      k.changes += 1;
      WatchEvent s = make(WatchEventKind::state, name, k.token, k);
      s.held = false;
      push(std::move(s));
    }
    return true;
  }

  // Checks the held names due for it; a name the server shows free (or held under
  // another token) after a sync barrier with no newer event is reported lost (inferred).
  void check_expiries() {
    struct Due {
      std::string name;
      std::uint64_t token;
      std::uint64_t changes;
    };
    std::vector<Due> due;
    std::uint64_t replacements = 0;
    {
      std::lock_guard lk(mu_);
      const auto now = steady_now();
      if (overflowed_) return;
      replacements = replacements_;
      for (auto& [name, k] : known_) {
        if (!k.held || k.check_at > now) continue;
        due.push_back({name, k.token, k.changes});
        if (due.size() >= kChecksPerRound) break;
      }
    }
    for (auto& d : due) {
      detail::Error ec;
      LockInfo info = engine_->status(d.name, ec);
      if (ec) {  // unreachable: look again later; a broken channel reports its own gap
        std::lock_guard lk(mu_);
        auto it = known_.find(d.name);
        if (it != known_.end()) it->second.check_at = steady_now() + kFirstCheck;
        continue;
      }
      const bool same = info.held && (!info.token || *info.token == d.token);
      if (same) {
        std::lock_guard lk(mu_);
        auto it = known_.find(d.name);
        if (it != known_.end())
          it->second.check_at = steady_now() + detail::recheck_delay(info.ttl_remaining, kFirstCheck);
        continue;
      }
      // Every change published before the status read is delivered after the barrier:
      // a release that raced the read is then reported as a release, not a loss.
      if (!source_->sync(ec)) {
        std::lock_guard lk(mu_);
        auto it = known_.find(d.name);
        if (it != known_.end()) it->second.check_at = steady_now() + kFirstCheck;
        continue;
      }
      std::lock_guard lk(mu_);
      auto it = known_.find(d.name);
      if (it == known_.end() || it->second.changes != d.changes || !it->second.held) continue;
      // The source was replaced since the read began: it may have read the old server, and
      // the barrier passed on the new one proves nothing about it. The replacement's re-list
      // reports the new server's state; the name is checked again after it.
      if (replacements != replacements_) continue;
      if (!reserve(1)) continue;
      Known& k = it->second;
      WatchEvent lost = make(WatchEventKind::lost, d.name, k.token, k);
      lost.inferred = true;
      lost.detail = info.held ? "the server shows token " + std::to_string(info.token.value_or(0)) +
                                    " with no acquire published: the lease expired"
                              : "the server shows the lock free with no release published: the lease expired";
      k.held = false;
      k.changes += 1;
      push(std::move(lost));
    }
  }

  void run() {
    std::unique_lock lk(mu_);
    while (!stopped_) {
      if (overflowed_ && room()) {
        overflowed_ = false;
        push_gap("the consumer fell behind: events were dropped at the queue bound of " +
                     std::to_string(opts_.max_queued),
                 {});
      }
      if (resync_ && !overflowed_) {
        lk.unlock();
        detail::Error ec;
        const bool ok = relist(ec);
        lk.lock();
        if (!ok) {
          resync_ = true;
          work_cv_.wait_for(lk, detail::recheck_delay(std::nullopt, kFirstCheck), [&] { return stopped_; });
        }
        continue;
      }
      if (expiry_checks_) {
        lk.unlock();
        check_expiries();
        lk.lock();
      }
      // Sleep until the next due check, a gap, a stop, or room after an overflow.
      auto wake = steady_now() + Millis(std::chrono::seconds(5));
      if (expiry_checks_)
        for (auto& [name, k] : known_)
          if (k.held && k.check_at < wake) wake = k.check_at;
      sleep_until_ = wake;
      recheck_sooner_ = false;
      work_cv_.wait_until(lk, wake, [&] {
        return stopped_ || recheck_sooner_ || (resync_ && !overflowed_) || (overflowed_ && room());
      });
      sleep_until_ = std::chrono::steady_clock::time_point::min();
    }
  }

  const std::shared_ptr<detail::Engine> engine_;
  const std::string prefix_;
  const WatchOptions opts_;
  // opts_.expiry_checks, off where the backend publishes expiries itself (start()). Under mu_.
  bool expiry_checks_ = opts_.expiry_checks;
  std::unique_ptr<detail::PrefixWatch> source_;  // set before the thread starts; reset after it ended

  std::mutex shutdown_mu_;
  std::mutex mu_;
  std::condition_variable cv_;       // consumers
  std::condition_variable work_cv_;  // the watcher thread
  std::deque<WatchEvent> queue_;
  std::map<std::string, Known> known_;
  std::chrono::system_clock::time_point last_event_at_{};
  bool overflowed_ = false;
  bool resync_ = false;
  // Bumped by each on_source_replaced: a re-list that saw it move while it read discards
  // what it read.
  std::uint64_t replacements_ = 0;
  // The watcher thread's sleep: until when (min while awake), and whether an `acquired`
  // made a name due before that (apply(): the thread wakes and sleeps again shorter).
  std::chrono::steady_clock::time_point sleep_until_ = std::chrono::steady_clock::time_point::min();
  bool recheck_sooner_ = false;
  bool stopped_ = false;
  std::thread thread_;
};

Watch::Watch() noexcept = default;
Watch::Watch(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Watch::Watch(Watch&&) noexcept = default;
Watch& Watch::operator=(Watch&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->shutdown();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
Watch::~Watch() {
  if (impl_) impl_->shutdown();
}

std::optional<WatchEvent> Watch::next(std::optional<Millis> timeout) {
  if (!impl_) return std::nullopt;
  return impl_->next(timeout);
}

void Watch::stop() noexcept {
  if (impl_) impl_->shutdown();
}

const std::string& Watch::prefix() const noexcept {
  static const std::string empty;
  return impl_ ? impl_->prefix_ : empty;
}

Watch::operator bool() const noexcept {
  return impl_ != nullptr;
}

Watch Client::watch(std::string_view prefix, const WatchOptions& opts) {
  std::string p(prefix);
  if (p.find('\0') != std::string::npos)
    throw_error(make_error_code(errc::invalid_argument), "watch prefix holds a NUL byte");
  auto impl = std::make_unique<Watch::Impl>(engine_, std::move(p), opts);
  impl->start();
  return Watch(std::move(impl));
}

Watch Client::watch(std::string_view prefix) {
  return watch(prefix, WatchOptions{});
}

}  // namespace distlock
