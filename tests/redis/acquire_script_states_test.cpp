// redis:// acquire script: the one whose try (mode 0) and new wait (mode 1) take a name that
// has no lock, no queue and no lock-delay marker after one EXISTS, against the same script
// without that shortcut, on every state of a name an acquire can meet.
// Starts its own redis-server on a loopback port; every read is bounded by a PING.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "redis/lock_scripts.hpp"
#include "support/redis_script_states.hpp"

namespace distlock::testing {
namespace {

// The shortcut as it stands in the acquire script (src/redis/lock_scripts.cpp): removing it
// (the condition line to its `end`) gives the script before it. The rest of the prelude
// changed with it only where a release passes its token as a function (publish_change);
// an acquire passes strings, so the prelude is the same for both variants here.
const std::string kShortcut = "if mode ~= '2' and redis.call('EXISTS', lock, q, marker or lock) == 0 then\n";

std::string without_shortcut(const std::string& src) {
  const std::size_t at = src.find(kShortcut);
  if (at == std::string::npos) return src;
  const std::size_t end = src.find("\nend\n", at);
  if (end == std::string::npos) return src;
  std::string out = src;
  out.erase(at, end + 5 - at);
  return out;
}

// The queue's functions (src/redis/lock_scripts.cpp kQueuePart, `prune` to `keep_queue`),
// which the script defines after its uncontended path, moved to before its body as every
// lock script had them until the prelude was split: where a `local function` stands
// changes what a call costs, not what it does.
std::string hoisted(const std::string& src) {
  const std::size_t from = src.find("\nlocal function prune(");
  const std::size_t last = src.find("\nlocal function keep_queue(");
  const std::size_t to = last == std::string::npos ? last : src.find("\nend\n", last);
  const std::size_t body = src.find("\nlocal lock, q, x, fence = KEYS[1]");
  if (from == std::string::npos || to == std::string::npos || body == std::string::npos || body > from)
    return src;
  const std::string part = src.substr(from, to + 5 - from);
  std::string out = src;
  out.erase(from, part.size());
  out.insert(body, part);
  return out;
}

std::string bucket(long long pttl) {
  if (pttl < 0) return std::to_string(pttl);
  if (pttl <= 1500) return "<=1.5s";
  if (pttl <= 6000) return "<=6s";
  if (pttl <= 10000) return "<=10s";
  return ">10s";
}

// Every state of one name an acquire can meet, run through the script with and without the
// shortcut (each on its own copy, under prefixes "a:" and "b:"): holder (none, this wait,
// this owner with another entry, another owner), a lost holder's lock-delay marker (none,
// live, without expiry), a queue of live and dead entries with or without this wait in it,
// an expiries hash entry of this wait with no queue, mode 0, 1 or 2, lock-delay 0 or 3 s,
// a registered watch or none. The replies, the keys left (lock fields and expiry, marker
// expiry, queue, expiries, fence) and the messages published (grants, watch events) must
// agree. A third copy (prefix "z:") runs the script with the queue's functions defined before
// its body (hoisted), as before the prelude was split; it must agree too.
TEST(RedisAcquireScriptStates, TheShortcutMatchesTheScriptWithoutItOnEveryState) {
  RedisServer server;
  RawRedisConnection raw(server.port());
  RawRedisConnection sub(server.port());
  sub.cmd({"PSUBSCRIBE", "a:*", "b:*", "z:*"});
  sub.read();  // the second pattern's confirmation
  sub.read();  // the third's
  const std::string new_src = distlock::detail::redis::queue_acquire_script().source();
  const std::string old_src = without_shortcut(new_src);
  ASSERT_TRUE(new_src != old_src) << "the shortcut was not found in the acquire script";
  const std::string hoisted_src = hoisted(new_src);
  ASSERT_TRUE(new_src != hoisted_src) << "the queue's functions were not found after the uncontended path";
  const std::string me = "eeee:1", me_entry = "7";
  std::mt19937 rng(20261130);
  int compared = 0, shortcut_states = 0, acquired = 0, busy = 0, gone = 0, watched = 0, mismatches = 0;
  for (int n = 0; n < 1500 && mismatches < 5; ++n) {
    auto t = raw.cmd({"TIME"});
    const long long now_ms =
        std::stoll(reply_text(t->element[0])) * 1000 + std::stoll(reply_text(t->element[1])) / 1000;
    // Half the states are empty but for what the shortcut does not look at (expiries, watch).
    const bool empty = rng() % 2 == 0;
    const int holder = empty ? 0 : static_cast<int>(rng() % 4);
    const int marker_state = empty ? 0 : static_cast<int>(rng() % 3);  // none, live, no expiry
    const int qlen = empty ? 0 : static_cast<int>(rng() % 4);
    const bool me_queued = !empty && rng() % 3 == 0;
    const bool me_live = rng() % 2 == 0;
    const bool orphan_x = rng() % 4 == 0;  // this wait in the expiries hash, not in the queue
    const int mode = static_cast<int>(rng() % 3);
    const std::string delay = rng() % 2 ? "3000" : "0";
    const bool watch = rng() % 3 == 0;
    std::vector<std::pair<std::string, bool>> q;  // member, live
    for (int i = 0; i < qlen; ++i)
      q.emplace_back(std::to_string(100 + i) + " wwww:" + std::to_string(i), rng() % 2);
    if (me_queued)
      q.insert(q.begin() + static_cast<std::ptrdiff_t>(rng() % (q.size() + 1)),
               {me_entry + " " + me, me_live});
    if (holder == 0 && marker_state == 0 && q.empty()) ++shortcut_states;
    std::map<std::string, std::vector<std::string>> seen;
    for (const std::string v : {"a:", "b:", "z:"}) {
      const std::string name = v + "{n" + std::to_string(n) + "}";
      const std::string lock = name, qk = name + ":q", xk = name + ":qx", marker = name + ":delay",
                        fence = v + "{f" + std::to_string(n) + "}:fence";
      raw.cmd({"DEL", v + "watching"});
      if (watch) raw.cmd({"SET", v + "watching", "1"});
      if (holder == 1) raw.cmd({"HSET", lock, me, me_entry, "@token", "5"});
      if (holder == 2) raw.cmd({"HSET", lock, me, "8", "@token", "5"});
      if (holder == 3) raw.cmd({"HSET", lock, "cccc:9", "9", "@token", "5"});
      if (holder != 0) raw.cmd({"PEXPIRE", lock, "9000"});
      if (marker_state == 1) raw.cmd({"SET", marker, "2000", "PX", "12000"});
      if (marker_state == 2) raw.cmd({"SET", marker, "2000"});
      for (const auto& [member, live] : q) {
        raw.cmd({"RPUSH", qk, member});
        const long long exp = live ? now_ms + 60000 : now_ms - 5000;
        raw.cmd({"HSET", xk, member, std::to_string(exp) + ":5000"});
      }
      if (orphan_x && !me_queued)
        raw.cmd({"HSET", xk, me_entry + " " + me, std::to_string(now_ms + 60000) + ":5000"});
      if (!q.empty() || orphan_x) {
        if (!q.empty()) raw.cmd({"PEXPIRE", qk, "60000"});
        raw.cmd({"PEXPIRE", xk, "60000"});
      }
      const std::string& src = v == "a:" ? old_src : v == "b:" ? new_src : hoisted_src;
      auto& d = seen[v];
      auto reply = raw.cmd({"EVAL", src, "4", lock, qk, xk, fence, me, "5000", me_entry, std::to_string(mode),
                            v + "grant:", delay});
      if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
          reply->element[1]->type == REDIS_REPLY_INTEGER) {
        d.push_back("reply [" + reply_text(reply->element[0]) + " " + bucket(reply->element[1]->integer) +
                    "]");
      } else {
        d.push_back("reply " + variant_normalized(reply_text(reply.get()), v, "<n>"));
      }
      auto h = raw.cmd({"HGETALL", lock});
      std::vector<std::string> fields;
      for (std::size_t i = 0; i + 1 < h->elements; i += 2)
        fields.push_back(reply_text(h->element[i]) + "=" + reply_text(h->element[i + 1]));
      std::sort(fields.begin(), fields.end());
      for (auto& f : fields) d.push_back("lock " + variant_normalized(f, v, "<n>"));
      for (const auto& [what, key] :
           {std::pair{"lock", lock}, std::pair{"marker", marker}, std::pair{"q", qk}, std::pair{"x", xk}}) {
        d.push_back(std::string(what) + " pttl " + bucket(raw.cmd({"PTTL", key})->integer));
      }
      auto l = raw.cmd({"LRANGE", qk, "0", "-1"});
      for (std::size_t i = 0; i < l->elements; ++i) d.push_back("q " + reply_text(l->element[i]));
      auto xs = raw.cmd({"HGETALL", xk});
      std::vector<std::string> xf;
      for (std::size_t i = 0; i + 1 < xs->elements; i += 2)
        xf.push_back(reply_text(xs->element[i]) + "=" +
                     variant_normalized(reply_text(xs->element[i + 1]), v, "<n>"));
      std::sort(xf.begin(), xf.end());
      for (auto& f : xf) d.push_back("x " + f);
      d.push_back("fence " + std::to_string(raw.cmd({"EXISTS", fence})->integer));
      for (auto& m : messages_until_ping(sub, v, "<n>")) d.push_back(std::move(m));
    }
    ++compared;
    const auto& b = seen["b:"];
    const auto has = [&](std::string_view prefix) {
      return std::any_of(b.begin(), b.end(), [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
    };
    if (has("reply [1 ")) ++acquired;
    if (has("reply [0 ")) ++busy;
    if (has("reply [2]")) ++gone;
    if (has("message v:events")) ++watched;
    if (seen["z:"] != b) {
      ++mismatches;
      std::string sc, sb;
      for (auto& s : seen["z:"]) sc += "  " + s + "\n";
      for (auto& s : b) sb += "  " + s + "\n";
      ADD_FAILURE() << "case " << n << " holder " << holder << " marker " << marker_state << " queue "
                    << q.size() << " mode " << mode << " delay " << delay << " watch " << watch
                    << "\nthe queue's functions hoisted:\n"
                    << sc << "as the script has them:\n"
                    << sb;
    }
    if (seen["a:"] != b) {
      ++mismatches;
      std::string sa, sb;
      for (auto& s : seen["a:"]) sa += "  " + s + "\n";
      for (auto& s : b) sb += "  " + s + "\n";
      ADD_FAILURE() << "case " << n << " holder " << holder << " marker " << marker_state << " queue "
                    << q.size() << " me queued " << me_queued << " live " << me_live << " orphan x "
                    << orphan_x << " mode " << mode << " delay " << delay << " watch " << watch
                    << "\nwithout the shortcut:\n"
                    << sa << "with it:\n"
                    << sb;
    }
  }
  std::printf(
      "compared %d states (%d with nothing the shortcut looks at): %d acquired, %d busy, %d gone, %d "
      "published an event\n",
      compared, shortcut_states, acquired, busy, gone, watched);
  EXPECT_EQ(mismatches, 0);
  // Each path was met, or the comparison proved little.
  EXPECT_GT(shortcut_states, 300);
  EXPECT_GT(acquired, 300);
  EXPECT_GT(busy, 100);
  EXPECT_GT(gone, 20);
  EXPECT_GT(watched, 100);
}

}  // namespace
}  // namespace distlock::testing
