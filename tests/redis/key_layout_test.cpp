// The redis:// key layout is injective (issue 27 item 13, src/redis/key_layout.hpp):
// no prefix produces another prefix's keys. No server needed.
#include "redis/key_layout.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "redis/redis_backend.hpp"
#include "redis/slots.hpp"

namespace {

namespace r = distlock::detail::redis;

// The case that collided: prefix "distlock:fence" + name "<tag>" was prefix
// "distlock"'s fence counter of that tag's slot.
TEST(RedisKeyLayout, APrefixEndingInFenceNoLongerNamesAnotherPrefixsCounter) {
  const std::string lock = r::lock_key("distlock", "order-42");
  const std::string tag = r::slot_tag(r::key_slot(lock));
  const std::string other_lock = r::lock_key("distlock:fence", tag);
  EXPECT_EQ(other_lock, "distlock:fence:{" + tag + "}") << "the old counter's key, for the record";
  EXPECT_NE(r::fence_key("distlock", lock), other_lock);
  EXPECT_EQ(r::fence_key("distlock", lock), "distlock:{" + tag + "}:fence");
  // Still in the lock's slot: the acquire script's keys share one slot.
  EXPECT_EQ(r::key_slot(r::fence_key("distlock", lock)), r::key_slot(lock));
}

// What one key stands for: (prefix, kind, name); a fence counter stands for its
// prefix and slot (names of one slot share it by design).
using Identity = std::tuple<std::string, std::string, std::string>;

void add(std::map<std::string, Identity>& seen, const std::string& key, const Identity& id, int& collisions) {
  auto [it, fresh] = seen.emplace(key, id);
  if (!fresh && it->second != id) {
    if (++collisions <= 5) {
      ADD_FAILURE() << "key \"" << key << "\" is both (" << std::get<0>(it->second) << ", "
                    << std::get<1>(it->second) << ", " << std::get<2>(it->second) << ") and ("
                    << std::get<0>(id) << ", " << std::get<1>(id) << ", " << std::get<2>(id) << ")";
    }
  }
}

void add_all(std::map<std::string, Identity>& keys, std::map<std::string, Identity>& channels,
             const std::string& prefix, const std::string& name, int& collisions) {
  const std::string lock = r::lock_key(prefix, name);
  add(keys, lock, {prefix, "lock", name}, collisions);
  add(keys, lock + ":q", {prefix, "queue", name}, collisions);
  add(keys, lock + ":qx", {prefix, "expiries", name}, collisions);
  add(keys, r::delay_key(lock), {prefix, "lock-delay marker", name}, collisions);
  add(keys, r::record_key(prefix, name), {prefix, "record", name}, collisions);
  add(keys, r::fence_key(prefix, lock), {prefix, "fence", std::to_string(r::key_slot(lock))}, collisions);
  add(channels, lock + ":released", {prefix, "released", name}, collisions);
}

// Every prefix of up to 3 pieces and every name of up to 2 pieces over pieces chosen
// to build the layout's own separators and suffixes, then 20,000 seeded random pairs
// of bytes that matter (':', '{', '}', digits, the suffixes' letters).
TEST(RedisKeyLayout, NoTwoPrefixNameKindTriplesShareAKey) {
  const std::vector<std::string> prefix_pieces{"a",     ":", "fence", "grant",    "q",     "record",
                                               "delay", "1", ":{",    "watching", "events"};
  const std::vector<std::string> name_pieces{"a", ":",      "{",     "}", "fence", "q",
                                             "x", "record", "delay", "1", "}:"};
  auto words = [](const std::vector<std::string>& pieces, int max_len) {
    std::vector<std::string> out{""};
    std::vector<std::string> last{""};
    for (int len = 1; len <= max_len; ++len) {
      std::vector<std::string> next;
      for (const auto& w : last)
        for (const auto& p : pieces) next.push_back(w + p);
      out.insert(out.end(), next.begin(), next.end());
      last = std::move(next);
    }
    return out;
  };
  std::vector<std::string> prefixes;
  for (auto& p : words(prefix_pieces, 3)) {
    if (distlock::detail::redis_prefix_ok(p)) prefixes.push_back(p);
  }
  std::vector<std::string> names;
  for (auto& n : words(name_pieces, 2)) {
    if (!n.empty()) names.push_back(n);
  }
  ASSERT_GT(prefixes.size(), 100u);
  std::map<std::string, Identity> keys, channels;
  int collisions = 0;
  for (const auto& p : prefixes)
    for (const auto& n : names) add_all(keys, channels, p, n, collisions);
  std::mt19937 rng(27);
  const std::string alphabet = ":{}01fencqxrdly";
  auto random_word = [&](std::size_t min, std::size_t max, bool braces) {
    std::string w;
    const std::size_t len = min + rng() % (max - min + 1);
    while (w.size() < len) {
      const char c = alphabet[rng() % alphabet.size()];
      if (!braces && (c == '{' || c == '}')) continue;
      w.push_back(c);
    }
    return w;
  };
  for (int i = 0; i < 20000; ++i) {
    const std::string p = random_word(1, 10, false), n = random_word(1, 10, true);
    ASSERT_TRUE(distlock::detail::redis_prefix_ok(p)) << p;
    add_all(keys, channels, p, n, collisions);
  }
  // The grant channels: "<prefix>:grant:<hex client id>"; the events channel and the
  // watcher-presence key of each prefix (Client::watch).
  for (const auto& p : prefixes) {
    add(channels, p + ":events", {p, "events", ""}, collisions);
    add(keys, r::watching_key(p), {p, "watching", ""}, collisions);
    for (const std::string client : {"0a", "f", "0a1"}) {
      add(channels, p + ":grant:" + client, {p, "grant", client}, collisions);
    }
  }
  EXPECT_EQ(collisions, 0) << "over " << keys.size() << " keys and " << channels.size() << " channels";
  // Prefixes with braces are refused: they would hide where the prefix ends.
  EXPECT_FALSE(distlock::detail::redis_prefix_ok("a{b"));
  EXPECT_FALSE(distlock::detail::redis_prefix_ok("a}"));
}

}  // namespace
