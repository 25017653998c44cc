// distlock-bench-raw-redis — the raw hiredis baseline distlock-bench is compared with.
//
//   distlock-bench-raw-redis --host 127.0.0.1 --port 6379 [--ops N] [--warmup N]
//
// Prints two JSON lines in distlock-bench's shape:
//   raw-lock  the minimal correct Redis lock: SET key owner NX PX ttl, then EVALSHA of a
//             compare-and-delete script (2 round trips per op, no fencing, no reentrancy,
//             no renewal, no waiting);
//   raw-ping  one PING: one network round trip;
//   raw-handoff (with --handoff-clients N[,M...]) the floor for a queued, herd-free
//             hand-off: N clients on one key; a client that finds the lock held
//             RPUSHes itself in the same script and blocks on its own channel; the
//             release script SETs the lock to the head waiter and PUBLISHes to its
//             channel only. Hand-off = the releaser's clock before the release to
//             the grantee's clock when the message arrives.
//   raw-many-keys (with --many-keys-threads N) N threads, each on its own connection,
//             running the raw-lock pair on random keys of --keys K: the baseline of
//             distlock-bench's many-keys workload with one client shared by N threads.
// --workload raw-lock,raw-handoff,... runs only those (default: raw-lock and raw-ping,
// then the two above when their options are given), so a caller can read the server's
// counters around each one. Each line of a workload made of lock pairs also carries the
// client's CPU per pair (getrusage user + sys of this process, every thread) and its
// context switches per pair, as distlock-bench's lines do.
#include <hiredis/hiredis.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "process_usage.hpp"

namespace {

using json = nlohmann::ordered_json;
using distlock::bench::add_usage;
using distlock::bench::Usage;

struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Reply command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  Reply r(
      static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
  if (!r) throw std::runtime_error(std::string("redis: ") + c->errstr);
  if (r->type == REDIS_REPLY_ERROR) throw std::runtime_error("redis error: " + std::string(r->str, r->len));
  return r;
}

json line(const std::string& workload, const std::string& url, long ops, double seconds,
          std::vector<std::int64_t>& lat, int clients = 1) {
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    if (lat.empty()) return 0.0;
    const auto idx = std::min(static_cast<std::size_t>(p * static_cast<double>(lat.size())), lat.size() - 1);
    return static_cast<double>(static_cast<long long>(static_cast<double>(lat[idx]) / 100.0 + 0.5)) / 10.0;
  };
  return json{{"workload", workload},
              {"url", url},
              {"clients", clients},
              {"ops", ops},
              {"ops_per_s", seconds > 0 ? static_cast<double>(static_cast<long long>(ops / seconds)) : 0.0},
              {"p50_us", pct(0.50)},
              {"p99_us", pct(0.99)},
              {"p999_us", pct(0.999)}};
}

Context connect_to(const std::string& host, int port) {
  timeval tv{5, 0};
  Context c(redisConnectWithTimeout(host.c_str(), port, tv));
  if (!c || c->err)
    throw std::runtime_error("cannot connect: " + std::string(c ? c->errstr : "out of memory"));
  redisSetTimeout(c.get(), tv);
  return c;
}

