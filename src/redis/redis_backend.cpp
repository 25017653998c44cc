#include "redis/redis_backend.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <map>
#include <mutex>
#include <set>

#include "core/log.hpp"
#include "redis/connection.hpp"
#include "redis/lock_scripts.hpp"
#include "redis/records.hpp"
#include "redis/shared_connection.hpp"
#include "redis/slots.hpp"
#include "redis/subscriber.hpp"
#include "redis/wait_queue.hpp"

namespace distlock::detail {

namespace {

using redis::Connection;
using redis::ConnectionOptions;
using redis::ConnectionPool;
using redis::Reply;
using redis::Script;

// Keys renewed by one EVALSHA: large enough that 10,000 leases need 10 calls (sent
// as one pipeline), small enough that one call blocks the server only briefly.
constexpr std::size_t kRenewChunk = 1000;

// The hash field holding the lock's fencing token. Owner ids are "<hex>:<digits>",
// so no owner can be called this.
constexpr std::string_view kTokenField = "@token";

// The Redis Cluster backend's acquire script (redis:// queues its waiters, see
// redis/lock_scripts.hpp); the layout of the lock hash is the same.
// KEYS[1] lock hash, KEYS[2] fence counter; ARGV[1] owner, ARGV[2] ttl (ms).
// Returns {1, token} when acquired, {0, pttl} when the lock exists — whoever holds
// it, this owner included: an owner already in the hash is a second acquisition
// under the same id (a retried or duplicated request, a forked process), and
// handing it the held token would give two acquisitions one token. It waits like
// any other contender.
//
// The token is max(counter + 1, server TIME in microseconds), written back to the
// counter. A counter lost to a restart without AOF, an eviction or a DEL restarts
// from the clock, above every token issued before as long as the server's clock
// reads later than it did when the highest of them was issued (docs/redis.md).
// INCR comes first: a non-integer or overflowing counter fails before anything is
// written. Tokens leave the script as the counter's decimal string, exact over
// the whole int64 range (Lua numbers are doubles).
const Script& acquire_script() {
  static const Script s(R"lua(
local lock, fence, owner, ttl = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
if redis.call('EXISTS', lock) == 1 then
  return {0, redis.call('PTTL', lock)}
end
if redis.replicate_commands then redis.replicate_commands() end
local counted = redis.call('INCR', fence)
local t = redis.call('TIME')
local usec = t[2]
local now = t[1] .. string.rep('0', 6 - #usec) .. usec
if counted < tonumber(now) then
  redis.call('SET', fence, now)
end
local token = redis.call('GET', fence)
redis.call('HSET', lock, owner, 1, '@token', token)
redis.call('PEXPIRE', lock, ttl)
return {1, token}
)lua");
  return s;
}

// KEYS[i] lock hashes; ARGV[2i-1] owner, ARGV[2i] ttl (ms) of KEYS[i].
// Returns one status per key: 1 renewed, 0 not held by that owner any more.
const Script& renew_script() {
  static const Script s(R"lua(
local out = {}
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[2 * i - 1]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
)lua");
  return s;
}

bool to_u64(const redisReply* r, std::uint64_t& out) {
  if (r == nullptr) return false;
  if (r->type == REDIS_REPLY_INTEGER) {
    if (r->integer < 0) return false;
    out = static_cast<std::uint64_t>(r->integer);
    return true;
  }
  const std::string_view s = redis::reply_str(r);
  if (r->type != REDIS_REPLY_STRING || s.empty()) return false;
  auto [p, e] = std::from_chars(s.data(), s.data() + s.size(), out);
  return e == std::errc{} && p == s.data() + s.size();
}

bool prefix_ok(std::string_view prefix) {
  return redis_prefix_ok(prefix);
}

class RedisBackend final : public Backend {
 public:
  RedisBackend(const ConnectionOptions& conn, std::string prefix, std::string url, const ClientOptions& opts,
               int wait_replicas = 0, Millis wait_timeout = Millis(0))
      : conn_opts_(conn),
        prefix_(std::move(prefix)),
        url_(std::move(url)),
        wait_replicas_(wait_replicas),
        wait_timeout_(wait_timeout),
        log_(opts.logger),
        pool_(conn, 8),
        shared_(wait_replicas == 0 ? std::make_unique<redis::SharedConnection>(conn) : nullptr),
        waits_([this](const std::vector<redis::WaitQueue::Wait>& w) { return refresh_waits(w); },
               [this](std::string_view name) { wake(name); },
               [this](const redis::WaitQueue::Wait& w) { return cancel_wait(w); }),
        subscriber_(conn, [this](std::string_view channel) { on_channel(channel); }) {}

  // The subscriber (declared last) stops its thread first, then the wait queue's
  // refresher; both call into this object.
  ~RedisBackend() override = default;

  Capabilities capabilities() const noexcept override { return {true, true}; }
  void set_listener(ChangeListener* listener) override { listener_.store(listener); }

  // Connects once so a bad password or a down server fails at connect(), and
  // checks the server's persistence and eviction settings (one warning per client).
  std::error_code connect_now(std::string& why) {
    std::error_code ec;
    auto conn = pool_.checkout(ec);
    if (ec) {
      why = pool_.last_error();
      return ec;
    }
    check_config(*conn);
    return {};
  }

  AcquireResult try_acquire(const AcquireRequest& req, std::error_code& ec) override {
    ec.clear();
    if (req.keep_queued) return acquire_queued(req, ec);
    auto conn = lock_link(ec);
    if (ec) return {};
    const Keys k = keys_of(req.name);
    const std::string ttl = std::to_string(req.ttl.count());
    Reply r = redis::queue_acquire_script().run(*conn, {k.lock, k.queue, k.expiries, k.fence},
                                                {req.owner, ttl, "0", "0", grant_prefix_}, ec);
    return acquire_answer(*conn, req, r, ec).result;
  }

  // A wait that keeps its place in the name's queue. A grant that arrived on this
  // client's channel is answered here without a round trip: the lease counts from
  // the last call the server answered while the entry was queued (WaitQueue), which
  // is earlier than the grant. With wait=N the grant was never acknowledged by
  // replicas, so it is claimed from the server (and WAITed for) instead.
  AcquireResult acquire_queued(const AcquireRequest& req, std::error_code& ec) {
    subscribe_grants(req.owner);
    waits_.flush_abandoned();  // entries left behind by an outage go first
    const std::string ttl = std::to_string(req.ttl.count());
    for (int attempt = 0; attempt < 2; ++attempt) {
      const redis::WaitQueue::Wait w = waits_.begin(req.name, req.owner, req.ttl);
      if (w.granted && wait_replicas_ == 0) {
        const auto left =
            std::chrono::duration_cast<Millis>(w.valid_from + w.ttl - std::chrono::steady_clock::now());
        if (left >= w.ttl / 2) {
          hold_entry(req.name, req.owner, w.entry);  // before forget: see on_grant_message
          waits_.forget(req.name, req.owner, w.entry);
          AcquireResult res;
          res.acquired = true;
          res.token = w.token;
          res.validity = left;
          return res;
        }
        // Too little of it left to use: the server restarts its ttl below.
      }
      auto conn = lock_link(ec);
      if (ec) return {};
      const Keys k = keys_of(req.name);
      const auto sent = std::chrono::steady_clock::now();
      Reply r = redis::queue_acquire_script().run(
          *conn, {k.lock, k.queue, k.expiries, k.fence},
          {req.owner, ttl, w.entry, w.queued ? "2" : "1", grant_prefix_}, ec);
      const Answer a = acquire_answer(*conn, req, r, ec);
      if (ec) return {};
      if (a.gone) {
        waits_.forget(req.name, req.owner, w.entry);  // the next attempt queues a new entry
        continue;
      }
      if (a.result.acquired) {
        hold_entry(req.name, req.owner, w.entry);
        waits_.forget(req.name, req.owner, w.entry);
      } else {
        waits_.queued(req.name, req.owner, w.entry, sent);
      }
      return a.result;
    }
    return {};
  }

  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override {
    try {
      const auto w = waits_.find(name, owner);
      if (!w) return;
      waits_.forget(name, owner, w->entry);
      if (!cancel_wait(*w)) waits_.abandon(*w);
    } catch (...) {  // out of memory: the entry expires after its ttl
    }
  }

  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) override {
    ec.clear();
    std::fill(out.begin(), out.end(), RenewStatus::failed);
    if (items.empty()) return;
    auto conn = lock_link(ec);
    if (ec) return;
    // Keys and arguments live here; the calls hold views into them.
    std::vector<std::string> keys, ttls;
    keys.reserve(items.size());
    ttls.reserve(items.size());
    for (const auto& it : items) {
      keys.push_back(lock_key(it.name));
      ttls.push_back(std::to_string(it.ttl.count()));
    }
    std::vector<std::string_view> key_views(keys.begin(), keys.end());
    std::vector<std::string_view> arg_views;
    arg_views.reserve(2 * items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      arg_views.push_back(items[i].owner);
      arg_views.push_back(ttls[i]);
    }
    std::vector<Script::Call> calls;
    for (std::size_t at = 0; at < items.size(); at += kRenewChunk) {
      const std::size_t n = std::min(kRenewChunk, items.size() - at);
      calls.push_back({std::span(key_views).subspan(at, n), std::span(arg_views).subspan(2 * at, 2 * n)});
    }
    std::vector<Reply> replies = renew_script().run_pipelined(*conn, calls, ec);
    if (ec) {
      failed(*conn, "renew");
      return;
    }
    ok();
    // With wait=N a renewal that fewer than N replicas acknowledged counts as failed
    // (retried until the local deadline): a failover could lose its extension.
    const bool unreplicated = wait_replicas_ > 0 && !replicated(*conn, "renewal");
    for (std::size_t c = 0; c < calls.size(); ++c) {
      const redisReply* r = replies[c].get();
      const std::size_t at = c * kRenewChunk;
      if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements != calls[c].keys.size()) {
        log_.log(LogLevel::warning, "{}: renew script answered {}", conn_opts_.describe(),
                 r && r->type == REDIS_REPLY_ERROR ? redis::reply_str(r)
                                                   : std::string_view("an unexpected reply"));
        // READONLY (a demoted master), LOADING, MASTERDOWN...: the call fails with
        // backend_unavailable, so a layer that finds the master (redis+sentinel://)
        // looks for the new one now. No item of this call counts as renewed.
        if (redis::error_code_of(r) == errc::backend_unavailable) {
          ec = make_error_code(errc::backend_unavailable);
          std::fill(out.begin(), out.end(), RenewStatus::failed);
          return;
        }
        continue;  // those items stay `failed`: retried until their local deadline
      }
      for (std::size_t i = 0; i < r->elements; ++i) {
        const redisReply* e = r->element[i];
        out[at + i] = e->type == REDIS_REPLY_INTEGER && e->integer == 1
                          ? (unreplicated ? RenewStatus::failed : RenewStatus::renewed)
                          : RenewStatus::not_owner;
        // A lost lease is never released through here: forget its queue entry now.
        if (out[at + i] == RenewStatus::not_owner) unhold_entry(items[at + i].name, items[at + i].owner);
      }
    }
  }

  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                        std::error_code& ec) override {
    ec.clear();
    // Forgotten only once the release script ran: a late grant message for the
    // entry arriving before that would otherwise hand on the lock under us.
    struct Unhold {
      RedisBackend* self;
      std::string_view name, owner;
      ~Unhold() { self->unhold_entry(name, owner); }
    } unhold{this, name, owner};
    auto conn = lock_link(ec);
    if (ec) return ReleaseStatus::released;
    const Keys k = keys_of(name);
    Reply r = redis::queue_release_script().run(*conn, {k.lock, k.queue, k.expiries, k.fence},
                                                {owner, k.released, grant_prefix_}, ec);
    if (ec) {
      failed(*conn, "release");
      return ReleaseStatus::released;
    }
    ok();
    if (r->type != REDIS_REPLY_INTEGER) {
      ec = r->type == REDIS_REPLY_ERROR ? redis::error_code_of(r.get())
                                        : make_error_code(errc::protocol_error);
      return ReleaseStatus::released;
    }
    return r->integer < 0 ? ReleaseStatus::not_owner : ReleaseStatus::released;
  }

