// redlock_bench — uncontended acquire+release latency of distlock's redlock://
// backend, beside a raw hiredis fan-out doing the least Redlock needs over the
// same masters in the same process (2 fan-out round trips: SET NX PX to every
// master at once, then an EVALSHA compare-and-delete to every master at once).
// The two alternate in blocks so drift on a noisy machine hits both alike.
//
//   redlock_bench --masters 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 [--ops 5000] [--blocks 10]
//
// Prints one JSON line per implementation and one with the p50 ratio.
#include <hiredis/hiredis.h>
#include <poll.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "distlock/distlock.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Endpoint {
  std::string host;
  int port = 0;
};

std::vector<Endpoint> parse_masters(const std::string& list) {
  std::vector<Endpoint> out;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const auto comma = std::min(list.find(',', pos), list.size());
    const std::string hp = list.substr(pos, comma - pos);
    const auto colon = hp.rfind(':');
    if (colon == std::string::npos) throw std::runtime_error("master \"" + hp + "\" is not host:port");
    out.push_back({hp.substr(0, colon), std::stoi(hp.substr(colon + 1))});
    pos = comma + 1;
  }
  return out;
}

struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// The baseline: one blocking hiredis connection per master, driven as a fan-out
// (append + write to all, then poll() and read replies as they come).
class RawFanout {
 public:
  explicit RawFanout(const std::vector<Endpoint>& masters) {
    for (const auto& m : masters) {
      std::unique_ptr<redisContext, ContextDeleter> c(redisConnect(m.host.c_str(), m.port));
      if (!c || c->err)
        throw std::runtime_error("cannot connect to " + m.host + ":" + std::to_string(m.port));
      ReplyPtr r(static_cast<redisReply*>(redisCommand(c.get(), "SCRIPT LOAD %s", kDelScript)));
      if (!r || r->type != REDIS_REPLY_STRING) throw std::runtime_error("SCRIPT LOAD failed");
      sha_.assign(r->str, r->len);
      ctx_.push_back(std::move(c));
    }
  }

  // SET key value NX PX ttl on all masters; returns how many set it.
  std::size_t acquire(const std::string& key, const std::string& value, long ttl_ms) {
    const std::string ttl = std::to_string(ttl_ms);
    const char* argv[] = {"SET", key.c_str(), value.c_str(), "NX", "PX", ttl.c_str()};
    const std::size_t lens[] = {3, key.size(), value.size(), 2, 2, ttl.size()};
    return fan_out(6, argv, lens, [](const redisReply* r) { return r->type == REDIS_REPLY_STATUS; });
  }

  // Compare-and-delete on all masters; returns how many deleted.
  std::size_t release(const std::string& key, const std::string& value) {
    const char* argv[] = {"EVALSHA", sha_.c_str(), "1", key.c_str(), value.c_str()};
    const std::size_t lens[] = {7, sha_.size(), 1, key.size(), value.size()};
    return fan_out(5, argv, lens,
                   [](const redisReply* r) { return r->type == REDIS_REPLY_INTEGER && r->integer == 1; });
  }

 private:
  static constexpr const char* kDelScript =
      "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

  template <class Pred>
  std::size_t fan_out(int argc, const char** argv, const std::size_t* lens, Pred ok) {
    for (auto& c : ctx_) {
      redisAppendCommandArgv(c.get(), argc, argv, lens);
      int done = 0;
      while (!done) {
        if (redisBufferWrite(c.get(), &done) != REDIS_OK) throw std::runtime_error("write failed");
      }
    }
    std::vector<bool> have(ctx_.size(), false);
    std::size_t left = ctx_.size(), good = 0;
    std::vector<pollfd> fds(ctx_.size());
    while (left > 0) {
      for (std::size_t i = 0; i < ctx_.size(); ++i) fds[i] = {have[i] ? -1 : ctx_[i]->fd, POLLIN, 0};
      if (poll(fds.data(), fds.size(), 1000) <= 0)
        throw std::runtime_error("raw fan-out: no reply within 1 s");
      for (std::size_t i = 0; i < ctx_.size(); ++i) {
        if (have[i] || !(fds[i].revents & POLLIN)) continue;
        if (redisBufferRead(ctx_[i].get()) != REDIS_OK) throw std::runtime_error("read failed");
        void* raw = nullptr;
        if (redisGetReplyFromReader(ctx_[i].get(), &raw) != REDIS_OK)
          throw std::runtime_error("protocol error");
        if (!raw) continue;
        ReplyPtr r(static_cast<redisReply*>(raw));
        have[i] = true;
        --left;
        if (ok(r.get())) ++good;
      }
    }
    return good;
  }

