// The conformance target for redis+sentinel://: a Sentinel group (1 master, 2
// replicas, 3 sentinels; tests/support/redis_sentinel.hpp) reached through the
// sentinels' URL. A template over the suite's Target base so that it does not
// depend on where that base is declared:
//   k.push_back({"sentinel", [] { return std::make_unique<distlock::testing::SentinelTarget<Target>>(); }});
// Not a network-fault target: the client reaches the master at the address the
// sentinels name, which a proxy in front of the sentinels does not cover.
#pragma once

#include <string>
#include <vector>

#include "support/redis_sentinel.hpp"

namespace distlock::testing {

template <class Base>
class SentinelTarget final : public Base {
 public:
  std::string url() override { return group_.url(); }
  // Keys (but fence counters, which outlive every holder by design) and channels
  // on the current master; the sentinels' own hello channel is theirs, not ours.
  std::vector<std::string> leftovers() override {
    std::vector<std::string> out;
    RedisServer& m = group_.master();
    auto keys = m.command({"KEYS", "*"});
    for (std::size_t i = 0; keys && i < keys->elements; ++i) {
      std::string k(keys->element[i]->str, keys->element[i]->len);
      if (k.size() < 6 || k.compare(k.size() - 6, 6, ":fence") != 0) out.push_back("key " + k);
    }
    auto ch = m.command({"PUBSUB", "CHANNELS", "*"});
    for (std::size_t i = 0; ch && i < ch->elements; ++i) {
      std::string c(ch->element[i]->str, ch->element[i]->len);
      if (c != "__sentinel__:hello") out.push_back("channel " + c);
    }
    return out;
  }

 private:
  RedisSentinelGroup group_;
};

}  // namespace distlock::testing
