// What the redis:// scripts' differential tests (tests/redis/*_script_states_test.cpp,
// acquire_fastpath_test.cpp) share: a plain hiredis connection of the test's own, a reply as
// text, and a variant's key names and tokens made comparable.
#pragma once

#include <hiredis/hiredis.h>

#include <cstdint>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/redis_server.hpp"

namespace distlock::testing {

/// One hiredis connection to 127.0.0.1:`port` (many commands, one socket). Throws
/// std::runtime_error when it cannot connect, send or read.
class RawRedisConnection {
 public:
  explicit RawRedisConnection(std::uint16_t port) : c_(redisConnect("127.0.0.1", port)) {
    if (c_ == nullptr || c_->err) {
      redisFree(c_);
      throw std::runtime_error("cannot connect to the test's redis-server");
    }
  }
  RawRedisConnection(const RawRedisConnection&) = delete;
  RawRedisConnection& operator=(const RawRedisConnection&) = delete;
  ~RawRedisConnection() { redisFree(c_); }

  /// Queues a command (sent with the next read).
  void send(const std::vector<std::string>& argv) {
    std::vector<const char*> p;
    std::vector<size_t> l;
    for (const auto& a : argv) {
      p.push_back(a.data());
      l.push_back(a.size());
    }
    if (redisAppendCommandArgv(c_, static_cast<int>(argv.size()), p.data(), l.data()) != REDIS_OK)
      throw std::runtime_error("cannot send a command");
  }
  /// The next reply (of a command sent, or a message of a subscription).
  RedisReplyPtr read() {
    void* r = nullptr;
    if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) throw std::runtime_error("no reply");
    return RedisReplyPtr(static_cast<redisReply*>(r));
  }
  RedisReplyPtr cmd(const std::vector<std::string>& argv) {
    send(argv);
    return read();
  }

 private:
  redisContext* c_;
};

/// A reply as text: strings, statuses and errors as they are, integers in decimal, "nil",
/// arrays as "[a b ...]", "<null>" for no reply.
inline std::string reply_text(const redisReply* r) {
  if (r == nullptr) return "<null>";
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR: return std::string(r->str, r->len);
    case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
    case REDIS_REPLY_NIL: return "nil";
    case REDIS_REPLY_ARRAY: {
      std::string s = "[";
      for (std::size_t i = 0; i < r->elements; ++i) s += (i ? " " : "") + reply_text(r->element[i]);
      return s + "]";
    }
    default: return "?";
  }
}

/// `s` with the variant's prefix `v` ("a:" or "b:", which no owner holds) written "v:" and
/// every run of 10 or more digits (the server's TIME in microseconds, a fence counter, an
/// expiry in milliseconds) written `number_as`.
inline std::string variant_normalized(const std::string& s, const std::string& v,
                                      const std::string& number_as) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, v.size(), v) == 0) {
      out += "v:";
      i += v.size() - 1;
    } else {
      out += s[i];
    }
  }
  return std::regex_replace(out, std::regex("[0-9]{10,}"), number_as);
}

/// What `sub` (a PSUBSCRIBE connection) received before the answer to a PING it sends now
/// (everything published before the PING arrives before it): "message <channel> <payload>"
/// each, both variant_normalized. At most 20 replies are read.
inline std::vector<std::string> messages_until_ping(RawRedisConnection& sub, const std::string& v,
                                                    const std::string& number_as) {
  std::vector<std::string> out;
  sub.send({"PING"});
  for (int k = 0; k < 20; ++k) {
    auto m = sub.read();
    if (m->type == REDIS_REPLY_ARRAY && m->elements >= 1 && reply_text(m->element[0]) == "pong") break;
    if (m->type == REDIS_REPLY_ARRAY && m->elements == 4) {
      out.push_back("message " + variant_normalized(reply_text(m->element[2]), v, number_as) + " " +
                    variant_normalized(reply_text(m->element[3]), v, number_as));
    }
  }
  return out;
}

}  // namespace distlock::testing