  std::vector<std::unique_ptr<redisContext, ContextDeleter>> ctx_;
  std::string sha_;
};

struct Stats {
  std::vector<double> us;
  double seconds = 0;
  void add(Clock::duration d) { us.push_back(std::chrono::duration<double, std::micro>(d).count()); }
  double pct(double p) {
    std::sort(us.begin(), us.end());
    return us.empty() ? 0 : us[std::min(us.size() - 1, static_cast<std::size_t>(p * us.size()))];
  }
};

nlohmann::json report(const std::string& impl, std::size_t masters, Stats& s) {
  return {{"bench", "redlock_uncontended"},
          {"impl", impl},
          {"masters", masters},
          {"ops", s.us.size()},
          {"ops_per_s", s.seconds > 0 ? s.us.size() / s.seconds : 0.0},
          {"p50_us", s.pct(0.50)},
          {"p99_us", s.pct(0.99)},
          {"p999_us", s.pct(0.999)}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Redlock uncontended acquire+release vs a raw hiredis fan-out"};
  std::string masters_arg;
  int ops = 6000, blocks = 30, warmup = 500;
  long ttl_ms = 10000;
  std::string only;
  app.add_option("--masters", masters_arg, "host:port,host:port,... (>= 3)")->required();
  app.add_option("--ops", ops, "measured operations per implementation");
  app.add_option("--blocks", blocks, "alternating blocks per implementation");
  app.add_option("--warmup", warmup, "unmeasured operations per implementation first");
  app.add_option("--ttl-ms", ttl_ms, "lease TTL");
  app.add_option("--only", only, "profile one implementation: distlock or raw (no ratio line)")
      ->check(CLI::IsMember({"distlock", "raw"}));
  CLI11_PARSE(app, argc, argv);

  try {
    const auto masters = parse_masters(masters_arg);
    // Per-master timeout 1 s, like the baseline's poll(): this measures latency,
    // and a starved master on a shared machine must not abort the run.
    distlock::Client client = distlock::connect("redlock://" + masters_arg + "?timeout=1s");
    distlock::LockOptions opts;
    opts.ttl = distlock::Millis(ttl_ms);
    RawFanout raw(masters);
    const std::string raw_value = "bench-owner-" + client.id();

    auto one_distlock = [&] {
      distlock::Lease lease = client.acquire("bench/redlock", opts);
      lease.release();
    };
    auto one_raw = [&] {
      if (raw.acquire("bench:raw:lock", raw_value, ttl_ms) < masters.size() / 2 + 1) {
        throw std::runtime_error("raw baseline did not get a quorum");
      }
      raw.release("bench:raw:lock", raw_value);
    };
    if (!only.empty()) {  // for perf/strace: one implementation, no output
      for (int i = 0; i < ops; ++i) only == "raw" ? one_raw() : one_distlock();
      return 0;
    }
    for (int i = 0; i < warmup; ++i) {
      one_distlock();
      one_raw();
    }
    Stats d, r;
    const int per_block = std::max(1, ops / blocks);
    for (int b = 0; b < blocks; ++b) {
      for (auto* which : {&d, &r}) {
        const auto block_start = Clock::now();
        for (int i = 0; i < per_block; ++i) {
          const auto t0 = Clock::now();
          if (which == &d) {
            one_distlock();
          } else {
            one_raw();
          }
          which->add(Clock::now() - t0);
        }
        which->seconds += std::chrono::duration<double>(Clock::now() - block_start).count();
      }
    }
    auto jd = report("distlock_redlock", masters.size(), d);
    auto jr = report("raw_hiredis_fanout", masters.size(), r);
    std::cout << jd.dump() << "\n" << jr.dump() << "\n";
    std::cout << nlohmann::json{{"bench", "redlock_uncontended"},
                                {"masters", masters.size()},
                                {"ratio_p50", jd["p50_us"].get<double>() / jr["p50_us"].get<double>()},
                                {"ratio_p99", jd["p99_us"].get<double>() / jr["p99_us"].get<double>()},
                                {"target_ratio_p50", 1.2}}
                     .dump()
              << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "redlock_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
