// Watching every lock under a name prefix on redis:// (Backend::watch_prefix).
//
// The lock scripts publish one message per change on the channel "<prefix>:events"
// (lock_scripts.cpp, `event`): "<kind> <token> <owner length> <owner><lock key>" (the
// owner may carry a holder description with spaces) with kind acquired,
// released or lost (the engine's forget of a lost lease). A script runs atomically and
// a server delivers a channel's messages in publish order, so per name the messages
// come in token order. A key that expires publishes nothing: the API layer finds such
// a loss by a later token or a status re-read (src/api/watch.cpp).
//
// The scripts publish only while the watcher-presence key "<prefix>:watching" exists
// (lock_scripts.cpp, `event`; nobody watching costs one EXISTS, not a PUBLISH sent on to
// every replica). Each watch registers it before it subscribes and keeps it alive: every
// kPresenceRenew it runs presence_script, which creates the key (PX kPresenceLife) if it
// is gone, or lengthens it (never shortens another watch's), and returns its generation
// (the server's TIME in microseconds at creation). A generation other than the one the
// watch saw last means the key lapsed in between (this watch stalled past the key's life,
// an eviction, a restart without persistence): the scripts may have published nothing for
// a while, and the sink gets a gap (the API layer re-lists). So a lapse is never silent;
// it is reported at most kPresenceRenew (plus a renewal's round trip) after the watch
// runs again.
//
// Each watch has its own subscriber connection. A broken connection, and its
// re-subscription, are reported to the sink as gaps; `sync` publishes a marker on the
// same channel and waits for it to come back, so every message published before it
// has been delivered.
#include <condition_variable>
#include <random>
#include <thread>

#include "engine/watch_payload.hpp"
#include "redis/key_layout.hpp"
#include "redis/redis_backend_impl.hpp"

namespace distlock::detail::redis {

namespace {

// The watcher-presence key's life, and how often a watch renews it.
constexpr Millis kPresenceLife{30000};
constexpr Millis kPresenceRenew{5000};

// KEYS watching key; ARGV life ms. Creates the key (value: the server's TIME in
// microseconds, its generation) if it is gone, else lengthens its life to at least ARGV[1];
// returns the generation.
const Script& presence_script() {
  static const Script& s = *new Script(R"lua(
local key, life = KEYS[1], ARGV[1]
local g = redis.call('GET', key)
if not g then
  local t = redis.call('TIME')
  g = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  redis.call('SET', key, g, 'PX', life)
elseif redis.call('PTTL', key) < tonumber(life) then
  redis.call('PEXPIRE', key, life)
end
return g
)lua");
  return s;
}

class RedisPrefixWatch final : public PrefixWatch {
 public:
  RedisPrefixWatch(RedisBackend& backend, const ConnectionOptions& conn, std::string key_prefix,
                   std::string name_prefix, LockEventSink& sink)
      : backend_(backend),
        timeout_(conn.connect_timeout + conn.command_timeout),
        channel_(key_prefix + ":events"),
        presence_key_(watching_key(key_prefix)),
        key_head_(key_prefix + ":{"),
        name_prefix_(std::move(name_prefix)),
        sink_(sink),
        sub_(conn, [this](std::string_view) { on_break(); }) {
    sub_.set_payload_handler(channel_,
                             [this](std::string_view, std::string_view payload) { on_payload(payload); });
  }
  ~RedisPrefixWatch() override {
    stopping_.store(true);
    {
      LockGuard lk(mu_);
      renew_stop_ = true;
    }
    cv_.notify_all();
    if (renewer_.joinable()) renewer_.join();
    sub_.unwatch(channel_);
  }

  // Registers the watch (the scripts publish from now on), then subscribes: a change
  // committed after this returns is delivered, or its loss reported as a gap.
  void start(Error& ec) {
    auto gen = register_presence(ec);
    if (ec) return;
    {
      LockGuard lk(gen_mu_);
      generation_ = std::move(*gen);
    }
    sub_.watch(channel_, ec);
    if (ec) return;
    renewer_ = std::thread([this] { renew_presence(); });
  }

  bool sync(Error& ec) override {
    std::uint64_t n = 0;
    {
      LockGuard lk(mu_);
      n = ++sync_sent_;
    }
    // The marker proves delivery only of what was published. A lapse of the presence key
    // (nothing published while it was gone) is found by its generation: a gap, and no
    // barrier, so the caller does not read the silence as "nothing happened".
    {
      Error gec;
      auto gen = register_presence(gec);
      if (gen && new_generation(std::move(*gen))) {
        ec.fail(errc::backend_unavailable, "watch of \"" + name_prefix_ + "\": the watcher-presence key " +
                                               presence_key_ + " lapsed: events may have been missed");
        return false;
      }
    }
    const std::string marker = "sync " + std::to_string(n) + " " + id_;
    if (!backend_.publish(channel_, marker, ec)) return false;
    UniqueLock lk(mu_);
    if (!cv_.wait_for(lk.native(), timeout_, [&]() DISTLOCK_REQUIRES(mu_) { return sync_seen_ >= n; })) {
      ec.fail(errc::backend_unavailable, "watch of \"" + name_prefix_ + "\": the events channel " + channel_ +
                                             " did not deliver a marker within " +
                                             std::to_string(timeout_.count()) + " ms");
      return false;
    }
    return true;
  }

 private:
  void on_break() {
    if (stopping_.load()) return;
    sink_.on_gap("the Redis events channel " + channel_ + " broke or was subscribed again");
  }

  std::optional<std::string> register_presence(Error& ec) {
    auto gen = backend_.keep_watch_presence(kPresenceLife, ec);
    if (ec)
      ec.set_detail("watch of \"" + name_prefix_ + "\": the watcher-presence key " + presence_key_ + ": " +
                    ec.detail());
    return gen;
  }

