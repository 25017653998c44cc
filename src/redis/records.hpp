// redis/records.hpp — the pieces the Redis-family backends (redis://,
// redis+sentinel://, redis+cluster://, redlock://) share for records and for
// listing held locks (Backend::put_record, get_record, erase_record, list_held).
//
// What is here:
//   * `glob_escape`         a byte string made literal for SCAN MATCH;
//   * `held_in_order`       the sorted, limited listing over candidate names;
//   * `put_if_absent_script` the one-step "store unless present, answer what is stored" script;
//   * `fenced_put_script`   the one-step "store unless a newer term is there" script (PutMode::fenced);
//   * `scan_keys`           SCAN MATCH ... COUNT kScanCount over one server, until the cursor is 0;
// The first two are header-only (redlock:// uses them without the redis component's
// connections); the rest run over a redis::Connection.
//
// Thread-safety: free functions over their arguments; the script object is shared
// like every redis::Script.
//
// Example:
//   std::set<std::string> names;
//   redis::scan_keys(conn, redis::glob_escape("distlock:{jobs/") + "*}", [&](std::string_view k) {...}, ec);
//   auto listed = redis::held_in_order(names, 100, truncated, status_of_chunk, ec);
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/backend.hpp"
#include "redis/connection.hpp"

namespace distlock::detail::redis {

/// Keys asked per SCAN call: enough that a large keyspace takes few round trips,
/// small enough that one call keeps the server busy only briefly.
inline constexpr std::size_t kScanCount = 1000;
/// Locks whose status is read per round trip while listing.
inline constexpr std::size_t kListChunk = 256;

/// `s` with every glob metacharacter of Redis's MATCH (`*`, `?`, `[`, `]`, `\`)
/// preceded by a backslash: the pattern then matches exactly these bytes.
inline std::string glob_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

/// Reads the status of candidate `names` (sorted, deduplicated) chunk by chunk in
/// order until `limit` held ones are found, and one more tells `truncated`.
/// `status_of(chunk, infos, ec)` fills one LockInfo per name of the chunk; names
/// not held (released or expired since they were found) are skipped.
template <class StatusOf>
std::vector<ListedLock> held_in_order(const std::set<std::string>& names, std::size_t limit, bool& truncated,
                                      StatusOf&& status_of, Error& ec) {
  truncated = false;
  std::vector<ListedLock> out;
  std::vector<std::string> chunk;
  auto it = names.begin();
  while (it != names.end()) {
    chunk.clear();
    while (it != names.end() && chunk.size() < kListChunk) chunk.push_back(*it++);
    std::vector<LockInfo> infos;
    status_of(std::span<const std::string>(chunk), infos, ec);
    if (ec) return {};
    for (std::size_t i = 0; i < chunk.size() && i < infos.size(); ++i) {
      if (!infos[i].held) continue;
      if (out.size() == limit) {
        truncated = true;
        return out;
      }
      out.push_back(ListedLock{chunk[i], std::move(infos[i])});
    }
  }
  return out;
}

/// KEYS[1] record; ARGV[1] value. Stores the value unless the key exists, and
/// returns the value stored after the call (the existing one, or ARGV[1]).
const Script& put_if_absent_script();

/// KEYS[1] record; ARGV[1] value "<term>\n...", ARGV[2] its term in decimal
/// (record_term of ARGV[1]). PutMode::fenced in one step: stores the value unless the
/// record's term (its leading 1-20 digits before '\n', at most 2^64 - 1, compared
/// as decimal strings, so exactly) is greater than ARGV[2]; returns the value stored
/// after the call. redlock:// runs the same text on each master (kFencedPutScript).
const Script& fenced_put_script();
inline constexpr const char* kFencedPutLua = R"lua(
local function term(s)
  local t = string.match(s, '^(%d+)\n')
  if not t or #t > 20 then return nil end
  t = string.match(t, '^0*(.-)$')
  if #t == 20 and t > '18446744073709551615' then return nil end
  return t
end
local v = redis.call('GET', KEYS[1])
if v then
  local have = term(v)
  local mine = string.match(ARGV[2], '^0*(.-)$')
  if have and (#have > #mine or (#have == #mine and have > mine)) then return v end
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
)lua";

/// The arguments of fenced_put_script for `value`: {value, its term}; the term is "0"
/// for a value without one (which then replaces only records without a term or of term 0).
std::vector<std::string> fenced_put_args(std::string_view value);

/// The record command for `mode` on `conn`: SET (always), put_if_absent_script or
/// fenced_put_script; the reply is "OK" for SET, else the value stored after the call.
Reply put_record_command(Link& conn, const std::string& record_key, std::string_view value, PutMode mode,
                         Error& ec);

/// SCAN with `MATCH pattern COUNT kScanCount` on `conn` from cursor 0 until the
/// server returns cursor 0 (bounded: at most 2^24 calls); `on_key` sees every key
/// returned (a key may come twice). Errors: ec from the transport or the reply
/// (backend_unavailable, auth_failed, protocol_error), the detail naming the server.
void scan_keys(Connection& conn, std::string_view pattern,
               const std::function<void(std::string_view)>& on_key, Error& ec);

}  // namespace distlock::detail::redis