// See the banner (raw-handoff). After releasing, a client waits until another one
// holds the lock before competing again, as distlock-bench's contended workload does.
json raw_handoff(const std::string& host, int port, const std::string& url, int n, long ops, long warmup) {
  const std::string key = "bench-raw:handoff:" + std::to_string(n), queue = key + ":q";
  const std::string chan = "bench-raw:grant:";
  Context setup = connect_to(host, port);
  command(setup.get(), {"DEL", key, queue});
  const std::string acq_src =
      "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000) then return 1 end "
      "redis.call('RPUSH', KEYS[2], ARGV[1]) return 0";
  const std::string rel_src =
      "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end "
      "local h = redis.call('LPOP', KEYS[2]) "
      "if h then redis.call('SET', KEYS[1], h, 'PX', 30000) redis.call('PUBLISH', ARGV[2] .. h, 'g') return "
      "1 end "
      "redis.call('DEL', KEYS[1]) return 0";
  const Reply a = command(setup.get(), {"SCRIPT", "LOAD", acq_src});
  const Reply r = command(setup.get(), {"SCRIPT", "LOAD", rel_src});
  const std::string acq(a->str, a->len), rel(r->str, r->len);
  const long total = warmup + ops;
  std::atomic<long> taken{0};
  std::atomic<int> holder{-1}, last_releaser{-1};
  std::atomic<std::int64_t> released_at{0};
  std::mutex mu;
  std::condition_variable changed;
  std::vector<std::int64_t> lat;
  std::mutex lat_mu;
  std::string error;
  std::vector<std::thread> threads;
  const Usage u0 = Usage::now();
  const std::int64_t t0 = now_ns();
  for (int me = 0; me < n; ++me) {
    threads.emplace_back([&, me] {
      try {
        const std::string id = "c" + std::to_string(me);
        Context c = connect_to(host, port);
        Context sub = connect_to(host, port);
        command(sub.get(), {"SUBSCRIBE", chan + id});
        std::vector<std::int64_t> mine;
        for (;;) {
          const Reply got_it = command(c.get(), {"EVALSHA", acq, "2", key, queue, id});
          if (got_it->integer == 0) {
            void* msg = nullptr;
            if (redisGetReply(sub.get(), &msg) != REDIS_OK)
              throw std::runtime_error("subscriber read failed");
            freeReplyObject(msg);
          }
          const std::int64_t got = now_ns();
          {
            std::lock_guard lk(mu);
            holder = me;
          }
          changed.notify_all();
          const long k = taken.fetch_add(1);
          const int prev = last_releaser.load();
          if (k >= warmup && k < total && prev >= 0 && prev != me) mine.push_back(got - released_at.load());
          last_releaser = me;
          released_at = now_ns();
          command(c.get(), {"EVALSHA", rel, "2", key, queue, id, chan});
          if (k >= total - 1) break;
          std::unique_lock lk(mu);
          changed.wait_for(lk, std::chrono::milliseconds(20), [&] { return holder != me || taken >= total; });
          if (taken >= total) break;
        }
        std::lock_guard lk(lat_mu);
        lat.insert(lat.end(), mine.begin(), mine.end());
      } catch (const std::exception& e) {
        std::lock_guard lk(lat_mu);
        error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!error.empty()) throw std::runtime_error("raw-handoff: " + error);
  json j = line("raw-handoff", url, ops, static_cast<double>(now_ns() - t0) / 1e9, lat, n);
  j["handoffs"] = lat.size();
  // Every acquire counted in `taken` (warm-up ones included) is released once. The window
  // includes each thread's two connections (2n connects against thousands of pairs).
  add_usage(j, u0, Usage::now(), taken.load());
  return j;
}

// N threads, one connection each, the raw-lock pair on random keys out of `keys`.
json raw_many_keys(const std::string& host, int port, const std::string& url, int n, int keys, long ops,
                   long warmup, const std::string& sha) {
  std::vector<std::int64_t> lat;
  std::mutex lat_mu;
  std::string error;
  std::vector<std::thread> threads;
  std::atomic<long> pairs{0};
  const Usage u0 = Usage::now();
  const std::int64_t t0 = now_ns();
  for (int me = 0; me < n; ++me) {
    threads.emplace_back([&, me] {
      try {
        Context c = connect_to(host, port);
        const std::string owner = "raw-owner-" + std::to_string(me) + "-0123456789abcdef";
        std::uint64_t x =
            88172645463325252ull + static_cast<std::uint64_t>(me);  // xorshift: cheap, per thread
        const long mine = ops / n + (me < ops % n ? 1 : 0);
        std::vector<std::int64_t> lats;
        lats.reserve(static_cast<std::size_t>(mine));
        for (long i = 0; i < warmup / n + mine; ++i) {
          x ^= x << 13;
          x ^= x >> 7;
          x ^= x << 17;
          const std::string key = "bench-raw:many/" + std::to_string(x % static_cast<std::uint64_t>(keys));
          const std::int64_t a = now_ns();
          const Reply set = command(c.get(), {"SET", key, owner, "NX", "PX", "30000"});
          if (set->type != REDIS_REPLY_STATUS) continue;  // another thread holds that key now
          command(c.get(), {"EVALSHA", sha, "1", key, owner});
          pairs.fetch_add(1, std::memory_order_relaxed);
          if (i >= warmup / n) lats.push_back(now_ns() - a);
        }
        std::lock_guard lk(lat_mu);
        lat.insert(lat.end(), lats.begin(), lats.end());
      } catch (const std::exception& e) {
        std::lock_guard lk(lat_mu);
        error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!error.empty()) throw std::runtime_error("raw-many-keys: " + error);
  json j = line("raw-many-keys", url, static_cast<long>(lat.size()), static_cast<double>(now_ns() - t0) / 1e9,
                lat, 1);
  j["threads"] = n;
  j["keys"] = keys;
  // Pairs that took the lock; a SET that found the key held (another thread's) is one
  // round trip more, not counted.
  add_usage(j, u0, Usage::now(), pairs.load());
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distlock-bench-raw-redis: raw hiredis lock and PING baselines"};
  std::string host = "127.0.0.1";
  int port = 6379;
  long ops = 5000, warmup = 100;
  app.add_option("--host", host, "Redis host");
  app.add_option("--port", port, "Redis port")->check(CLI::Range(1, 65535));
  app.add_option("--ops", ops, "measured operations per workload")->check(CLI::Range(1L, 100000000L));
  app.add_option("--warmup", warmup, "unmeasured operations first")->check(CLI::Range(0L, 100000000L));
  std::vector<int> handoff_clients;
  app.add_option("--handoff-clients", handoff_clients, "also measure raw-handoff with these client counts")
      ->delimiter(',')
      ->check(CLI::Range(2, 256));
  int many_keys_threads = 0, keys = 10000;
  app.add_option("--many-keys-threads", many_keys_threads,
                 "also measure raw-many-keys with this many threads (one connection each)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--keys", keys, "keys for raw-many-keys")->check(CLI::Range(1, 10000000));
  std::vector<std::string> only;
  app.add_option("--workload", only, "run only these: raw-lock, raw-ping, raw-many-keys, raw-handoff")
      ->delimiter(',')
      ->check(CLI::IsMember({"raw-lock", "raw-ping", "raw-many-keys", "raw-handoff"}));
  CLI11_PARSE(app, argc, argv);
  auto wanted = [&](const std::string& w) {
    return only.empty() || std::ranges::find(only, w) != only.end();
  };
  const std::string url = "redis://" + host + ":" + std::to_string(port);

  try {
    timeval tv{2, 0};
    Context c(redisConnectWithTimeout(host.c_str(), port, tv));
    if (!c || c->err) {
      std::cerr << "distlock-bench-raw-redis: cannot connect to " << url << ": "
                << (c ? c->errstr : "out of memory") << "\n";
      return 1;
    }
    redisSetTimeout(c.get(), tv);
    const std::string unlock =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";
    const Reply sha_reply = command(c.get(), {"SCRIPT", "LOAD", unlock});
    const std::string sha(sha_reply->str, sha_reply->len);
    const std::string key = "bench-raw:lock", owner = "raw-owner-0123456789abcdef";

    auto lock_op = [&] {
      const Reply set = command(c.get(), {"SET", key, owner, "NX", "PX", "30000"});
      if (set->type != REDIS_REPLY_STATUS) throw std::runtime_error("raw lock: SET NX found the key held");
      const Reply del = command(c.get(), {"EVALSHA", sha, "1", key, owner});
      if (del->type != REDIS_REPLY_INTEGER || del->integer != 1)
        throw std::runtime_error("raw unlock failed");
    };
    std::vector<std::int64_t> lat;
    lat.reserve(static_cast<std::size_t>(ops));
    if (wanted("raw-lock")) {
      for (long i = 0; i < warmup; ++i) lock_op();
      const Usage u0 = Usage::now();
      const std::int64_t t0 = now_ns();
      for (long i = 0; i < ops; ++i) {
        const std::int64_t a = now_ns();
        lock_op();
        lat.push_back(now_ns() - a);
      }
      json j = line("raw-lock", url, ops, static_cast<double>(now_ns() - t0) / 1e9, lat);
      add_usage(j, u0, Usage::now(), ops);
      std::cout << j.dump() << std::endl;
    }
    if (wanted("raw-ping")) {
      for (long i = 0; i < warmup; ++i) command(c.get(), {"PING"});
      lat.clear();
      const std::int64_t t0 = now_ns();
      for (long i = 0; i < ops; ++i) {
        const std::int64_t a = now_ns();
        command(c.get(), {"PING"});
        lat.push_back(now_ns() - a);
      }
      std::cout << line("raw-ping", url, ops, static_cast<double>(now_ns() - t0) / 1e9, lat).dump()
                << std::endl;
    }
    if (many_keys_threads > 0 && wanted("raw-many-keys")) {
      std::cout << raw_many_keys(host, port, url, many_keys_threads, keys, ops, warmup, sha).dump()
                << std::endl;
    }
    for (int n : handoff_clients) {
      if (!wanted("raw-handoff")) break;
      std::cout << raw_handoff(host, port, url, n, std::max(1L, ops / 4), warmup).dump() << std::endl;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "distlock-bench-raw-redis: " << e.what() << "\n";
    return 1;
  }
}