  // A failed watch leaves nothing counted or subscribed (the subscriber undoes it)
  // and hands the cause to the caller's error.
  void watch(std::string_view name, std::error_code& ec) override {
    std::string why;
    subscriber_.watch(lock_key(name) + ":released", ec, why);
    if (ec) {
      log_.log(LogLevel::warning, "cannot wait for a release of \"{}\": {}", name, why);
      set_error_detail("cannot wait for a release of \"" + std::string(name) + "\": " + why);
    }
  }

  void unwatch(std::string_view name) noexcept override {
    try {
      subscriber_.unwatch(lock_key(name) + ":released");
    } catch (...) {  // out of memory building the channel name: the watch stays, harmless
    }
  }

  LockInfo status(std::string_view name, std::error_code& ec) override {
    ec.clear();
    auto conn = checkout(ec);
    if (ec) return {};
    const std::string n(name);
    std::string why;
    std::vector<LockInfo> infos = statuses(*conn, std::span(&n, 1), ec, why);
    if (ec) {
      if (!conn->connected()) failed(*conn, "status");
      log_.log(LogLevel::warning, "{}: status of \"{}\": {}", conn_opts_.describe(), name, why);
      return {};
    }
    ok();
    return infos.front();
  }

  // Records are plain strings `<prefix>:{<key>}:record` without expiry (see lock_key()).
  std::string put_record(std::string_view key, std::string_view value, PutMode mode,
                         std::error_code& ec) override {
    ec.clear();
    if (!record_value_fits(key, value, ec)) return {};
    auto conn = checkout_detailed(ec);
    if (ec) return {};
    const std::string k = record_key(key);
    Reply r = mode == PutMode::always ? conn->command({"SET", k, value}, ec)
                                      : redis::put_if_absent_script().run(*conn, {k}, {value}, ec);
    if (!answered(*conn, r, "put record", ec)) return {};
    if (!replicated_record(*conn, key, ec)) return {};
    if (mode == PutMode::always) return std::string(value);
    if (r->type != REDIS_REPLY_STRING) return unexpected("put record", ec), std::string();
    return std::string(redis::reply_str(r.get()));
  }

