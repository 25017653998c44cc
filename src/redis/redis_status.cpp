// The redis:// backend's status of a lock, records (plain strings) and the listing of
// held locks.
#include "redis/redis_backend_impl.hpp"

namespace distlock::detail::redis {

namespace {

// The hash field holding the lock's fencing token. Owner ids are "<hex>:<digits>",
// so no owner can be called this.
constexpr std::string_view kTokenField = "@token";

}  // namespace

LockInfo RedisBackend::status(std::string_view name, Error& ec) {
  ec.clear();
  auto conn = checkout(ec);
  if (ec) return {};
  const std::string n(name);
  std::vector<LockInfo> infos = statuses(*conn, std::span(&n, 1), ec);
  if (ec) {
    const std::string why = ec.detail();
    if (!conn->connected()) {
      failed("status", ec);
    } else {
      ec.set_detail({});  // the server's answer is logged, not part of the error
    }
    log_.log(LogLevel::warning, "{}: status of \"{}\": {}", conn_opts_.describe(), name, why);
    return {};
  }
  ok();
  return infos.front();
}

// Records are plain strings `<prefix>:{<key>}:record` without expiry (see lock_key()).
std::string RedisBackend::put_record(std::string_view key, std::string_view value, PutMode mode, Error& ec) {
  ec.clear();
  if (!record_value_fits(key, value, ec)) return {};
  auto conn = checkout(ec);
  if (ec) return {};
  const std::string k = record_key(key);
  Reply r = redis::put_record_command(*conn, k, value, mode, ec);
  if (!answered(r, "put record", ec)) return {};
  if (!replicated_record(*conn, key, ec)) return {};
  if (mode == PutMode::always) return std::string(value);
  if (r->type != REDIS_REPLY_STRING) return unexpected("put record", ec), std::string();
  return std::string(redis::reply_str(r.get()));
}

std::optional<std::string> RedisBackend::get_record(std::string_view key, Error& ec) {
  ec.clear();
  auto conn = checkout(ec);
  if (ec) return std::nullopt;
  Reply r = conn->command({"GET", record_key(key)}, ec);
  if (!answered(r, "get record", ec)) return std::nullopt;
  if (r->type == REDIS_REPLY_NIL) return std::nullopt;
  if (r->type != REDIS_REPLY_STRING) return unexpected("get record", ec), std::nullopt;
  return std::string(redis::reply_str(r.get()));
}

bool RedisBackend::erase_record(std::string_view key, Error& ec) {
  ec.clear();
  auto conn = checkout(ec);
  if (ec) return false;
  Reply r = conn->command({"DEL", record_key(key)}, ec);
  if (!answered(r, "erase record", ec)) return false;
  if (!replicated_record(*conn, key, ec)) return false;
  if (r->type != REDIS_REPLY_INTEGER) return unexpected("erase record", ec), false;
  return r->integer > 0;
}

// SCAN MATCH `<prefix>:{<escaped prefix>*}` (only lock hashes end in '}'), then the
// status of the candidates in name order, kListChunk per pipeline.
std::vector<ListedLock> RedisBackend::list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                                Error& ec) {
  ec.clear();
  truncated = false;
  auto conn = checkout(ec);
  if (ec) return {};
  const std::string head = prefix_ + ":{";
  std::set<std::string> names;
  redis::scan_keys(
      *conn, redis::glob_escape(head) + redis::glob_escape(prefix) + "*}",
      [&](std::string_view key) {
        if (key.size() < head.size() + 2 || key.substr(0, head.size()) != head || key.back() != '}') return;
        const std::string_view name = key.substr(head.size(), key.size() - head.size() - 1);
        if (name.substr(0, prefix.size()) == prefix) names.emplace(name);
      },
      ec);
  if (ec) return listing_failed(*conn, ec.detail(), ec), std::vector<ListedLock>{};
  auto status_of = [&](std::span<const std::string> chunk, std::vector<LockInfo>& infos, Error& e) {
    std::vector<LockInfo> got = statuses(*conn, chunk, e);
    if (e) return listing_failed(*conn, conn_opts_.describe() + ": " + e.detail(), e);
    infos.insert(infos.end(), got.begin(), got.end());
  };
  auto out = redis::held_in_order(names, limit, truncated, status_of, ec);
  if (!ec) ok();
  return out;
}

