#include "redis/records.hpp"

#include <charconv>

namespace distlock::detail::redis {

const Script& put_if_absent_script() {
  static const Script s(R"lua(
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
)lua");
  return s;
}

void scan_keys(Connection& conn, std::string_view pattern,
               const std::function<void(std::string_view)>& on_key, std::error_code& ec, std::string& why) {
  ec.clear();
  const std::string count = std::to_string(kScanCount);
  std::string cursor = "0";
  for (int calls = 0; calls < (1 << 24); ++calls) {
    Reply r = conn.command({"SCAN", cursor, "MATCH", pattern, "COUNT", count}, ec);
    if (ec) {
      why = r ? conn.options().describe() + ": SCAN: " + std::string(reply_str(r.get())) : conn.last_error();
      return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
      ec = make_error_code(errc::protocol_error);
      why = conn.options().describe() + ": unexpected reply to SCAN";
      return;
    }
    for (std::size_t i = 0; i < r->element[1]->elements; ++i) on_key(reply_str(r->element[1]->element[i]));
    cursor = std::string(reply_str(r->element[0]));
    if (cursor == "0") return;
  }
  ec = make_error_code(errc::protocol_error);
  why = conn.options().describe() + ": SCAN did not return to cursor 0";
}

void append_status(Connection& conn, std::string_view lock, std::string_view fence, std::string_view channel,
                   bool sharded) {
  conn.append({"HGETALL", lock});
  conn.append({"PTTL", lock});
  conn.append({"GET", fence});
  conn.append({"PUBSUB", sharded ? "SHARDNUMSUB" : "NUMSUB", channel});
}

LockInfo parse_status(std::span<const Reply> r, std::error_code& ec, std::string& why) {
  LockInfo info;
  if (r.size() != 4) {
    ec = make_error_code(errc::protocol_error);
    why = "unexpected number of replies";
    return info;
  }
  if (is_error(r[0].get(), "WRONGTYPE")) return info;  // not a lock of this layout
  for (const auto& one : r) {
    if (one == nullptr || is_error(one.get())) {
      ec = one ? error_code_of(one.get()) : make_error_code(errc::protocol_error);
      why = one ? std::string(reply_str(one.get())) : std::string("no reply");
      return {};
    }
  }
  const redisReply* hash = r[0].get();
  if (hash->type != REDIS_REPLY_ARRAY) return info;
  for (std::size_t i = 0; i + 1 < hash->elements; i += 2) {
    const std::string_view field = reply_str(hash->element[i]);
    if (field == "@token") continue;
    info.held = true;
    info.holder = std::string(field);
  }
  if (info.held && r[1]->type == REDIS_REPLY_INTEGER && r[1]->integer >= 0) {
    info.ttl_remaining = Millis(r[1]->integer);
  }
  const std::string_view token = reply_str(r[2].get());
  std::uint64_t t = 0;
  if (r[2]->type == REDIS_REPLY_STRING && !token.empty()) {
    auto [p, e] = std::from_chars(token.data(), token.data() + token.size(), t);
    if (e == std::errc{} && p == token.data() + token.size()) info.token = t;
  }
  const redisReply* numsub = r[3].get();
  if (numsub->type == REDIS_REPLY_ARRAY && numsub->elements == 2 &&
      numsub->element[1]->type == REDIS_REPLY_INTEGER) {
    info.waiters = static_cast<std::uint64_t>(std::max<long long>(0, numsub->element[1]->integer));
  }
  return info;
}

}  // namespace distlock::detail::redis
