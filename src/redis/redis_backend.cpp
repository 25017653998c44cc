#include "redis/redis_backend.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <set>

#include "core/log.hpp"
#include "redis/connection.hpp"
#include "redis/records.hpp"
#include "redis/subscriber.hpp"

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

// KEYS[1] lock hash; ARGV[1] owner, ARGV[2] release channel.
// Returns -1 when the owner holds nothing (expired or someone else's: nothing is
// touched), else the owner's remaining hold count; at 0 the hash is deleted and the
// release is published (the fence counter stays).
const Script& release_script() {
  static const Script s(R"lua(
local lock, owner, channel = KEYS[1], ARGV[1], ARGV[2]
if redis.call('HEXISTS', lock, owner) == 0 then
  return -1
end
local left = redis.call('HINCRBY', lock, owner, -1)
if left > 0 then
  return left
end
redis.call('DEL', lock)
redis.call('PUBLISH', channel, 'released')
return 0
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
        subscriber_(conn, [this](std::string_view channel) { on_channel(channel); }) {}

  ~RedisBackend() override = default;  // the subscriber (declared last) stops its thread first

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
    auto conn = checkout(ec);
    if (ec) return {};
    const std::string lock = lock_key(req.name);
    const std::string fence = lock + ":fence";
    const std::string ttl = std::to_string(req.ttl.count());
    Reply r = acquire_script().run(*conn, {lock, fence}, {req.owner, ttl}, ec);
    if (ec) {
      failed(*conn, "acquire");
      return {};
    }
    std::uint64_t flag = 0;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || !to_u64(r->element[0], flag)) {
      ec = make_error_code(errc::protocol_error);
      log_.log(LogLevel::warning, "{}: unexpected reply to the acquire script", conn_opts_.describe());
      return {};
    }
    ok();
    AcquireResult res;
    if (flag == 1) {
      res.acquired = true;
      if (!to_u64(r->element[1], res.token)) {
        ec = make_error_code(errc::protocol_error);
        return {};
      }
      res.validity = req.ttl;
      if (wait_replicas_ > 0 && !replicated_acquire(*conn, req, lock, ec)) return {};
      return res;
    }
    const redisReply* pttl = r->element[1];
    if (pttl->type == REDIS_REPLY_INTEGER && pttl->integer > 0) res.holder_ttl = Millis(pttl->integer);
    return res;
  }

  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) override {
    ec.clear();
    std::fill(out.begin(), out.end(), RenewStatus::failed);
    if (items.empty()) return;
    auto conn = checkout(ec);
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
      }
    }
  }

  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t /*token*/,
                        std::error_code& ec) override {
    ec.clear();
    auto conn = checkout(ec);
    if (ec) return ReleaseStatus::released;
    const std::string lock = lock_key(name);
    const std::string channel = lock + ":released";
    Reply r = release_script().run(*conn, {lock}, {owner, channel}, ec);
    if (ec) {
      failed(*conn, "release");
      return ReleaseStatus::released;
    }
    ok();
    if (r->type != REDIS_REPLY_INTEGER) {
      ec = make_error_code(errc::protocol_error);
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
    const std::string lock = lock_key(name);
    const std::string fence = lock + ":fence";
    const std::string channel = lock + ":released";
    conn->append({"HGETALL", lock});
    conn->append({"PTTL", lock});
    conn->append({"GET", fence});
    conn->append({"PUBSUB", "NUMSUB", channel});
    std::vector<Reply> r = conn->read_replies(4, ec);
    if (ec) {
      failed(*conn, "status");
      return {};
    }
    for (const auto& one : r) {
      if (redis::is_error(one.get())) {
        ec = redis::error_code_of(one.get());
        log_.log(LogLevel::warning, "{}: status of \"{}\": {}", conn_opts_.describe(), name,
                 redis::reply_str(one.get()));
        return {};
      }
    }
    ok();
    LockInfo info;
    const redisReply* hash = r[0].get();
    for (std::size_t i = 0; i + 1 < hash->elements; i += 2) {
      const std::string_view field = redis::reply_str(hash->element[i]);
      if (field == kTokenField) continue;
      info.held = true;
      info.holder = std::string(field);
    }
    if (info.held && r[1]->type == REDIS_REPLY_INTEGER && r[1]->integer >= 0) {
      info.ttl_remaining = Millis(r[1]->integer);
    }
    std::uint64_t token = 0;
    if (to_u64(r[2].get(), token)) info.token = token;
    const redisReply* numsub = r[3].get();
    if (numsub->type == REDIS_REPLY_ARRAY && numsub->elements == 2 &&
        numsub->element[1]->type == REDIS_REPLY_INTEGER) {
      info.waiters = static_cast<std::uint64_t>(std::max<long long>(0, numsub->element[1]->integer));
    }
    return info;
  }

  // Records are plain strings `<prefix>:{<key>}:record` without expiry (see lock_key()).
  std::string put_record(std::string_view key, std::string_view value, PutMode mode,
                         std::error_code& ec) override {
    ec.clear();
    if (!redis::record_value_fits(key, value, ec)) return {};
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
      for (const auto& name : chunk) {
        const std::string lock = lock_key(name);
        redis::append_status(*conn, lock, lock + ":fence", lock + ":released", false);
      }
      std::vector<Reply> r = conn->read_replies(4 * chunk.size(), e);
      if (e) return listing_failed(*conn, conn->last_error(), e);
      for (std::size_t i = 0; i < chunk.size(); ++i) {
        infos.push_back(redis::parse_status(std::span<const Reply>(r).subspan(4 * i, 4), e, why));
        if (e) return listing_failed(*conn, conn_opts_.describe() + ": " + why, e);
      }
    };
    auto out = redis::held_in_order(names, limit, truncated, status_of, ec);
    if (!ec) ok();
    return out;
  }

  std::string url() const override { return url_; }

 private:
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
    constexpr std::string_view kTail = "}:released";
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
  bool replicated(Connection& conn, const char* what, long long* acked_out = nullptr) {
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
  bool replicated_acquire(Connection& conn, const AcquireRequest& req, const std::string& lock,
                          std::error_code& ec) {
    long long acked = -1;
    if (replicated(conn, "acquisition", &acked)) return true;
    const std::string channel = lock + ":released";
    std::error_code rec;
    if (conn.connected()) {
      release_script().run(conn, {lock}, {req.owner, channel}, rec);
    } else {
      auto other = pool_.checkout(rec);
      if (!rec) release_script().run(*other, {lock}, {req.owner, channel}, rec);
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

  void failed(const Connection& conn, const char* what) {
    report(std::string(what) + ": " + conn.last_error());
  }

  // One warning when the server becomes unreachable, one note when it is back,
  // rather than a line per failed call during an outage.
  void report(const std::string& why) {
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
  ConnectionPool pool_;
  redis::Subscriber subscriber_;  // last: destroyed first, its thread calls on_channel
};

}  // namespace

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
  for (const auto& [key, value] : url.query) {
    if (key != "prefix" && key != "timeout") {
      return bad("unknown query parameter \"" + key + "\" in URL " + shown + " (known: prefix, timeout)");
    }
  }
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