// Status of each name (one script call each, one pipeline): holder, ttl, the
// holder's token, and the live queued waiters. A free lock has no token to show:
// its counter is its slot's, shared with other names.
std::vector<LockInfo> RedisBackend::statuses(Connection& conn, std::span<const std::string> names,
                                             Error& ec) {
  std::vector<Keys> ks;
  ks.reserve(names.size());
  for (const auto& n : names) ks.push_back(keys_of(n));
  std::vector<std::array<std::string_view, 3>> key_views(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) key_views[i] = {ks[i].lock, ks[i].expiries, ks[i].queue};
  std::vector<redis::Script::Call> calls;
  for (auto& kv : key_views) calls.push_back({std::span<const std::string_view>(kv), {}});
  std::vector<Reply> replies = redis::queue_status_script().run_pipelined(conn, calls, ec);
  if (ec) return {};
  std::vector<LockInfo> out;
  for (const auto& one : replies) {
    const redisReply* r = one.get();
    if (r == nullptr || redis::is_error(r)) {
      ec.fail(r ? redis::error_code_of(r) : make_error_code(errc::protocol_error),
              r ? std::string(redis::reply_str(r)) : std::string("no reply"));
      return {};
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 4 || r->element[0]->type != REDIS_REPLY_ARRAY ||
        r->element[3]->type != REDIS_REPLY_ARRAY) {
      ec.fail(errc::protocol_error, "unexpected reply to the status script");
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
    const redisReply* queue = r->element[3];
    for (std::size_t i = 0; i < queue->elements; ++i) {
      WaiterInfo w;
      w.owner = std::string(redis::reply_str(queue->element[i]));
      info.waiter_list.push_back(std::move(w));
    }
    info.waiters_listed = true;  // waiting_since: a queue entry records no join time
    info.waiters = info.waiter_list.size();
    out.push_back(std::move(info));
  }
  return out;
}

// After a record command: false with ec (and an error detail naming the server)
// when the transport failed or the server answered with an error.
bool RedisBackend::answered(const Reply& r, const char* what, Error& ec) {
  if (!ec) {
    ok();
    return true;
  }
  const std::string why =
      r ? conn_opts_.describe() + ": " + what + ": " + std::string(redis::reply_str(r.get()))
        : std::string(what) + ": " + ec.detail();
  if (r) {
    log_.log(LogLevel::warning, "{}", why);
  } else {
    report(why, ec);
  }
  ec.set_detail(why);
  return false;
}

// With wait=N a record write that fewer than N replicas acknowledged fails with
// quorum_unavailable (backend_unavailable when WAIT itself failed): it is on the
// master, and a failover before it reaches a replica may lose it.
bool RedisBackend::replicated_record(Connection& conn, std::string_view key, Error& ec) {
  if (wait_replicas_ <= 0) return true;
  long long acked = -1;
  if (replicated(conn, "record write", &acked)) return true;
  ec = make_error_code(acked < 0 ? errc::backend_unavailable : errc::quorum_unavailable);
  ec.set_detail(conn_opts_.describe() + ": record \"" + std::string(key.substr(0, 200)) +
                "\" was written on the master but " +
                (acked < 0 ? std::string("WAIT failed")
                           : "only " + std::to_string(acked) + " of " + std::to_string(wait_replicas_) +
                                 " replicas acknowledged it within " + std::to_string(wait_timeout_.count()) +
                                 " ms (wait=" + std::to_string(wait_replicas_) + ")") +
                "; a failover may lose it");
  return false;
}

}  // namespace distlock::detail::redis