  // A generation of the presence key other than the last seen: the key lapsed in between
  // and the scripts may have published nothing. Reports the gap; true then.
  // The gap goes to the sink under gen_mu_: a sync that sees the new generation as known
  // returns after the gap is queued.
  bool new_generation(std::string gen) {
    LockGuard lk(gen_mu_);
    if (gen == generation_) return false;
    generation_ = std::move(gen);
    if (!stopping_.load())
      sink_.on_gap("the watcher-presence key " + presence_key_ +
                   " lapsed (the watch renewed it too late): the lock scripts published nothing meanwhile");
    return true;
  }

  // The renewer thread: keeps the presence key alive; a new generation is a gap.
  void renew_presence() {
    UniqueLock lk(mu_);
    while (!renew_stop_) {
      cv_.wait_for(lk.native(), kPresenceRenew, [&]() DISTLOCK_REQUIRES(mu_) { return renew_stop_; });
      if (renew_stop_) return;
      lk.unlock();
      Error ec;
      auto gen = register_presence(ec);
      if (gen) new_generation(std::move(*gen));
      // A failed renewal: the channel's own break (or the next renewal's generation) says
      // whether anything was missed.
      lk.lock();
    }
  }

  // "<kind> <token> <owner length> <owner><lock key>" or a watch's "sync <n> <id>".
  void on_payload(std::string_view p) {
    if (stopping_.load()) return;
    auto field = [&p] { return take_field(p); };
    const std::string_view kind = field();
    if (kind == "sync") {
      const std::string_view n = field();
      if (p != id_) return;  // another watch's marker
      std::uint64_t v = 0;
      std::from_chars(n.data(), n.data() + n.size(), v);
      {
        LockGuard lk(mu_);
        sync_seen_ = std::max(sync_seen_, v);
      }
      cv_.notify_all();
      return;
    }
    LockEvent ev;
    if (const auto k = lock_event_kind(kind)) {
      ev.kind = *k;
    } else {
      return;  // a kind of a newer version: not ours to guess
    }
    const std::string_view token = field();
    std::from_chars(token.data(), token.data() + token.size(), ev.token);
    const std::string_view len_text = field();
    std::size_t len = 0;
    if (std::from_chars(len_text.data(), len_text.data() + len_text.size(), len).ec != std::errc{} ||
        len > p.size())
      return;
    ev.owner = std::string(p.substr(0, len));
    p.remove_prefix(len);
    // p is the lock key "<prefix>:{<name>}".
    if (p.size() < key_head_.size() + 1 || p.substr(0, key_head_.size()) != key_head_ || p.back() != '}')
      return;
    const std::string_view name = p.substr(key_head_.size(), p.size() - key_head_.size() - 1);
    if (name.substr(0, name_prefix_.size()) != name_prefix_) return;
    ev.name = std::string(name);
    sink_.on_event(std::move(ev));
  }

  // 64 random bits: tells this watch's sync markers from those of every other watch on
  // the channel (other clients, other processes).
  static std::string random_id() {
    std::random_device rd;
    const std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    return std::to_string(v);
  }

  RedisBackend& backend_;
  const std::string id_ = random_id();
  const Millis timeout_;
  const std::string channel_;
  const std::string presence_key_;
  AnnotatedMutex gen_mu_;
  std::string generation_ DISTLOCK_GUARDED_BY(gen_mu_);  // of the presence key, as last seen
  bool renew_stop_ DISTLOCK_GUARDED_BY(mu_) = false;
  std::thread renewer_;
  const std::string key_head_;
  const std::string name_prefix_;
  LockEventSink& sink_;
  std::atomic<bool> stopping_{false};
  AnnotatedMutex mu_;
  std::condition_variable cv_;
  std::uint64_t sync_sent_ DISTLOCK_GUARDED_BY(mu_) = 0;
  std::uint64_t sync_seen_ DISTLOCK_GUARDED_BY(mu_) = 0;
  Subscriber sub_;  // last: its thread stops first
};

}  // namespace

bool RedisBackend::publish(const std::string& channel, const std::string& message, Error& ec) {
  auto conn = checkout(ec);
  if (ec) return false;
  Reply r = conn->command({"PUBLISH", channel, message}, ec);
  if (!ec && r && r->type == REDIS_REPLY_ERROR) {
    ec.fail(errc::backend_unavailable,
            conn_opts_.describe() + " refused PUBLISH " + channel + ": " + std::string(r->str, r->len));
  }
  return !ec;
}

std::optional<std::string> RedisBackend::keep_watch_presence(Millis life, Error& ec) {
  auto conn = checkout(ec);
  if (ec) return std::nullopt;
  Reply r = presence_script().run(*conn, {watching_key(prefix_)}, {std::to_string(life.count())}, ec);
  if (ec) return std::nullopt;
  if (!r || r->type != REDIS_REPLY_STRING) {
    ec.fail(
        errc::backend_unavailable,
        conn_opts_.describe() + " answered the watcher-presence script with " +
            (r && r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : std::string("no generation")));
    return std::nullopt;
  }
  return std::string(r->str, r->len);
}

std::unique_ptr<PrefixWatch> RedisBackend::watch_prefix(std::string_view prefix, LockEventSink& sink,
                                                        Error& ec) {
  auto w = std::make_unique<RedisPrefixWatch>(*this, conn_opts_, prefix_, std::string(prefix), sink);
  w->start(ec);
  if (ec) {
    ec.set_detail("cannot watch \"" + std::string(prefix) + "\": " + ec.detail());
    return nullptr;
  }
  return w;
}

}  // namespace distlock::detail::redis
