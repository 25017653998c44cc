// Test support for Redlock: N independent redis-server masters started by the
// test binary (RedisServer from tests/support), the redlock:// URL over them,
// and per-master key inspection that does not go through the code under test.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "support/redis_server.hpp"

namespace distlock::testing {

class Masters {
 public:
  explicit Masters(std::size_t n, RedisServerOptions opts = {}) : opts_(std::move(opts)) {
    for (std::size_t i = 0; i < n; ++i) servers_.push_back(std::make_unique<RedisServer>(opts_));
  }

  RedisServer& operator[](std::size_t i) { return *servers_.at(i); }
  std::size_t size() const { return servers_.size(); }

  /// redlock://[userinfo@]127.0.0.1:p1,...[?query]
  std::string url(const std::string& query = {}, const std::string& userinfo = {}) const {
    std::string u = "redlock://";
    if (!userinfo.empty()) u += userinfo + "@";
    for (std::size_t i = 0; i < servers_.size(); ++i) {
      if (i) u += ",";
      u += "127.0.0.1:" + std::to_string(servers_[i]->port());
    }
    if (!query.empty()) u += "?" + query;
    return u;
  }

  /// redlocks://[userinfo@]127.0.0.1:t1,...?query over the masters' TLS ports (the
  /// masters must have been started with a TLS certificate).
  std::string tls_url(const std::string& query, const std::string& userinfo = {}) const {
    std::string u = "redlocks://";
    if (!userinfo.empty()) u += userinfo + "@";
    for (std::size_t i = 0; i < servers_.size(); ++i) {
      if (i) u += ",";
      u += "127.0.0.1:" + std::to_string(servers_[i]->tls_port());
    }
    return u + "?" + query;
  }

  /// Every key on master i matching `pattern` (SCAN, so it also works on big keyspaces).
  std::vector<std::string> keys(std::size_t i, const std::string& pattern = "*") {
    std::vector<std::string> out;
    std::string cursor = "0";
    do {
      auto r = (*this)[i].command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
      if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) break;
      cursor.assign(r->element[0]->str, r->element[0]->len);
      for (std::size_t k = 0; k < r->element[1]->elements; ++k) {
        out.emplace_back(r->element[1]->element[k]->str, r->element[1]->element[k]->len);
      }
    } while (cursor != "0");
    return out;
  }

  /// The value of `key` on master i, or "(nil)".
  std::string get(std::size_t i, const std::string& key) {
    auto r = (*this)[i].command({"GET", key});
    if (!r || r->type != REDIS_REPLY_STRING) return "(nil)";
    return std::string(r->str, r->len);
  }

 private:
  RedisServerOptions opts_;
  std::vector<std::unique_ptr<RedisServer>> servers_;
};

}  // namespace distlock::testing