  std::optional<std::string> get_record(std::string_view key, std::error_code& ec) override {
    ec.clear();
    auto conn = checkout_detailed(ec);
    if (ec) return std::nullopt;
    Reply r = conn->command({"GET", record_key(key)}, ec);
    if (!answered(*conn, r, "get record", ec)) return std::nullopt;
    if (r->type == REDIS_REPLY_NIL) return std::nullopt;
    if (r->type != REDIS_REPLY_STRING) return unexpected("get record", ec), std::nullopt;
    return std::string(redis::reply_str(r.get()));
  }

  bool erase_record(std::string_view key, std::error_code& ec) override {
    ec.clear();
    auto conn = checkout_detailed(ec);
    if (ec) return false;
    Reply r = conn->command({"DEL", record_key(key)}, ec);
    if (!answered(*conn, r, "erase record", ec)) return false;
    if (!replicated_record(*conn, key, ec)) return false;
    if (r->type != REDIS_REPLY_INTEGER) return unexpected("erase record", ec), false;
    return r->integer > 0;
  }

  // SCAN MATCH `<prefix>:{<escaped prefix>*}` (only lock hashes end in '}'), then the
  // status of the candidates in name order, kListChunk per pipeline.
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                    std::error_code& ec) override {
    ec.clear();
    truncated = false;
    auto conn = checkout_detailed(ec);
    if (ec) return {};
    const std::string head = prefix_ + ":{";
    std::set<std::string> names;
    std::string why;
    redis::scan_keys(
        *conn, redis::glob_escape(head) + redis::glob_escape(prefix) + "*}",
        [&](std::string_view key) {
          if (key.size() < head.size() + 2 || key.substr(0, head.size()) != head || key.back() != '}') return;
          const std::string_view name = key.substr(head.size(), key.size() - head.size() - 1);
          if (name.substr(0, prefix.size()) == prefix) names.emplace(name);
        },
        ec, why);
    if (ec) return listing_failed(*conn, why, ec), std::vector<ListedLock>{};
    auto status_of = [&](std::span<const std::string> chunk, std::vector<LockInfo>& infos,
                         std::error_code& e) {
      std::vector<LockInfo> got = statuses(*conn, chunk, e, why);
      if (e) return listing_failed(*conn, conn_opts_.describe() + ": " + why, e);
      infos.insert(infos.end(), got.begin(), got.end());
    };
    auto out = redis::held_in_order(names, limit, truncated, status_of, ec);
    if (!ec) ok();
    return out;
  }

  std::string url() const override { return url_; }

  RedisStats stats() const {
    RedisStats st;
    st.grants_received = waits_.grants_received();
    st.release_messages = release_messages_.load();
    st.queued_waits = waits_.size();
    return st;
  }

 private:
  struct Keys {
    std::string lock, queue, expiries, fence, released;
  };
  Keys keys_of(std::string_view name) const {
    Keys k;
    k.lock = lock_key(name);
    k.queue = k.lock + ":q";
    k.expiries = k.lock + ":qx";
    k.fence = fence_key(k.lock);
    k.released = k.lock + ":released";
    return k;
  }

  struct Answer {
    AcquireResult result;
    bool gone = false;  // the re-checked entry is no longer queued
  };

  // The acquire script's reply: {1, token} | {0, pttl} | {2}.
  Answer acquire_answer(redis::Link& conn, const AcquireRequest& req, const Reply& r, std::error_code& ec) {
    Answer a;
    if (ec) {
      failed(conn, "acquire");
      return a;
    }
    std::uint64_t flag = 0;
    if (r->type == REDIS_REPLY_ERROR) {
      ec = redis::error_code_of(r.get());
      log_.log(LogLevel::warning, "{}: acquire script: {}", conn_opts_.describe(), redis::reply_str(r.get()));
      set_error_detail(conn_opts_.describe() + ": acquire: " + std::string(redis::reply_str(r.get())));
      return a;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || !to_u64(r->element[0], flag) || flag > 2 ||
        (flag != 2 && r->elements != 2)) {
      ec = make_error_code(errc::protocol_error);
      log_.log(LogLevel::warning, "{}: unexpected reply to the acquire script", conn_opts_.describe());
      return a;
    }
    ok();
    if (flag == 2) {
      a.gone = true;
      return a;
    }
    if (flag == 1) {
      if (!to_u64(r->element[1], a.result.token)) {
        ec = make_error_code(errc::protocol_error);
        return a;
      }
      a.result.acquired = true;
      a.result.validity = req.ttl;
      if (wait_replicas_ > 0 && !replicated_acquire(conn, req, ec)) a.result = {};
      return a;
    }
    const redisReply* pttl = r->element[1];
    if (pttl->type == REDIS_REPLY_INTEGER && pttl->integer > 0) a.result.holder_ttl = Millis(pttl->integer);
    return a;
  }

  // The grant channel of this client, subscribed once before its first queued wait
  // (so no grant to it can be missed). A failure leaves waits degraded, not
  // broken: the engine's re-checks find a grant (the script answers "acquired").
  void subscribe_grants(std::string_view owner) {
    std::lock_guard lk(grants_mu_);
    if (grants_subscribed_) return;
    const std::string channel = grant_prefix_ + std::string(owner.substr(0, owner.find(':')));
    subscriber_.set_payload_handler(
        channel, [this](std::string_view, std::string_view payload) { on_grant_message(payload); });
    std::error_code ec;
    std::string why;
    subscriber_.watch(channel, ec, why);
    if (ec) {
      log_.log(LogLevel::warning, "cannot listen for hand-offs ({}); waits find them by re-checks", why);
      return;
    }
    grant_channel_ = channel;
    grants_subscribed_ = true;
  }

  // The wait queue's batched refresh: KEYS/ARGV 3 per entry, kRenewChunk / 3 entries
  // per call, all calls in one pipeline.
  std::vector<redis::WaitQueue::Answer> refresh_waits(const std::vector<redis::WaitQueue::Wait>& waits) {
    using A = redis::WaitQueue::Answer;
    std::vector<A> out(waits.size());
    std::error_code ec;
    auto conn = lock_link(ec);
    if (ec) return out;
    std::vector<std::string> keys, ttls;
    keys.reserve(3 * waits.size());
    ttls.reserve(waits.size());
    for (const auto& w : waits) {
      Keys k = keys_of(w.name);
      keys.push_back(std::move(k.lock));
      keys.push_back(std::move(k.queue));
      keys.push_back(std::move(k.expiries));
      ttls.push_back(std::to_string(w.ttl.count()));
    }
    std::vector<std::string_view> key_views(keys.begin(), keys.end()), arg_views;
    arg_views.reserve(3 * waits.size());
    for (std::size_t i = 0; i < waits.size(); ++i) {
      arg_views.push_back(waits[i].owner);
      arg_views.push_back(waits[i].entry);
      arg_views.push_back(ttls[i]);
    }
    constexpr std::size_t kChunk = kRenewChunk / 3;
    std::vector<redis::Script::Call> calls;
    for (std::size_t at = 0; at < waits.size(); at += kChunk) {
      const std::size_t n = std::min(kChunk, waits.size() - at);
      calls.push_back(
          {std::span(key_views).subspan(3 * at, 3 * n), std::span(arg_views).subspan(3 * at, 3 * n)});
    }
    std::vector<Reply> replies = redis::queue_refresh_script().run_pipelined(*conn, calls, ec);
    if (ec) {
      failed(*conn, "refresh of queued waits");
      return out;
    }
    for (std::size_t c = 0; c < calls.size(); ++c) {
      const redisReply* r = replies[c].get();
      const std::size_t at = c * kChunk;
      if (r == nullptr || r->type != REDIS_REPLY_ARRAY || 3 * r->elements != calls[c].keys.size()) continue;
      for (std::size_t i = 0; i < r->elements; ++i) {
        const redisReply* e = r->element[i];
        if (e->type == REDIS_REPLY_INTEGER) {
          out[at + i].kind = e->integer == 0 ? A::queued : e->integer == 2 ? A::gone : A::failed;
        } else if (to_u64(e, out[at + i].token)) {
          out[at + i].kind = A::granted;
        }
      }
    }
    return out;
  }

  // Removes a wait's entry from the server's queue, or hands the lock on if it was
  // granted to it. False when the server could not be reached.
  bool cancel_wait(const redis::WaitQueue::Wait& w) {
    std::error_code ec;
    auto conn = lock_link(ec);
    if (ec) return false;
    const Keys k = keys_of(w.name);
    Reply r = redis::queue_cancel_script().run(*conn, {k.lock, k.queue, k.expiries, k.fence},
                                               {w.owner, w.entry, k.released, grant_prefix_}, ec);
    if (ec) {
      failed(*conn, "give up a wait");
      return false;
    }
    return !redis::is_error(r.get());
  }

  // A grant to an entry this client neither waits with nor holds under: a wait given
  // up while the server was out of reach, or queued through a backend that a
  // Sentinel failover replaced (the new master still had the entry). Nobody here
  // will take it, so it is handed on at once rather than left to its ttl. The
  // cancel script acts only while the lock is held under exactly that entry (ids
  // are unique in the process), and an entry this client took is in held_entries_
  // from before it leaves the wait queue until its release.
  void on_grant_message(std::string_view payload) {
    auto unknown = waits_.on_grant(payload);
    if (!unknown) return;
    const std::string head = prefix_ + ":{";
    const std::string& lock = unknown->lock;
    if (lock.size() < head.size() + 1 || lock.compare(0, head.size(), head) != 0 || lock.back() != '}')
      return;
    {
      std::lock_guard lk(held_mu_);
      for (const auto& [key, entry] : held_entries_) {
        if (entry == unknown->entry) return;
      }
    }
    redis::WaitQueue::Wait w;
    w.name = lock.substr(head.size(), lock.size() - head.size() - 1);
    w.owner = std::move(unknown->owner);
    w.entry = std::move(unknown->entry);
    w.ttl = Millis(3000);  // the retry period's basis (1 s); the grant's own ttl is not known here
    waits_.hand_on(std::move(w), Millis(60000));
  }

  void hold_entry(std::string_view name, std::string_view owner, const std::string& entry) {
    std::lock_guard lk(held_mu_);
    held_entries_[{std::string(name), std::string(owner)}] = entry;
  }
  void unhold_entry(std::string_view name, std::string_view owner) noexcept {
    try {
      std::lock_guard lk(held_mu_);
      held_entries_.erase({std::string(name), std::string(owner)});
    } catch (...) {  // out of memory building the key: the entry stays listed, harmless
    }
  }

  void wake(std::string_view name) {
    ChangeListener* l = listener_.load();
    if (l) l->on_change(name);
  }

  // Status of each name (one script call each, one pipeline): holder, ttl, the
  // holder's token, and the live queued waiters. A free lock has no token to show:
  // its counter is its slot's, shared with other names.
  std::vector<LockInfo> statuses(Connection& conn, std::span<const std::string> names, std::error_code& ec,
                                 std::string& why) {
    std::vector<Keys> ks;
    ks.reserve(names.size());
    for (const auto& n : names) ks.push_back(keys_of(n));
    std::vector<std::array<std::string_view, 2>> key_views(names.size());
    for (std::size_t i = 0; i < names.size(); ++i) key_views[i] = {ks[i].lock, ks[i].expiries};
    std::vector<redis::Script::Call> calls;
    for (auto& kv : key_views) calls.push_back({std::span<const std::string_view>(kv), {}});
    std::vector<Reply> replies = redis::queue_status_script().run_pipelined(conn, calls, ec);
    if (ec) {
      why = conn.last_error();
      return {};
    }
    std::vector<LockInfo> out;
    for (const auto& one : replies) {
      const redisReply* r = one.get();
      if (r == nullptr || redis::is_error(r)) {
        ec = r ? redis::error_code_of(r) : make_error_code(errc::protocol_error);
        why = r ? std::string(redis::reply_str(r)) : std::string("no reply");
        return {};
      }
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 || r->element[0]->type != REDIS_REPLY_ARRAY) {
        ec = make_error_code(errc::protocol_error);
        why = "unexpected reply to the status script";
        return {};
      }
      LockInfo info;
      const redisReply* hash = r->element[0];
      std::uint64_t token = 0;
      for (std::size_t i = 0; i + 1 < hash->elements; i += 2) {
        const std::string_view field = redis::reply_str(hash->element[i]);
        if (field == kTokenField) {
          if (to_u64(hash->element[i + 1], token)) info.token = token;
          continue;
        }
        info.held = true;
        info.holder = std::string(field);
      }
      if (info.held && r->element[1]->type == REDIS_REPLY_INTEGER && r->element[1]->integer >= 0) {
        info.ttl_remaining = Millis(r->element[1]->integer);
      }
      if (r->element[2]->type == REDIS_REPLY_INTEGER) {
        info.waiters = static_cast<std::uint64_t>(std::max<long long>(0, r->element[2]->integer));
      }
      out.push_back(std::move(info));
    }
    return out;
  }

  // "<prefix>:fence:{<tag>}": one counter per hash slot, in the slot of the lock
  // (docs/redis.md "Tokens"): locking any number of names leaves at most 16,384
  // counters, and the acquire script's keys stay in one slot.
  std::string fence_key(std::string_view lock) const {
    return prefix_ + ":fence:{" + redis::slot_tag(redis::key_slot(lock)) + "}";
  }

  std::string lock_key(std::string_view name) const {
    std::string k;
    k.reserve(prefix_.size() + name.size() + 4);
    k.append(prefix_).append(":{").append(name).append("}");
    return k;
  }

  // "<prefix>:{<key>}:record": a lock key ends in '}', its counter in ":fence", so no
  // record shares a key with a lock of any name.
  std::string record_key(std::string_view key) const { return lock_key(key) + ":record"; }

  // After a record command: false with ec (and an error detail naming the server)
  // when the transport failed or the server answered with an error.
  bool answered(const Connection& conn, const Reply& r, const char* what, std::error_code& ec) {
    if (!ec) {
      ok();
      return true;
    }
    const std::string why =
        r ? conn_opts_.describe() + ": " + what + ": " + std::string(redis::reply_str(r.get()))
          : std::string(what) + ": " + conn.last_error();
    if (r) {
      log_.log(LogLevel::warning, "{}", why);
    } else {
      report(why);
    }
    set_error_detail(why);
    return false;
  }

  // With wait=N a record write that fewer than N replicas acknowledged fails with
  // quorum_unavailable (backend_unavailable when WAIT itself failed): it is on the
  // master, and a failover before it reaches a replica may lose it.
  bool replicated_record(Connection& conn, std::string_view key, std::error_code& ec) {
    if (wait_replicas_ <= 0) return true;
    long long acked = -1;
    if (replicated(conn, "record write", &acked)) return true;
    ec = make_error_code(acked < 0 ? errc::backend_unavailable : errc::quorum_unavailable);
    set_error_detail(conn_opts_.describe() + ": record \"" + std::string(key.substr(0, 200)) +
                     "\" was written on the master but " +
                     (acked < 0
                          ? std::string("WAIT failed")
                          : "only " + std::to_string(acked) + " of " + std::to_string(wait_replicas_) +
                                " replicas acknowledged it within " + std::to_string(wait_timeout_.count()) +
                                " ms (wait=" + std::to_string(wait_replicas_) + ")") +
                     "; a failover may lose it");
    return false;
  }

  void unexpected(const char* what, std::error_code& ec) {
    ec = make_error_code(errc::protocol_error);
    set_error_detail(conn_opts_.describe() + ": unexpected reply to " + what);
  }

  void listing_failed(const Connection& conn, const std::string& why, std::error_code& ec) {
    if (!conn.connected()) report("list: " + why);
    set_error_detail("list: " + why);
    if (!ec) ec = make_error_code(errc::protocol_error);
  }

  // "<prefix>:{<name>}:released" → name.
  void on_channel(std::string_view channel) {
    if (channel.substr(0, grant_prefix_.size()) == grant_prefix_) {
      waits_.wake_all();  // the subscription broke or came back: grants may have been missed
      return;
    }
    constexpr std::string_view kTail = "}:released";
    release_messages_.fetch_add(1, std::memory_order_relaxed);
    const std::size_t head = prefix_.size() + 2;
    if (channel.size() < head + kTail.size()) return;
    ChangeListener* l = listener_.load();
    if (l) l->on_change(channel.substr(head, channel.size() - head - kTail.size()));
  }

  // CONFIG GET appendonly / maxmemory / maxmemory-policy. A server that loses
  // writes on a restart or evicts keys breaks guarantees the scripts alone cannot
  // keep; say so once, with the consequence. CONFIG may be renamed or denied by
  // an ACL (managed services do): then only a debug line, never a failure.
  void check_config(Connection& conn) {
    conn.append({"CONFIG", "GET", "appendonly"});
    conn.append({"CONFIG", "GET", "maxmemory"});
    conn.append({"CONFIG", "GET", "maxmemory-policy"});
    std::error_code ec;
    std::vector<Reply> r = conn.read_replies(3, ec);
    auto value = [&](std::size_t i) -> std::string_view {
      const redisReply* x = r[i].get();
      if (x == nullptr || x->type != REDIS_REPLY_ARRAY || x->elements != 2) return {};
      return redis::reply_str(x->element[1]);
    };
    if (!ec) {
      for (const auto& one : r) {
        if (!redis::is_error(one.get())) continue;
        log_.log(LogLevel::debug,
                 "{}: CONFIG GET is not available ({}): appendonly and maxmemory-policy not checked",
                 conn_opts_.describe(), redis::reply_str(one.get()));
        return;
      }
    }
    if (ec || value(0).empty() || value(2).empty()) {
      log_.log(LogLevel::debug,
               "{}: CONFIG GET gave no answer ({}): appendonly and maxmemory-policy not checked",
               conn_opts_.describe(), ec ? conn.last_error() : std::string("unexpected reply"));
      return;
    }
    if (value(0) != "yes") {
      log_.log(LogLevel::warning,
               "{} runs with appendonly no: a restart loses (or restores stale) locks, so a second client "
               "can acquire a lock whose holder has not noticed yet; fencing tokens then continue from the "
               "server clock and stay increasing only if that clock did not step back (docs/redis.md)",
               conn_opts_.describe());
    }
    const std::string_view policy = value(2);
    if (policy != "noeviction" && value(1) != "0") {
      const bool all = policy.substr(0, 7) == "allkeys";
      log_.log(LogLevel::warning,
               "{} runs with maxmemory {} and maxmemory-policy {}: under memory pressure it may evict held "
               "locks{} (a second client then acquires while the holder has not noticed yet); use "
               "noeviction (docs/redis.md)",
               conn_opts_.describe(), value(1), policy,
               all ? " and fence counters (tokens then continue from the server clock)" : "");
    }
  }

  // WAIT wait_replicas_ wait_timeout_ after a write on `conn`. False (with a warning
  // naming the count) when fewer replicas acknowledged it or WAIT failed.
  bool replicated(redis::Link& conn, const char* what, long long* acked_out = nullptr) {
    const std::string n = std::to_string(wait_replicas_);
    const std::string ms = std::to_string(wait_timeout_.count());
    std::error_code ec;
    Reply r = conn.command({"WAIT", n, ms}, ec);
    long long acked = -1;
    if (!ec && r && r->type == REDIS_REPLY_INTEGER) acked = r->integer;
    if (acked_out) *acked_out = acked;
    if (acked >= wait_replicas_) return true;
    if (acked < 0) {
      log_.log(LogLevel::warning, "{}: WAIT after the {} failed: {}", conn_opts_.describe(), what,
               ec ? conn.last_error() : std::string("unexpected reply"));
    } else {
      log_.log(LogLevel::warning, "{}: only {} of {} replicas acknowledged the {} within {} ms (wait={})",
               conn_opts_.describe(), acked, wait_replicas_, what, wait_timeout_.count(), wait_replicas_);
    }
    return false;
  }

  // An acquisition fewer than wait_replicas_ replicas acknowledged is not reported:
  // it is released again (on this connection if it still works, else on another)
  // and the call fails with quorum_unavailable (backend_unavailable when WAIT itself
  // failed), so a failover right after it cannot leave a holder whose lock the new
  // master never saw.
  bool replicated_acquire(redis::Link& conn, const AcquireRequest& req, std::error_code& ec) {
    long long acked = -1;
    if (replicated(conn, "acquisition", &acked)) return true;
    const Keys k = keys_of(req.name);
    auto release_on = [&](redis::Link& c, std::error_code& e) {
      redis::queue_release_script().run(c, {k.lock, k.queue, k.expiries, k.fence},
                                        {req.owner, k.released, grant_prefix_}, e);
    };
    std::error_code rec;
    if (conn.connected()) {
      release_on(conn, rec);
    } else {
      auto other = pool_.checkout(rec);
      if (!rec) release_on(*other, rec);
    }
    const std::string released =
        rec ? "could not be released (" + std::string(rec.message()) + "); it expires after its TTL"
            : "was released again";
    if (acked < 0) {
      ec = make_error_code(errc::backend_unavailable);
      set_error_detail(conn_opts_.describe() + ": WAIT after acquiring \"" + std::string(req.name) +
                       "\" failed; the lock " + released);
    } else {
      ec = make_error_code(errc::quorum_unavailable);
      set_error_detail(conn_opts_.describe() + ": only " + std::to_string(acked) + " of " +
                       std::to_string(wait_replicas_) + " replicas acknowledged acquiring \"" +
                       std::string(req.name) + "\" within " + std::to_string(wait_timeout_.count()) +
                       " ms (wait=" + std::to_string(wait_replicas_) + "); the lock " + released);
    }
    return false;
  }

  // The link a lock call runs on: the client's shared, auto-pipelined connection,
  // or with wait=N an exclusive one from the pool (WAIT counts the writes of its
  // own connection, and would stall every other call on a shared one).
  class CallLink {
   public:
    redis::Link& operator*() const noexcept { return *link_; }
    redis::Link* operator->() const noexcept { return link_; }

   private:
    friend class RedisBackend;
    redis::PooledConnection pooled_;
    redis::Link* link_ = nullptr;
  };
  CallLink lock_link(std::error_code& ec) {
    CallLink l;
    ec.clear();
    if (shared_) {
      l.link_ = shared_.get();
      return l;
    }
    l.pooled_ = checkout(ec);
    if (!ec) l.link_ = &*l.pooled_;
    return l;
  }

  redis::PooledConnection checkout(std::error_code& ec) {
    auto conn = pool_.checkout(ec);
    if (ec) report(pool_.last_error());
    return conn;
  }

  // As checkout(), and a failure leaves an error detail naming the server (records
  // and listing are called by layers that report it).
  redis::PooledConnection checkout_detailed(std::error_code& ec) {
    auto conn = checkout(ec);
    if (ec) set_error_detail(pool_.last_error());
    return conn;
  }

  void failed(const redis::Link& conn, const char* what) {
    report(std::string(what) + ": " + conn.last_error());
  }

  // One warning when the server becomes unreachable, one note when it is back,
  // rather than a line per failed call during an outage.
  // Logged once per outage; every failing call's error names the server and cause.
  void report(const std::string& why) {
    set_error_detail(why);
    if (!failing_.exchange(true)) log_.log(LogLevel::warning, "{}", why);
  }
  void ok() {
    if (failing_.exchange(false)) log_.log(LogLevel::info, "{} answers again", conn_opts_.describe());
  }

  const ConnectionOptions conn_opts_;
  const std::string prefix_;
  const std::string url_;
  const int wait_replicas_;
  const Millis wait_timeout_;
  Logger log_;
  std::atomic<ChangeListener*> listener_{nullptr};
  std::atomic<bool> failing_{false};
  std::atomic<std::uint64_t> release_messages_{0};
  ConnectionPool pool_;  // records, listing, status, and lock calls with wait=N
  // Lock calls (acquire, renew, release, queue refresh and give-up) from every
  // thread, pipelined on one socket; null with wait=N.
  const std::unique_ptr<redis::SharedConnection> shared_;
  const std::string grant_prefix_ = prefix_ + ":grant:";  // + client id: one grant channel per client
  std::mutex grants_mu_;
  bool grants_subscribed_ = false;  // guarded by grants_mu_
  std::string grant_channel_;       // guarded by grants_mu_
  std::mutex held_mu_;
  // Locks this client took from a queue: (name, owner) -> entry, until released.
  std::map<std::pair<std::string, std::string>, std::string> held_entries_;  // guarded by held_mu_
  redis::WaitQueue waits_;        // its refresher calls refresh_waits() and wake()
  redis::Subscriber subscriber_;  // last: destroyed first, its thread calls on_channel
};

}  // namespace

