#include "support/redis_server.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/harness_setup.hpp"

namespace distlock::testing {

namespace {

RedisReplyPtr run_argv(redisContext* c, const std::vector<std::string_view>& argv) {
  std::vector<const char*> ptrs;
  std::vector<std::size_t> lens;
  for (auto a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  return RedisReplyPtr(
      static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), ptrs.data(), lens.data())));
}

}  // namespace

RedisServer::RedisServer(RedisServerOptions opts)
    : LocalServerProcess("distlock-redis"), opts_(std::move(opts)) {
  require_program("redis-server", "Redis tests", "redis-server");
  // A port that was free a moment ago can be taken by a parallel test: try a few.
  std::string failures;
  for (int attempt = 0; attempt < 3; ++attempt) {
    pick_free_port();
    if (!opts_.tls_cert.empty()) {
      do {
        tls_port_ = free_port();
      } while (tls_port_ == port_);
    }
    start();
    if (wait_ready(std::chrono::seconds(10))) return;
    failures += "port " + std::to_string(port_) + ":\n" + log() + "\n";
    process_.stop(std::chrono::milliseconds(500));
  }
  const std::string msg = "redis-server did not start; its log:\n" + failures;
  fail_setup(msg);
}

void RedisServer::start() {
  const std::string d = dir_.path().string();
  std::vector<std::string> argv{"redis-server",
                                "--port",
                                std::to_string(port_),
                                "--bind",
                                "127.0.0.1",
                                "--dir",
                                d,
                                "--save",
                                "",
                                "--daemonize",
                                "no",
                                "--appendonly",
                                opts_.appendonly ? "yes" : "no",
                                "--appendfsync",
                                opts_.appendfsync,
                                "--loglevel",
                                "notice"};
  if (!opts_.password.empty()) {
    argv.insert(argv.end(), {"--requirepass", opts_.password});
  }
  if (!opts_.acl_user.empty()) {
    argv.insert(argv.end(), {"--user", opts_.acl_user, "on", ">" + opts_.acl_password, "~*", "&*", "+@all"});
  }
  if (!opts_.tls_cert.empty()) {
    argv.insert(argv.end(), {"--tls-port", std::to_string(tls_port_), "--tls-cert-file", opts_.tls_cert,
                             "--tls-key-file", opts_.tls_key, "--tls-ca-cert-file", opts_.tls_ca,
                             "--tls-auth-clients", opts_.tls_auth_clients ? "yes" : "no"});
  }
  argv.insert(argv.end(), opts_.extra_args.begin(), opts_.extra_args.end());
  launch(argv, "redis.log");
}

bool RedisServer::wait_ready(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (!process_.running()) return false;
    try {
      auto r = command({"PING"});
      if (r && r->type == REDIS_REPLY_STATUS) return true;
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string RedisServer::url(std::string_view suffix) const {
  std::string u = "redis://";
  if (!opts_.password.empty()) u += ":" + opts_.password + "@";
  u += "127.0.0.1:" + std::to_string(port_);
  u += suffix;
  return u;
}

void RedisServer::stop() {
  process_.stop(std::chrono::milliseconds(5000));
}

void RedisServer::restart() {
  if (process_.running()) stop();
  // The old listening socket may linger for a moment after the process is gone.
  for (int attempt = 0; attempt < 20; ++attempt) {
    start();
    if (wait_ready(std::chrono::seconds(10))) return;
    process_.stop(std::chrono::milliseconds(500));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string msg =
      "redis-server did not restart on port " + std::to_string(port_) + "; log:\n" + log();
  fail_setup(msg);
}

RedisReplyPtr RedisServer::command(std::initializer_list<std::string_view> argv) const {
  timeval tv{5, 0};
  std::unique_ptr<redisContext, RedisContextDeleter> c(redisConnectWithTimeout("127.0.0.1", port_, tv));
  if (!c || c->err) {
    throw std::runtime_error("cannot connect to redis-server on port " + std::to_string(port_) + ": " +
                             (c ? c->errstr : "out of memory"));
  }
  redisSetTimeout(c.get(), tv);
  if (!opts_.password.empty()) {
    auto a = run_argv(c.get(), {"AUTH", opts_.password});
    if (!a) throw std::runtime_error(std::string("AUTH failed: ") + c->errstr);
  }
  auto r = run_argv(c.get(), std::vector<std::string_view>(argv));
  if (!r) throw std::runtime_error(std::string("redis command failed: ") + c->errstr);
  return r;
}

RedisReplyPtr RedisServer::command(const std::vector<std::string>& argv) const {
  std::vector<std::string_view> views(argv.begin(), argv.end());
  timeval tv{5, 0};
  std::unique_ptr<redisContext, RedisContextDeleter> c(redisConnectWithTimeout("127.0.0.1", port_, tv));
  if (!c || c->err) {
    throw std::runtime_error("cannot connect to redis-server on port " + std::to_string(port_));
  }
  redisSetTimeout(c.get(), tv);
  if (!opts_.password.empty()) run_argv(c.get(), {"AUTH", opts_.password});
  auto r = run_argv(c.get(), views);
  if (!r) throw std::runtime_error(std::string("redis command failed: ") + c->errstr);
  return r;
}

long long RedisServer::command_calls(std::string_view command_name) const {
  auto r = command({"INFO", "commandstats"});
  if (!r || r->type != REDIS_REPLY_STRING) return 0;
  const std::string info(r->str, r->len);
  const std::string needle = "cmdstat_" + std::string(command_name) + ":calls=";
  const auto p = info.find(needle);
  if (p == std::string::npos) return 0;
  return std::stoll(info.substr(p + needle.size()));
}

std::string RedisServer::log() const {
  return file_text(dir_.path() / "redis.log");
}

}  // namespace distlock::testing
