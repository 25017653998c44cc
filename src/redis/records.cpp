#include "redis/records.hpp"

#include <charconv>

namespace distlock::detail::redis {

const Script& put_if_absent_script() {
  static const Script& s = *new Script(R"lua(
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
)lua");
  return s;
}

const Script& fenced_put_script() {
  static const Script& s = *new Script(kFencedPutLua);
  return s;
}

std::vector<std::string> fenced_put_args(std::string_view value) {
  const auto t = record_term(value);
  return {std::string(value), std::to_string(t.value_or(0))};
}

Reply put_record_command(Link& conn, const std::string& record_key, std::string_view value, PutMode mode,
                         Error& ec) {
  switch (mode) {
    case PutMode::always: return conn.command({"SET", record_key, value}, ec);
    case PutMode::if_absent: return put_if_absent_script().run(conn, {record_key}, {value}, ec);
    case PutMode::fenced: break;
  }
  const std::vector<std::string> args = fenced_put_args(value);
  return fenced_put_script().run(conn, {record_key}, {args[0], args[1]}, ec);
}

void scan_keys(Connection& conn, std::string_view pattern,
               const std::function<void(std::string_view)>& on_key, Error& ec) {
  ec.clear();
  const std::string count = std::to_string(kScanCount);
  std::string cursor = "0";
  for (int calls = 0; calls < (1 << 24); ++calls) {
    Reply r = conn.command({"SCAN", cursor, "MATCH", pattern, "COUNT", count}, ec);
    if (ec) {
      // An error reply: the server's answer; a transport failure keeps the connection's detail.
      if (r) ec.set_detail(conn.options().describe() + ": SCAN: " + std::string(reply_str(r.get())));
      return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
      ec.fail(errc::protocol_error, conn.options().describe() + ": unexpected reply to SCAN");
      return;
    }
    for (std::size_t i = 0; i < r->element[1]->elements; ++i) on_key(reply_str(r->element[1]->element[i]));
    cursor = std::string(reply_str(r->element[0]));
    if (cursor == "0") return;
  }
  ec.fail(errc::protocol_error, conn.options().describe() + ": SCAN did not return to cursor 0");
}

}  // namespace distlock::detail::redis