std::optional<RedisStats> redis_stats(const Backend& backend) {
  if (const auto* r = dynamic_cast<const RedisBackend*>(&backend)) return r->stats();
  return std::nullopt;
}

bool redis_prefix_ok(std::string_view prefix) {
  return !prefix.empty() && prefix.size() <= 256 && prefix.find_first_of("{}") == std::string_view::npos;
}

std::unique_ptr<Backend> make_redis_backend_for(const redis::ConnectionOptions& conn,
                                                const RedisSettings& settings, const ClientOptions& opts,
                                                std::error_code& ec, std::string& why) {
  ec.clear();
  auto backend = std::make_unique<RedisBackend>(conn, settings.prefix, settings.url, opts,
                                                settings.wait_replicas, settings.wait_timeout);
  if ((ec = backend->connect_now(why))) return nullptr;
  return backend;
}

std::unique_ptr<Backend> make_redis_backend(const Url& url, const ClientOptions& opts, std::error_code& ec,
                                            std::string& why) {
  ec.clear();
  const std::string shown = "\"" + url.redacted() + "\"";
  auto bad = [&](std::string msg) -> std::unique_ptr<Backend> {
    ec = make_error_code(errc::invalid_url);
    why = std::move(msg);
    return nullptr;
  };
  if (url.hosts.empty()) return bad("URL " + shown + " names no host (expected redis://host:port)");
  if (url.hosts.size() > 1) {
    return bad("URL " + shown + " names " + std::to_string(url.hosts.size()) +
               " hosts; redis:// takes one server (for several independent masters use redlock://)");
  }
  // The query's keys and their types were checked against the scheme's table
  // (registry.cpp) before this factory runs.
  const std::string prefix = url.query_or("prefix", "distlock");
  if (!prefix_ok(prefix)) {
    return bad("prefix \"" + prefix + "\" in URL " + shown +
               " must be 1-256 bytes without '{' or '}' (they delimit the hash tag)");
  }
  ConnectionOptions conn = redis::options_from_url(url, 0, opts, ec, why);
  if (ec) return nullptr;
  auto backend = std::make_unique<RedisBackend>(conn, prefix, url.redacted(), opts);
  if ((ec = backend->connect_now(why))) return nullptr;
  return backend;
}

// The scripts above, for the Redis Cluster backend (src/rediscluster): the same
// layout and the same rules per name, routed to the node serving the name's slot.
namespace redis {
const Script& lock_acquire_script() {
  return acquire_script();
}
const Script& lock_renew_script() {
  return renew_script();
}
}  // namespace redis

}  // namespace distlock::detail
